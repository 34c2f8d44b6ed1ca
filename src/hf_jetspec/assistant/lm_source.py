"""A small language model as a proposal source: greedy chains of adaptive length, beside the drafter
and the n-grams.

A causal LM that shares the target's tokenizer (Qwen2.5-Coder-0.5B beside the 1.5B, say) agrees with
the target far more often than a one-pass block drafter does, but pays one forward per proposed
token. :class:`LMSource` keeps that price down and lets the round policy weigh it:

- **its own KV cache, in step with the verified text.** Each round it crops its cache to the longest
  prefix it shares with the sequence (its own rejected tokens fall away) and feeds only the rest: the
  target's bonus token, and whatever the round committed that the LM had not proposed;
- **a chain of adaptive length.** After each proposed token it asks ``keep_going(raw)`` with the
  conditional probabilities so far; the round policy answers from the running calibration of those
  scores against verified outcomes and the measured costs (:func:`worth_another_token`: another token
  pays while its expected acceptance times a target step exceeds one LM forward);
- **a restricted head** (``LMSourceConfig.head_vocab``): logits only for the rows of the tokens the
  target uses most (the drafter's draft vocabulary first, then the lowest ids, which byte-level BPE
  merges first, :func:`lm_head_ids`). A proposal never needs the rest: the target checks every token;
- **int8 products** (``LMSourceConfig.int8``): every linear layer of the LM, the restricted head
  included, multiplied in int8 (:func:`int8_copies`, PyTorch's dynamic quantization on the CPU).

Nothing here changes what the target writes: the chain is a proposal, verified as every other one
(exact match when greedy, the point-mass rule when sampling). Costs and acceptance of each option are
in ``benchmarks/lm_source_cost.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
from torch import nn


@dataclass(frozen=True)
class LMSourceConfig:
    """Options of an :class:`LMSource`.

    Args:
        max_tokens: most tokens of one chain (the round's depth limits it too).
        head_vocab: rows of the restricted head (None, the default: the LM's whole head). On
            Qwen2.5-Coder-0.5B in int8 a 32K-row head saved 3 ms of 36.5 a token and lost 3.6 points
            of agreement with the 1.5B (``benchmarks/results/lm_source_cost_qwen.json``).
        int8: multiply every linear layer in int8 (the LM's weights are copied, in float32, then
            quantised). None (the default): on when the LM is on the CPU, where it measured 2.7x
            faster than bf16 per token at 98.4% of its agreement.
        min_prob: stop the chain after a token whose own probability is below this, whatever the policy says.
    """

    max_tokens: int = 12
    head_vocab: int | None = None
    int8: bool | None = None
    min_prob: float = 0.05

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.head_vocab is not None and self.head_vocab < 1:
            raise ValueError(f"head_vocab must be >= 1 or None, got {self.head_vocab}")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"min_prob must be in [0, 1), got {self.min_prob}")

    def replace(self, **changes) -> "LMSourceConfig":
        return replace(self, **changes)


@dataclass
class LMChain:
    """One proposed chain: its tokens and each token's conditional probability under the LM (raw scores)."""

    tokens: list[int]
    probs: list[float]
    seconds: float = 0.0  # the LM's time for this chain, catching up included


def lm_head_ids(vocab_size: int, size: int, preferred=None) -> torch.Tensor:
    """The ids of a restricted head of ``size`` rows: the ``preferred`` ids first (deduplicated, in
    order), then the lowest ids not yet taken, sorted at the end.

    >>> lm_head_ids(10, 4, preferred=[7, 2, 7])
    tensor([0, 1, 2, 7])
    """
    size = min(int(size), int(vocab_size))
    taken, out = set(), []
    for t in [] if preferred is None else [int(x) for x in preferred]:
        if 0 <= t < vocab_size and t not in taken and len(out) < size:
            taken.add(t)
            out.append(t)
    t = 0
    while len(out) < size:
        if t not in taken:
            out.append(t)
        t += 1
    return torch.tensor(sorted(out), dtype=torch.long)


def worth_another_token(expected_path: float, lm_token_s: float, step_s: float) -> bool:
    """Whether the LM should propose one more token: a token whose whole path is accepted with
    probability ``expected_path`` saves about one target step (``step_s``) and costs one LM forward
    (``lm_token_s``).

    >>> worth_another_token(0.5, 0.035, 0.19), worth_another_token(0.15, 0.035, 0.19)
    (True, False)
    """
    return expected_path * step_s > lm_token_s


def expected_run(conditionals) -> float:
    """Expected accepted tokens of a chain whose token ``i`` is accepted, given the ones before it,
    with probability ``conditionals[i]``: ``sum_i prod_{j <= i} conditionals[j]``.

    >>> expected_run([0.5, 0.5]), expected_run([])
    (0.75, 0.0)
    """
    total, path = 0.0, 1.0
    for c in conditionals:
        path *= float(c)
        total += path
    return total


def best_seed(seeds) -> tuple[list[int], list[float]]:
    """Of ``(tokens, conditionals)`` proposals, the one with the most expected accepted tokens
    (:func:`expected_run`; the first on ties), as ``(tokens, conditionals)``: what the LM checks in
    its first forward. ``([], [])`` where none has a token.

    >>> best_seed([([1, 2], [0.9, 0.9]), ([3, 4, 5], [0.5, 0.5, 0.5])])
    ([1, 2], [0.9, 0.9])
    """
    best, value = ([], []), -1.0
    for tokens, conditionals in seeds:
        tokens, conditionals = [int(t) for t in tokens], [float(c) for c in conditionals][: len(tokens)]
        v = expected_run(conditionals)
        if tokens and v > value:
            best, value = (tokens, conditionals), v
    return best


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share.

    >>> common_prefix_length([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def check_lm_source(target, lm, target_tokenizer=None, lm_tokenizer=None) -> None:
    """Refuse an LM that cannot propose the target's tokens: a different vocabulary size, different
    special tokens, or (when both tokenizers are given) a different vocabulary."""
    if getattr(lm.config, "is_encoder_decoder", False):
        raise ValueError("an LM source must be a decoder-only causal LM; this one is an encoder-decoder")
    t_rows = target.get_output_embeddings().weight.shape[0]
    l_rows = lm.get_output_embeddings().weight.shape[0]
    if t_rows != l_rows:
        raise ValueError(f"the LM source's vocabulary ({l_rows} rows) does not match the target's ({t_rows} rows): "
                         "an LM source must use the target's tokenizer")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        a, b = getattr(target.config, name, None), getattr(lm.config, name, None)
        a = sorted(a) if isinstance(a, list) else a
        b = sorted(b) if isinstance(b, list) else b
        if a is not None and b is not None and a != b:
            raise ValueError(f"the LM source's {name} ({b}) differs from the target's ({a}): it does not use the target's tokenizer")
    if target_tokenizer is not None and lm_tokenizer is not None and target_tokenizer.get_vocab() != lm_tokenizer.get_vocab():
        raise ValueError("the LM source's tokenizer differs from the target's: an LM source must use the target's tokenizer")


def int8_copies(backbone: nn.Module, head: nn.Linear) -> tuple[nn.Module, nn.Module]:
    """Copies of ``backbone`` and ``head`` whose linear layers multiply in int8 (weights per output
    channel, activations per call: PyTorch's dynamic quantization, CPU). The originals are untouched."""
    import copy
    import warnings

    if head.weight.device.type != "cpu":
        raise ValueError(f"LMSourceConfig(int8=True) runs on the CPU; this LM is on {head.weight.device}")
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    spec = {nn.Linear: per_channel_dynamic_qconfig}
    with warnings.catch_warnings():  # the eager API is deprecated in favour of torchao, and still the one that ships with torch
        warnings.simplefilter("ignore")
        backbone = quantize_dynamic(copy.deepcopy(backbone).float(), spec, dtype=torch.qint8)
        head = quantize_dynamic(nn.Sequential(copy.deepcopy(head).float()), spec, dtype=torch.qint8)
    return backbone, head


LM_SOURCE = "lm-chain"  # the LM source's chains in the running calibration (ScoreCalibration.chain)


SEED_RUN_EDGES = (1.0, 3.0, 6.0)  # upper edges of the expected-run buckets that key the LM's gates


def seed_bucket(run: float) -> int:
    """The bucket of a seed's expected accepted run: 0 below 1 token, 1 below 3, 2 below 6, 3 above.

    >>> [seed_bucket(r) for r in (0.0, 1.0, 4.5, 9.0)]
    [0, 1, 2, 3]
    """
    return sum(run >= edge for edge in SEED_RUN_EDGES)


def propose_priced(lm: "LMSource", sequence, max_tokens: int, calibration, verify_costs, gates=None,
                   free_rate: float | None = None, seeds=()) -> tuple[LMChain | None, list[float]]:
    """The LM source's chain for a round, or None where its gate stays shut.

    ``seeds``: the round's other proposals, ``(tokens, conditional estimates)`` pairs (the n-gram
    continuation, the drafter's argmax block). The LM continues the likeliest where it agrees with it
    (:func:`best_seed`, :meth:`LMSource.propose`). ``gates(key)`` returns the
    :class:`~hf_jetspec.policy.DraftGate` of a key (the output memory's ``draft_gate``): there is one
    per bucket of that seed's expected run (:func:`seed_bucket`), because an LM that pays where the
    other sources are unsure may not pay where they are about to copy a long run. A gate decides first
    whether the LM is worth a chain this round, from how its chains compared before with the best rate
    without it (``free_rate`` or the seed's own, whichever is higher); a shut gate still probes now and
    then. The chain grows while another token pays (:func:`worth_another_token`, with the path's
    expected acceptance from the running ``calibration`` of LM chains and the LM's measured cost per
    token; before the first measurement, a fifth of a plain step ``verify_costs[0]``). Returns the
    chain and its calibrated conditional estimates."""
    from ..policy import choose_verify_length

    seed, seed_conditionals = best_seed(seeds)
    gate = None if gates is None else gates(f"lm@{seed_bucket(expected_run(seed_conditionals))}")
    if gate is not None and not gate.should_draft():
        gate.skipped()
        return None, []
    step_s = float(verify_costs[0])

    def keep_going(raw):
        path = 1.0
        for c in calibration.chain(LM_SOURCE, raw):
            path *= c
        return worth_another_token(path, lm.token_seconds if lm.token_seconds is not None else 0.2 * step_s, step_s)

    chain = lm.propose(sequence, max_tokens, keep_going, seed)
    calibrated = calibration.chain(LM_SOURCE, chain.probs)
    if gate is not None:
        free = free_rate if free_rate is not None else 1.0 / step_s
        if seed:
            free = max(free, choose_verify_length(seed_conditionals, verify_costs).rate)
        value = choose_verify_length(calibrated, verify_costs, draft_cost=chain.seconds, min_length=1).rate
        gate.observe(value, free)
    return chain, calibrated


class LMSource:
    """A causal LM proposing greedy chains (see the module docstring).

    Args:
        model: any causal LM with the target's tokenizer (``AutoModelForCausalLM``).
        config: an :class:`LMSourceConfig`.
        preferred_ids: ids the restricted head keeps first (a drafter's draft vocabulary, say).
    """

    def __init__(self, model, config: LMSourceConfig | None = None, preferred_ids=None):
        self.model = model.eval()
        self.config = config if config is not None else LMSourceConfig()
        self.backbone = model.base_model
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no output embeddings: an LM source needs a causal LM with a head")
        weight = head.weight.detach()
        self.head_ids = None
        if self.config.head_vocab is not None and self.config.head_vocab < weight.shape[0]:
            self.head_ids = lm_head_ids(weight.shape[0], self.config.head_vocab, preferred_ids).to(weight.device)
            weight = weight[self.head_ids]
        self.head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
        self.head.weight = nn.Parameter(weight, requires_grad=False)  # the LM's own rows, or the restricted copy
        if self.config.int8 is None:
            self.config = self.config.replace(int8=weight.device.type == "cpu")
        if self.config.int8:
            self.backbone, self.head = int8_copies(self.backbone, self.head)
        self.cache = None
        self.ids: list[int] = []  # tokens whose keys and values are in the cache
        self.token_seconds = None  # running mean of one single-token forward
        self.forwards = 0

    @classmethod
    def for_target(cls, target, model, config: LMSourceConfig | None = None, preferred_ids=None, target_tokenizer=None,
                   lm_tokenizer=None) -> "LMSource":
        """An LM source for ``target``, after :func:`check_lm_source`."""
        check_lm_source(target, model, target_tokenizer, lm_tokenizer)
        return cls(model, config, preferred_ids)

    @property
    def device(self):
        return self.model.get_output_embeddings().weight.device

    def reset(self) -> None:
        """Forget the cached text (the next chain feeds its whole sequence)."""
        self.cache, self.ids = None, []

    def _new_cache(self):
        from transformers.cache_utils import DynamicCache

        return DynamicCache(config=self.model.config)

    def _sync(self, sequence: list[int]) -> list[int]:
        """Crop the cache to what it shares with ``sequence`` (one token short of all of it, so that a
        forward is left to predict from); return the tokens to feed."""
        keep = min(common_prefix_length(self.ids, sequence), len(sequence) - 1)
        if self.cache is None or (keep < len(self.ids) and not getattr(self.cache, "is_croppable", True)):
            self.cache, keep = self._new_cache(), 0
        elif keep < len(self.ids):
            self.cache.crop(keep - len(self.ids))  # a negative count: the rows to drop
        self.ids = self.ids[:keep]
        return sequence[keep:]

    @torch.no_grad()
    def _step(self, tokens: list[int], rows: int = 1) -> torch.Tensor:
        """Feed ``tokens``; the restricted head's float32 probabilities after each of the last ``rows`` [rows, V_head]."""
        start = len(self.ids)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(tokens), device=self.device)[None]
        out = self.backbone(input_ids=ids, position_ids=positions, cache=self.cache, use_cache=True)
        self.ids.extend(tokens)
        self.forwards += 1
        return torch.softmax(self.head(out.last_hidden_state[0, -rows:]).float(), dim=-1)

    def _drop(self, count: int) -> None:
        """Forget the last ``count`` fed tokens."""
        if count > 0:
            self.cache.crop(-count)
            self.ids = self.ids[:-count]

    def propose(self, sequence, max_tokens: int, keep_going=None, seed=()) -> LMChain:
        """A greedy chain after ``sequence`` (the verified text, ending with the round's anchor).

        ``seed``: a proposal to continue (an n-gram continuation). It is fed with the catch-up tokens
        in the same forward, which gives the LM's own choice at each of its positions: the chain
        takes the seed's tokens while the LM agrees with them, its own token where it first does
        not, and continues one forward per token from there (or from the seed's end). So where a copy
        is right the LM extends it for the price of one forward, and where it goes wrong the LM
        proposes the branch.

        ``keep_going(raw_probs)`` decides after each token whether to propose another (default:
        always); the chain holds at most ``max_tokens``, at most ``config.max_tokens`` beyond the
        seed's agreed tokens, and ends after a token whose probability is below ``config.min_prob``."""
        t0 = time.perf_counter()
        sequence = [int(t) for t in (sequence.tolist() if isinstance(sequence, torch.Tensor) else sequence)]
        tokens, probs = [], []
        if int(max_tokens) < 1 or not sequence:
            return LMChain(tokens, probs, 0.0)
        seed = [int(t) for t in seed][: int(max_tokens)]
        feed = self._sync(sequence)
        t1 = time.perf_counter()
        rows = self._step(feed + seed, 1 + len(seed))
        if len(feed) + len(seed) == 1:
            self._observe_token(time.perf_counter() - t1)
        own, i = 0, 0  # tokens beyond the agreed seed; the row of ``rows`` that predicts the next token
        while True:
            prob, row = rows[i].max(dim=-1)
            token = int(row) if self.head_ids is None else int(self.head_ids[row])
            tokens.append(token)
            probs.append(float(prob))
            on_seed = i < len(seed) and token == seed[i]
            own += int(not on_seed)
            if (len(tokens) >= max_tokens or own >= self.config.max_tokens or probs[-1] < self.config.min_prob
                    or (keep_going is not None and not keep_going(probs))):
                break
            if on_seed:  # the next row is already computed
                i += 1
                continue
            if i < len(seed):  # off the seed: its remaining tokens are not this chain's text
                self._drop(len(seed) - i)
                seed = []
            t1 = time.perf_counter()
            rows, i = self._step([token]), 0
            self._observe_token(time.perf_counter() - t1)
        return LMChain(tokens, probs, time.perf_counter() - t0)

    def _observe_token(self, seconds: float) -> None:
        self.token_seconds = seconds if self.token_seconds is None else 0.9 * self.token_seconds + 0.1 * seconds
