"""Online learning: a drafter that keeps training on the rounds it is verified in.

Every ``generate`` call with a :class:`~hf_jetspec.JetSpecDrafter` already computes what drafter
training consumes: the verification forwards return the target's states at the drafter's read layers
for every committed position, and the committed tokens are the target's own output. With a learner
attached (:meth:`hf_jetspec.JetSpecAssistant.learn_online`), a call keeps those tensors
(:class:`CallRecorder`; nothing is kept without a learner), and when it ends:

1. the call's sequence becomes a :func:`~hf_jetspec.training.replay_buffer.verified_item` in a bounded
   :class:`~hf_jetspec.training.ReplayBuffer`;
2. before training on it, the guard scores it *prequentially*: the adapted weights and the weights the
   learner started from draft its blocks (J0 and the configured Jacobi passes, teacher-forced context,
   exactly the chain rounds' shape) and the difference of their mean accepted lengths joins a running
   window. When the adapted weights lose over the window, they are reverted to the start and the
   learning rate is halved;
3. the learner takes optimizer steps on a shadow copy of the weights (fp32 master weights, bf16
   autocast where the CPU or GPU has native bf16), with the loss of
   :class:`~hf_jetspec.training.JetSpecTrainer` itself (the cached-feature path: no second copy of the
   Jacobi-forcing loss), within a budget per call: ``steps_per_call`` steps, or ``time_share`` of the
   call's wall time (a credit carried from call to call);
4. the shadow weights are copied into the drafter only while no ``generate`` call is running on it
   (:meth:`OnlineLearner.begin_call` / :meth:`OnlineLearner.end_call` count the calls in flight; with
   weights waiting, a new call waits for the calls in flight to end first), so weights never change
   inside a call, and concurrent calls sharing one drafter stay consistent;
5. the round policy is told the drafter changed: its running calibration of drafted blocks keeps only
   a share of its counts and its draft gates probe the drafter again.

Labels are the target's own distributions at the verified positions: the top-k log-probabilities of
the verification logits that decided each committed token (``label_top_k``; free, those logits exist
anyway), or with ``label_top_k=0`` the committed tokens alone (the target's argmax under greedy
decoding, its samples under sampling).
"""

from __future__ import annotations

import copy
import math
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

import torch

from .replay_buffer import ReplayBuffer, match_top_k, verified_item


@dataclass
class OnlineLearningConfig:
    """How a drafter learns from its verified rounds (:class:`OnlineLearner`).

    Args:
        steps_per_call: optimizer steps after each call (an upper bound when ``time_share`` is set).
        learn_every: learn after every n-th call only (``n * steps_per_call`` steps then); calls in
            between are kept and their time share is credited.
        time_share: if set, learning time is kept at about this share of the calls' wall time (a credit
            of ``time_share`` x each call's seconds, spent step by step and carried over).
        batch_size: sequences per step: the newest call's, then uniform draws from the buffer.
        blocks_per_sequence: training blocks (anchors) per sequence per step.
        lr: AdamW learning rate (constant after ``warmup_steps``).
        buffer_bytes: cap of the replay buffer; the oldest sequences are dropped first.
        max_context: prompt rows kept before each output (the drafter's default context window).
        min_new_tokens: calls that committed fewer new tokens are not kept.
        label_top_k: labels are the target's top-k log-probabilities at each verified position, read off the
            verification logits (0: the committed token alone).
        generic_share: share of each batch drawn from the buffer's generic pool (see ``ReplayBuffer.seed_from``).
        guard: compare the adapted weights with the starting ones on every new call and revert when they lose.
        guard_window: calls in the guard's running comparison; ``guard_min_calls``: calls before it may revert.
        guard_margin: how far (in committed tokens per block) the adapted weights may trail before a revert;
            the trail must also be significant (:func:`guard_says_revert`).
        guard_anchors: blocks scored per call by the guard.
        bf16: autocast learning in bf16 (None: when the target runs in bf16, which ``"auto"`` picks only where
            the device has native bf16).
        seed: seed of batch, anchor and noise sampling.
    """

    steps_per_call: int = 4
    learn_every: int = 1
    time_share: float | None = None
    batch_size: int = 2
    blocks_per_sequence: int = 16
    lr: float = 1e-4
    warmup_steps: int = 4
    max_grad_norm: float = 1.0
    buffer_bytes: int = 64 << 20
    max_context: int = 512
    min_new_tokens: int = 8
    label_top_k: int = 16
    generic_share: float = 0.0
    guard: bool = True
    guard_window: int = 8
    guard_min_calls: int = 4
    guard_margin: float = 0.05
    guard_anchors: int = 16
    bf16: bool | None = None
    seed: int = 0

    def __post_init__(self):
        if self.steps_per_call < 0:
            raise ValueError(f"steps_per_call must be >= 0, got {self.steps_per_call}")
        if self.learn_every < 1:
            raise ValueError(f"learn_every must be >= 1, got {self.learn_every}")
        if self.time_share is not None and not 0 < self.time_share <= 10:
            raise ValueError(f"time_share must be in (0, 10] (learning seconds per second of generation), got {self.time_share}")
        if self.batch_size < 1 or self.blocks_per_sequence < 1:
            raise ValueError("batch_size and blocks_per_sequence must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.generic_share < 1:
            raise ValueError(f"generic_share must be in [0, 1), got {self.generic_share}")
        if self.guard_window < 1 or self.guard_min_calls < 1 or self.guard_anchors < 1:
            raise ValueError("guard_window, guard_min_calls and guard_anchors must be >= 1")


class CallRecorder:
    """The read-layer states of one call's verified positions, in order (kept as CPU copies in the
    buffer's dtype; the verification outputs they come from are freed by the next round), and, with
    ``label_top_k``, the target's top-k log-probabilities at the verified positions, read off the
    verification logits that decided them."""

    def __init__(self, max_context: int, dtype: torch.dtype = torch.bfloat16, label_top_k: int = 0):
        self.max_context = max_context
        self.dtype = dtype
        self.label_top_k = label_top_k
        self.rows: list[torch.Tensor] = []
        self.count = 0
        self.dropped_prefix = 0  # prompt rows beyond max_context, not kept
        self.labels: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # position -> (top-k ids, log-probabilities)

    def add_labels(self, first_position: int, logits: torch.Tensor) -> None:
        """The target's logits [m, V] at positions ``first_position ..``: each row's distribution over the
        token that follows its position."""
        if self.label_top_k <= 0 or logits.shape[0] == 0:
            return
        values, ids = torch.log_softmax(logits.detach().float(), dim=-1).topk(min(self.label_top_k, logits.shape[-1]), dim=-1)
        values, ids = values.cpu(), ids.cpu()
        for j in range(ids.shape[0]):
            self.labels[first_position + j] = (ids[j], values[j])

    def add(self, states: list[torch.Tensor] | torch.Tensor) -> None:
        """States of the next verified positions: per read layer [1, n, H] (or concatenated [1, n, L*H])."""
        cat = torch.cat(states, dim=-1) if isinstance(states, (list, tuple)) else states
        rows = cat[0]
        if self.count == 0 and rows.shape[0] > self.max_context:  # the prompt: only its newest rows
            self.dropped_prefix = rows.shape[0] - self.max_context
            rows = rows[-self.max_context :]
        self.rows.append(rows.detach().to("cpu", self.dtype))
        self.count += int(cat.shape[1])

    def states(self) -> torch.Tensor | None:
        return torch.cat(self.rows, dim=0) if self.rows else None


def with_soft_labels(item: dict, labels: dict, offset: int = 0) -> dict:
    """``item`` (a :func:`~hf_jetspec.training.replay_buffer.verified_item`) with the recorded top-k
    distributions in place of its top-1 labels where a position has one (``labels``: absolute position ->
    (ids, log-probabilities); the item starts at absolute position ``offset``). Positions without one
    keep the committed token, padded with ``MISSING_LOGIT`` columns."""
    from .losses import MISSING_LOGIT

    k = len(next(iter(labels.values()))[0])
    n = item["input_ids"].numel()
    ids = torch.zeros(n, k, dtype=torch.int32)
    logprobs = torch.full((n, k), MISSING_LOGIT, dtype=torch.float16)
    ids[:, 0] = item["topk_ids"][:, 0]
    logprobs[:, 0] = 0.0
    for t in range(n):
        found = labels.get(t + offset)
        if found is not None:
            ids[t] = found[0].to(torch.int32)
            logprobs[t] = found[1].to(torch.float16)
    return {**item, "topk_ids": ids, "topk_logprobs": logprobs}


def chain_tau(model, items: list[dict], num_blocks: int, gamma: int, jacobi_passes: int, generator: torch.Generator) -> float:
    """Mean committed tokens per chain round of ``model`` on ``items``, teacher-forced: blocks at
    ``num_blocks`` anchors drawn per item from its output, J0 on noise then ``jacobi_passes`` passes,
    accepted = leading matches with the committed tokens, plus the bonus token."""
    from .blocks import leading_matches, noisy_block_inputs, sample_anchor_positions

    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for item in items:
            ids = item["input_ids"][None]
            n = ids.shape[1] - 1  # blocks whose every slot has its committed token inside the item
            start = int(item["response_start"])
            if n - start < gamma + 1:
                continue
            anchors = sample_anchor_positions(torch.tensor([start]), torch.tensor([n]), num_blocks, gamma, generator)
            idx = (anchors[..., None] + torch.arange(gamma)).clamp(max=n - 1)
            true = torch.gather(ids[:, None, :].expand(1, num_blocks, -1), 2, idx)
            labels = torch.gather(ids[:, None, :].expand(1, num_blocks, -1), 2, idx + 1)  # the committed next tokens
            inputs, noise = noisy_block_inputs(true, ids, anchors, torch.zeros(num_blocks, dtype=torch.long), generator)
            states = item["states"][None].to(model.device, model.dtype)
            draft = None
            for p in range(1 + jacobi_passes):
                if p:
                    inputs = torch.cat([true[..., :1], draft[..., :-1]], dim=-1)
                    noise = None
                out = model(context_states=states, block_input_ids=inputs.to(model.device), anchor_positions=anchors.to(model.device),
                            noise_mask=None if noise is None else noise.to(model.device))
                draft = model.draft_ids(out.logits).cpu()
            total += float((leading_matches(draft, labels) + 1).float().sum())
            count += num_blocks
    return total / count if count else float("nan")


def guard_says_revert(differences: list[float], margin: float, z: float = 2.0) -> bool:
    """Whether the adapted weights lose: the mean of the per-call differences (adapted minus starting
    weights' tau) is below ``-margin`` and below zero by more than ``z`` standard errors (a single
    call's scores are noisy: a few blocks each)."""
    n = len(differences)
    mean = sum(differences) / n
    if mean >= -margin or n < 2:
        return False
    var = sum((d - mean) ** 2 for d in differences) / (n - 1)
    return mean < -z * math.sqrt(var / n)


class OnlineLearner:
    """Trains a drafter between ``generate`` calls on what those calls verified (see the module docstring).

    Built by :meth:`hf_jetspec.JetSpecAssistant.learn_online`; ``target`` is the model the drafter
    serves (default: the target of the first call), ``buffer`` an existing :class:`ReplayBuffer` (e.g.
    loaded with ``ReplayBuffer.load`` to resume, or seeded from a feature cache).
    """

    def __init__(self, assistant, config: OnlineLearningConfig | None = None, target=None, buffer: ReplayBuffer | None = None):
        from ..drafter.modeling_drafter import JetSpecDrafter

        drafter = getattr(assistant, "drafter", None)
        if not isinstance(drafter, JetSpecDrafter):
            raise TypeError(f"online learning trains a JetSpecDrafter's weights; {type(assistant).__name__} has none")
        self.assistant = assistant
        self.drafter = drafter
        self.config = config if config is not None else OnlineLearningConfig()
        if not any(p.requires_grad for p in drafter.parameters()):
            raise ValueError("this drafter's parameters are all frozen (requires_grad=False): nothing to learn")
        if drafter.config.block_inputs == "mask":
            raise ValueError("online learning trains 'tokens'-input drafters with Jacobi forcing; this drafter reads mask inputs")
        self.buffer = buffer if buffer is not None else ReplayBuffer.for_drafter(drafter, max_bytes=self.config.buffer_bytes)
        self.buffer.check_drafter(drafter)
        self.target = None
        if target is not None:
            self._bind_target(target)
        self._lock = threading.Condition()  # guards the calls-in-flight count and the swap into the live drafter
        self._learn_lock = threading.Lock()  # one learner step sequence at a time
        self._active = 0
        self._pending = False
        self._generator = torch.Generator().manual_seed(self.config.seed)
        self._shadow = None
        self._base = None
        self._trainer = None
        self._credit = 0.0
        self.lr = self.config.lr
        self.base_state = {k: v.detach().to("cpu", torch.float32).clone() for k, v in drafter.state_dict().items()}
        self.calls = 0
        self.kept = 0
        self.steps = 0
        self.applied = 0
        self.reverts = 0
        self.learn_seconds: list[float] = []  # per call: keeping its sequence, the guard's scoring and the steps
        self.guard_history: list[dict] = []  # per kept call: adapted and base chain tau on it, before training on it
        self._window: list[float] = []

    # ------------------------------------------------------------------ binding
    def _bind_target(self, target) -> None:
        if self.target is None:
            self.drafter.check_target(target)  # a clear error for a drafter of another target
            self.target = target
        elif target is not self.target:
            self.drafter.check_target(target)
            mine = self.target.config.get_text_config()
            theirs = target.config.get_text_config()
            if (mine.model_type, mine.hidden_size, mine.num_hidden_layers, mine.vocab_size) != (
                    theirs.model_type, theirs.hidden_size, theirs.num_hidden_layers, theirs.vocab_size):
                raise ValueError("this online learner adapts its drafter to another target; build a new learner for this one")

    # ------------------------------------------------------------------ the calls
    def begin_call(self, target) -> CallRecorder:
        """A ``generate`` call starts on the drafter: count it in flight. When learned weights wait to be
        applied, it first waits for the calls in flight to end (so that under a steady stream of
        overlapping calls the weights still get swapped in), then applies them."""
        self._bind_target(target)
        with self._lock:
            while self._pending and self._active > 0:
                self._lock.wait()
            if self._pending:
                self._apply_locked()
            self._active += 1
        return CallRecorder(self.config.max_context, label_top_k=self.config.label_top_k)

    def end_call(self, sequence: torch.Tensor | None, recorder: CallRecorder | None, prompt_length: int, call_seconds: float) -> None:
        """The call ended with ``sequence`` (prompt + output, [1, T] or [T]): keep it, learn, apply when no call is in flight."""
        with self._lock:
            self._active -= 1
            self._lock.notify_all()
        t0 = time.perf_counter()
        try:
            if sequence is not None and recorder is not None:
                if self.config.time_share is not None:
                    self._credit += self.config.time_share * call_seconds
                self.observe(sequence, recorder, prompt_length)  # the guard's scoring is paid from the same credit
                if self.config.time_share is not None:
                    self._credit -= time.perf_counter() - t0
                self._learn(None, budgeted=True)
        finally:
            self.learn_seconds.append(time.perf_counter() - t0)
            with self._lock:
                if self._pending and self._active == 0:
                    self._apply_locked()
                self._lock.notify_all()

    def observe(self, sequence: torch.Tensor, recorder: CallRecorder, prompt_length: int) -> bool:
        """Keep one call's verified sequence (after the guard has scored it); returns whether it was kept."""
        self.calls += 1
        states = recorder.states()
        tokens = sequence.reshape(-1)
        if states is None or tokens.numel() - prompt_length < self.config.min_new_tokens:
            return False
        skip = recorder.dropped_prefix
        rows = min(states.shape[0], tokens.numel() - skip - 1)  # a stop inside the last round cuts the sequence
        if rows - (prompt_length - skip) < self.config.min_new_tokens:
            return False
        states = states[:rows]
        tokens = tokens[skip : skip + rows + 1]
        item = verified_item(tokens, states, prompt_length - skip, recorder.dtype)
        if recorder.labels:
            item = with_soft_labels(item, recorder.labels, skip)
        if self.config.guard:
            self._guard(item)
        self.buffer.add(item)
        self.kept += 1
        return True

    # ------------------------------------------------------------------ learning
    def _ensure_models(self) -> None:
        if self._shadow is not None:
            return
        if self.target is None:
            raise RuntimeError("the learner has no target yet: pass target= or let a generate call bind it")
        from ..drafter.modeling_drafter import JetSpecDrafter

        def fp32_copy():
            model = JetSpecDrafter(copy.deepcopy(self.drafter.config))
            model.load_state_dict(self.base_state)
            model.to(self.target.device, torch.float32)
            model.attach_target(self.target, follow_dtype=False)
            return model

        self._shadow = fp32_copy()
        self._shadow.load_state_dict({k: v.float() for k, v in self.drafter.state_dict().items()})
        self._base = fp32_copy().eval()
        for p in self._base.parameters():
            p.requires_grad_(False)

    def _make_trainer(self):
        from .config import JetSpecTrainingArguments
        from .trainer import JetSpecTrainer

        cfg = self.config
        device = self.target.device
        bf16 = cfg.bf16 if cfg.bf16 is not None else self.target.dtype == torch.bfloat16  # a bf16 target: the device has it natively
        options = self.drafter.drafting_config
        args = JetSpecTrainingArguments(
            output_dir=os.path.join(tempfile.gettempdir(), "hf_jetspec_online"), per_device_train_batch_size=cfg.batch_size,
            learning_rate=self.lr, weight_decay=0.0, max_grad_norm=cfg.max_grad_norm, report_to=[], bf16=bf16,
            use_cpu=device.type == "cpu", dataloader_num_workers=0, seed=cfg.seed, save_strategy="no", logging_strategy="no",
            disable_tqdm=True, block_size=options.budget, blocks_per_sequence=cfg.blocks_per_sequence, noise_seed=cfg.seed,
            block_inputs="jacobi",
        )
        trainer = JetSpecTrainer(model=self._shadow, args=args, target=self.target)
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train's loop, which online steps do not run
        return trainer

    def learn(self, steps: int) -> int:
        """``steps`` optimizer steps on the shadow weights now (outside any budget; e.g. in idle time).
        The result is applied to the drafter when no call is in flight. Returns the steps taken."""
        t0 = time.perf_counter()
        try:
            return self._learn(steps, budgeted=False)
        finally:
            self.learn_seconds.append(time.perf_counter() - t0)

    def _learn(self, steps: int | None, budgeted: bool) -> int:
        """Steps on the shadow weights: ``steps``, or (``None``) the configured budget after a call,
        stopping when ``budgeted`` and the time-share credit is spent."""
        cfg = self.config
        if not len(self.buffer):
            return 0
        with self._learn_lock, torch.enable_grad():  # generate runs under no_grad; the learner's steps need gradients
            self._ensure_models()
            if self._trainer is None:
                self._trainer = self._make_trainer()
            if steps is None:
                steps = cfg.steps_per_call * cfg.learn_every if self.calls % cfg.learn_every == 0 else 0
            budgeted = budgeted and cfg.time_share is not None
            from .feature_cache import FeatureCacheCollator

            collate = FeatureCacheCollator(self._pad_id())
            taken = 0
            optimizer = self._trainer.optimizer
            for _ in range(steps):
                if budgeted and self._credit <= 0:
                    break
                s0 = time.perf_counter()
                batch = collate(match_top_k(self.buffer.sample(cfg.batch_size, self._generator, newest=1,
                                                              generic_share=cfg.generic_share)))
                warm = min(1.0, (self.steps + 1) / max(cfg.warmup_steps, 1))
                for group in optimizer.param_groups:
                    group["lr"] = self.lr * warm
                self._trainer.training_step(self._shadow, batch)
                torch.nn.utils.clip_grad_norm_(self._shadow.parameters(), cfg.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                self.steps += 1
                taken += 1
                if budgeted:
                    self._credit -= time.perf_counter() - s0
            self._shadow.eval()
            if taken:
                with self._lock:
                    self._pending = True
        return taken

    def _pad_id(self) -> int:
        pad = getattr(self.target.generation_config, "pad_token_id", None)
        if isinstance(pad, (list, tuple)):
            pad = pad[0] if pad else None
        return int(pad) if pad is not None else 0

    # ------------------------------------------------------------------ the guard
    def _guard(self, item: dict) -> None:
        self._ensure_models()
        cfg = self.config
        gamma = self.drafter.drafting_config.budget - 1
        passes = self.drafter.drafting_config.num_jacobi_passes
        seed = int(torch.randint(2**31 - 1, (1,), generator=self._generator))
        with self._learn_lock:
            adapted = chain_tau(self._shadow, [item], cfg.guard_anchors, gamma, passes, torch.Generator().manual_seed(seed))
            base = chain_tau(self._base, [item], cfg.guard_anchors, gamma, passes, torch.Generator().manual_seed(seed))
        if math.isnan(adapted) or math.isnan(base):
            return
        self.guard_history.append({"call": self.calls, "adapted_tau": round(adapted, 4), "base_tau": round(base, 4)})
        self._window = (self._window + [adapted - base])[-cfg.guard_window :]
        if len(self._window) >= cfg.guard_min_calls and guard_says_revert(self._window, cfg.guard_margin):
            self.revert()

    def revert(self) -> None:
        """Back to the weights the learner started from; the optimizer restarts and the learning rate halves."""
        with self._learn_lock:
            self._ensure_models()
            self._shadow.load_state_dict(self.base_state)
            if self._trainer is not None:
                self._trainer.optimizer.state.clear()
            self.lr *= 0.5
            self._window = []
            self.reverts += 1
            self.guard_history.append({"call": self.calls, "reverted": True, "lr": self.lr})
        with self._lock:
            self._pending = True
            if self._active == 0:
                self._apply_locked()

    # ------------------------------------------------------------------ the swap
    def _apply_locked(self) -> None:
        """Copy the shadow weights into the live drafter (caller holds ``_lock`` and no call is in flight)."""
        live = self.drafter
        int8 = live.int8_drafting
        if int8:
            live.set_int8_drafting(False)
        with torch.no_grad():
            shadow = dict(self._shadow.named_parameters())
            for name, param in live.named_parameters():
                param.copy_(shadow[name].to(param.dtype))
        if int8:
            live.set_int8_drafting(True)
        self._pending = False
        self.applied += 1
        self.assistant.output_memory.drafter_changed()

    def apply_now(self) -> bool:
        """Apply learned weights now if no call is in flight; returns whether the drafter changed."""
        with self._lock:
            if self._pending and self._active == 0:
                self._apply_locked()
                return True
        return False

    # ------------------------------------------------------------------ records and persistence
    def summary(self) -> dict:
        """Counts of what the learner saw and did (no text)."""
        return {
            "calls": self.calls, "kept_calls": self.kept, "buffer_items": len(self.buffer), "buffer_tokens": self.buffer.num_tokens,
            "buffer_bytes": self.buffer.nbytes, "buffer_peak_bytes": self.buffer.peak_bytes, "learned_tokens": self.buffer.added_tokens,
            "steps": self.steps, "weight_swaps": self.applied, "reverts": self.reverts, "lr": self.lr,
            "learn_seconds": round(sum(self.learn_seconds), 3), "config": asdict(self.config),
        }

    def save_pretrained(self, save_directory, save_buffer: bool = False, **kwargs) -> None:
        """The adapted drafter's folder (weights in the drafter's storage, its calibrations, a card
        saying what it adapted on: counts only) and, with ``save_buffer``, the replay buffer in
        ``save_directory/replay_buffer``. Learning resumes from it: load the folder, attach a learner
        (``buffer=ReplayBuffer.load(...)`` to keep the buffer)."""
        import json

        self.apply_now()
        kwargs.setdefault("weight_storage", source_weight_storage(self.drafter))
        self.assistant.save_pretrained(save_directory, **kwargs)
        record = self.summary()
        with open(os.path.join(save_directory, "online_learning.json"), "w") as f:
            json.dump(record, f, indent=1)
        write_adapted_card(save_directory, record)
        if save_buffer:
            self.buffer.save(os.path.join(save_directory, "replay_buffer"))


def source_weight_storage(drafter) -> str | None:
    """How the folder a drafter was loaded from stores its weights (``"int8"``, ``"int4"``; None: floating
    point, or a drafter built in this process), so an adapted drafter is saved the same way."""
    from ..drafter.modeling_drafter import _stored_config

    source = getattr(drafter, "pretrained_source", None)
    if not source:
        return None
    try:
        return _stored_config(source[0], dict(source[1] or {})).get("weight_storage")
    except Exception:
        return None


def write_adapted_card(folder, record: dict) -> str:
    """A model card for an adapted drafter: what it adapted on, in counts."""
    path = os.path.join(folder, "README.md")
    text = f"""---
library_name: hf_jetspec
tags: [speculative-decoding, jetspec, online-learning]
---

# Online-adapted JetSpec drafter

This drafter continued training on the target's verified outputs while it served
(`hf_jetspec.OnlineLearner`). What it adapted on, in counts (no text is stored here):

| calls seen | calls kept | output tokens learned from | optimizer steps | weight swaps | reverts by the guard |
| --- | --- | --- | --- | --- | --- |
| {record['calls']} | {record['kept_calls']} | {record['learned_tokens']} | {record['steps']} | {record['weight_swaps']} | {record['reverts']} |

Learning configuration: `online_learning.json`.

```python
from hf_jetspec import JetSpecAssistant, OnlineLearningConfig
assistant = JetSpecAssistant.from_pretrained("{os.path.basename(os.path.normpath(folder))}")
assistant.learn_online(OnlineLearningConfig())  # keep adapting
out = target.generate(**inputs, assistant_model=assistant, max_new_tokens=256)
```
"""
    with open(path, "w") as f:
        f.write(text)
    return path
