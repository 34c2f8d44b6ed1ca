"""A drafter from nothing within a time budget: regenerate with the target, train, evaluate, save.

The same call runs on the CPU and on a GPU (the target's device decides); it is what
``examples/pipeline.py`` and ``hf-jetspec train`` run for users and what ``benchmarks/gpu_check.py``
runs in its ``train_pipeline`` section. The budget is wall-clock minutes from ``start`` (the caller's
own start, so loading counts), and its split is planned from measured rates
(:func:`~hf_jetspec.training.budget.plan_budget`), not fixed shares:

0. the held-out items' plain greedy outputs (every checkpoint's evaluation compares against them)
   are generated first and timed: that prices a curve point and whatever the caller reserves after
   the pipeline (``reserve_generations`` such generations: a calibration, a verdict);
1. **regenerate**: the target answers one batch of training prompts (the forwards write the feature
   cache), which prices an answer; two training steps on it price a step; then the plan says how
   many answers the budget buys at ``max_epochs`` epochs, and regeneration goes on to that count
   or its deadline (:func:`~hf_jetspec.training.regenerate.regenerate`);
2. **train**: a drafter initialised from the target's own layers trains on the cache for the
   planned steps (at most ``max_epochs`` passes over the answers) or until the time planned for it
   is spent, the learning rate warming up by steps, then on :func:`budget_cosine` over the larger
   of the time share and the step share spent. Checkpoints at evenly spaced steps;
3. **evaluate**: the final checkpoint's drafter-alone tau (J1, budget 16, full blocks, policy off)
   on the held-out items, then earlier checkpoints, newest first, while the budget lasts: the
   learning curve against seconds and CPU-hours. The training log's ``train_acc_first`` and
   ``train_tau_est`` describe the training answers; the curve is the held-out figure.

One :class:`~hf_jetspec.training.budget.BudgetBar` shows the whole run: seconds against the budget,
with the phase and its planned and done counts.

The output folder holds ``regenerated/`` (the cache and its manifest), ``checkpoints/``,
``drafter/`` (the final Hub-ready drafter), ``training.json`` (steps and checkpoint times),
``learning_curve.json`` and ``pipeline.json`` (with the plan and the measured rates). Run again on
the same folder, it resumes: an interrupted regeneration goes on from its last shard, and a
finished training is not repeated.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace

import torch
from transformers import TrainerCallback

from .regenerate import RegenerationConfig, regenerate


def budget_cosine(step: int, elapsed_s: float, warmup_steps: int, budget_s: float, floor: float = 0.0) -> float:
    """Learning-rate factor for a run bounded by time: ``step / warmup_steps`` during warmup, then
    ``floor + (1 - floor) * (1 + cos(pi * f)) / 2`` with ``f = elapsed_s / budget_s`` clipped to [0, 1].

    >>> budget_cosine(5, 1.0, 10, 100.0)
    0.5
    >>> budget_cosine(20, 50.0, 10, 100.0)
    0.5
    """
    if warmup_steps > 0 and step < warmup_steps:
        return step / warmup_steps
    f = min(max(elapsed_s / budget_s, 0.0), 1.0) if budget_s > 0 else 1.0
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * f))


def save_moments(budget_s: float, points: int) -> list[float]:
    """Elapsed training seconds at which checkpoints are written: ``points`` evenly spaced, the last at the budget.

    >>> save_moments(60.0, 3)
    [20.0, 40.0, 60.0]
    """
    return [budget_s * (i + 1) / points for i in range(max(points, 1))]


@dataclass
class PipelineConfig:
    """What :func:`run_pipeline` does within ``minutes`` of wall clock."""

    minutes: float = 10.0
    max_epochs: float = 4.0  # passes over the answers while there is time to regenerate (the scaling curve's recipe)
    reserve_generations: float = 0.0  # plain generations of an evaluation item the caller runs after the pipeline
    regeneration: RegenerationConfig = field(default_factory=lambda: RegenerationConfig(num_prompts=100_000, batch_size=64))
    drafter_layers: int = 2
    draft_vocab: int | None = 8192  # the most frequent regenerated response tokens; None keeps the full head
    batch_size: int = 8
    blocks_per_sequence: int = 32
    lr: float = 1.5e-3
    warmup_steps: int = 20
    max_steps: int = 1_000_000  # an upper bound only: the time budget ends training
    bf16: bool = False  # mixed precision for the drafter's training (use where the device has native bf16)
    curve_points: int = 4
    jacobi_passes: int = 1
    budget: int = 16
    eval_new_tokens: int = 64
    seed: int = 0

    def __post_init__(self):
        if not self.minutes > 0:
            raise ValueError(f"minutes must be > 0, got {self.minutes}")
        if not self.max_epochs > 0:
            raise ValueError(f"max_epochs must be > 0, got {self.max_epochs}")
        if self.curve_points < 1:
            raise ValueError("curve_points must be >= 1")


@dataclass
class PipelineResult:
    drafter_folder: str
    regenerated_sequences: int
    generated_tokens: int
    regenerate_seconds: float
    regenerate_tokens_per_s: float
    train_steps: int
    train_seconds: float
    evaluate_seconds: float
    curve: list[dict]
    device: str
    epochs: float = 0.0  # passes over the answers the training made
    plan: dict = field(default_factory=dict)  # the last plan (BudgetPlan) and the measured rates it used
    item_seconds: float = 0.0  # one plain greedy generation of an evaluation item: the caller's unit for what follows

    @property
    def final_tau(self) -> float | None:
        return self.curve[-1]["tau"] if self.curve else None


class _TimeBudget(TrainerCallback):
    """Stops training at its time or step budget, asks for a checkpoint at each save step, and shows
    the run's progress on the budget bar."""

    def __init__(self, budget_s: float, steps: int, points: int, bar=None, answers: int = 0, batch_size: int = 1,
                 max_epochs: float = 0.0):
        self.budget_s, self.steps = budget_s, max(int(steps), 1)
        self.moments = [math.ceil(m) for m in save_moments(float(self.steps), points)]
        self.t0: float | None = None
        self.cpu0 = 0.0
        self.saved_at: dict[int, float] = {}  # step -> elapsed training seconds when its checkpoint was written
        self.cpu_hours_at: dict[int, float] = {}  # step -> CPU-hours (all threads) spent training up to that checkpoint
        self.step_ends: list[float] = []  # elapsed seconds at the end of each step (the probe reads its rate)
        self.bar, self.answers, self.batch_size, self.max_epochs = bar, answers, batch_size, max_epochs

    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else time.perf_counter() - self.t0

    def progress(self, step: int) -> float:
        """The share of training done: the larger of the time and step shares."""
        return max(self.elapsed() / self.budget_s if self.budget_s > 0 else 1.0, step / self.steps)

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        elapsed = self.elapsed()
        self.step_ends.append(elapsed)
        if self.moments and state.global_step >= self.moments[0]:
            while self.moments and state.global_step >= self.moments[0]:
                self.moments.pop(0)
            control.should_save = True
        if elapsed >= self.budget_s or state.global_step >= self.steps:
            control.should_save = True
            control.should_training_stop = True
        if self.bar is not None:
            epochs = state.global_step * self.batch_size / max(self.answers, 1)
            self.bar.show("train", f"step {state.global_step}/{self.steps}, epoch {epochs:.1f}/{self.max_epochs:g}, "
                                   f"{self.answers} answers")
        return control

    def on_save(self, args, state, control, **kwargs):
        self.saved_at[state.global_step] = round(self.elapsed(), 1)
        self.cpu_hours_at[state.global_step] = round((time.process_time() - self.cpu0) / 3600.0, 5)


def _budget_trainer(base, clock: _TimeBudget, warmup_steps: int):
    """``base`` (a Trainer class) whose scheduler follows :func:`budget_cosine` on ``clock``'s progress."""

    class BudgetTrainer(base):
        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer if optimizer is not None else self.optimizer,
                    lambda step: budget_cosine(step, clock.progress(step), warmup_steps, 1.0))
            return self.lr_scheduler

    return BudgetTrainer


def plan_training(remaining_s: float, answers: int, costs, batch_size: int, max_epochs: float, curve_points: int):
    """Once regeneration is over: the steps the rest of the budget buys (``costs`` as for
    :func:`~hf_jetspec.training.budget.plan_budget`, no more answers), capped at ``max_epochs``.

    >>> from hf_jetspec.training.budget import PhaseCosts
    >>> plan_training(1000, 100, PhaseCosts(1.0, 2.0, 50.0, 100.0), batch_size=8, max_epochs=4, curve_points=4).steps
    50
    """
    from .budget import epoch_steps, plan_budget

    plan = plan_budget(remaining_s, answers, costs, batch_size, max_epochs, curve_points, min_answers=answers)
    train_s = max(remaining_s - plan.tail_s - plan.evaluate_s, 0.0)
    steps = min(int(train_s / costs.step_s) if costs.step_s > 0 else 0, epoch_steps(answers, batch_size, max_epochs))
    return replace(plan, answers=answers, steps=steps, epochs=round(steps * batch_size / max(answers, 1), 2), regenerate_s=0.0,
                   train_s=train_s)


def _training_args(out: str, config: PipelineConfig, drafter, on_cpu: bool, steps: int, **overrides):
    from .config import JetSpecTrainingArguments

    return JetSpecTrainingArguments(**{
        "output_dir": os.path.join(out, "checkpoints"), "per_device_train_batch_size": config.batch_size, "learning_rate": config.lr,
        "weight_decay": 0.0, "max_steps": max(steps, 1), "save_strategy": "steps", "save_steps": config.max_steps, "logging_steps": 10,
        "report_to": [], "bf16": config.bf16, "use_cpu": on_cpu, "dataloader_num_workers": 0, "seed": config.seed,
        "block_inputs": "jacobi" if drafter.config.block_inputs != "mask" else "noised", "blocks_per_sequence": config.blocks_per_sequence,
        "disable_tqdm": True, **overrides})


def _probe_step_seconds(target, dataset, config: PipelineConfig, make_drafter, pad_id: int, out: str) -> float:
    """Seconds of one training step: three steps of a throwaway drafter on the first answers, the
    first (set-up) left out."""
    import shutil

    from .feature_cache import FeatureCacheCollator
    from .trainer import JetSpecTrainer

    probe = make_drafter()
    clock = _TimeBudget(1e9, 3, 1)
    args = _training_args(os.path.join(out, "probe"), config, probe, target.device.type == "cpu", 3, save_strategy="no")
    JetSpecTrainer(model=probe, args=args, target=target, train_dataset=dataset, data_collator=FeatureCacheCollator(pad_id),
                   callbacks=[clock]).train()
    shutil.rmtree(os.path.join(out, "probe"), ignore_errors=True)
    ends = clock.step_ends
    return (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else ends[-1]


def run_pipeline(target, tokenizer, output: str | os.PathLike, config: PipelineConfig, eval_items: list, target_name: str = "",
                 prompts=None, progress: bool = True, drafter_overrides: dict | None = None, start: float | None = None,
                 bar=None, init_from: str | None = None) -> PipelineResult:
    """Regenerate, train and evaluate within ``config.minutes`` from ``start`` (default: now); see the module docstring.

    ``eval_items``: (id, input_ids) pairs no phase trains on (``hf_jetspec.tools.bench.build_items``).
    ``prompts``: regeneration prompts (default: the offline training sources, evaluation overlap excluded).
    ``bar``: the caller's :class:`~hf_jetspec.training.budget.BudgetBar` (default: one of the pipeline's own).
    ``init_from``: a drafter folder to continue (an earlier run's ``drafter/``) instead of a fresh one.
    """
    from ..drafter.modeling_drafter import JetSpecDrafter
    from .budget import BudgetBar, PhaseCosts, plan_budget
    from .drafter_tau import acceptance_on_items
    from .feature_cache import FeatureCacheCollator, FeatureCacheDataset, frequent_cached_tokens
    from .trainer import JetSpecTrainer

    if not eval_items:
        raise ValueError("run_pipeline needs held-out evaluation items for its learning curve")
    out = os.fspath(output)
    os.makedirs(out, exist_ok=True)
    budget_s = config.minutes * 60.0
    start = time.perf_counter() if start is None else start
    deadline = start + budget_s
    own_bar = bar is None
    bar = BudgetBar(budget_s, start, disable=not progress) if own_bar else bar

    def make_drafter():
        torch.manual_seed(config.seed)
        if init_from is not None:
            continued = JetSpecDrafter.from_pretrained(init_from, dtype=torch.float32)
            continued.attach_target(target, follow_dtype=False)
            return continued
        return JetSpecDrafter.for_target(target, init_layers_from_target=True, num_hidden_layers=config.drafter_layers,
                                         **(drafter_overrides or {}))

    drafter = make_drafter()
    layer_ids = list(drafter.config.target_layer_ids)

    # 0. the held-out references, timed: the price of a curve point and of the caller's reserve
    bar.show("evaluate", f"plain outputs of {len(eval_items)} held-out items")
    items = [(i, ids.to(target.device)) for i, ids in eval_items]
    references: dict = {}
    t_ref = time.perf_counter()
    with torch.no_grad():
        for item_id, ids in items:
            references[item_id] = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                                  max_new_tokens=config.eval_new_tokens)
    item_s = (time.perf_counter() - t_ref) / len(items)
    eval_s = 1.5 * item_s * len(items)  # a checkpoint's drafter-alone pass over the items: re-measured at the first
    tail_s = config.reserve_generations * item_s

    # 1. regenerate: one batch prices an answer, two steps on it price a step, then the plan
    regen_cfg = config.regeneration
    if str(target.dtype) == "torch.bfloat16" and regen_cfg.states_dtype == "float16":
        regen_cfg = replace(regen_cfg, states_dtype="bfloat16")
    cache_dir = os.path.join(out, "regenerated")
    final = os.path.join(out, "drafter")
    training_file = os.path.join(out, "training.json")
    trained_before = os.path.isfile(training_file) and os.path.isdir(final)  # only the evaluation was interrupted
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def regenerate_upto(count: int, until: float):
        planned = max(count, 1)

        def shown(done: int) -> None:
            bar.show("regenerate", f"{done}/{planned} answers")

        cfg = replace(regen_cfg, num_prompts=min(count, regen_cfg.num_prompts))
        return regenerate(target, tokenizer, cache_dir, layer_ids, cfg, target_name, prompts=None if prompts is None else prompts[:cfg.num_prompts],
                          progress=False, resume=os.path.isfile(os.path.join(cache_dir, "regeneration.json")), deadline=until, on_batch=shown)

    old = os.path.join(cache_dir, "regeneration.json")
    selected = len(json.loads(open(old).read())["prompts_sha256"]) if os.path.isfile(old) else 0  # a resumed run's selection
    t_regen = time.perf_counter()
    manifest = regenerate_upto(max(regen_cfg.batch_size, selected), 0.0)  # an empty cache gets its first batch, a resumed one none
    answer_s = manifest.seconds / max(manifest.num_sequences, 1)
    plan, step_s = None, None
    if not trained_before:
        dataset = FeatureCacheDataset(cache_dir, layer_ids=layer_ids)
        vocab = (frequent_cached_tokens(dataset, config.draft_vocab) if config.draft_vocab and config.draft_vocab < drafter.config.vocab_size
                 and drafter.config.draft_vocab_size is None else None)

        def probe_drafter():
            probe = make_drafter()
            if vocab is not None:
                probe.restrict_draft_vocab(vocab)
            return probe

        bar.show("train", "pricing a step")
        step_s = _probe_step_seconds(target, dataset, config, probe_drafter, pad_id, out)
        costs = PhaseCosts(answer_s, step_s, eval_s, tail_s)
        plan = plan_budget(deadline - time.perf_counter(), manifest.num_sequences, costs, config.batch_size, config.max_epochs,
                           config.curve_points)
        if plan.answers > manifest.num_sequences:
            manifest = regenerate_upto(max(plan.answers, selected), time.perf_counter() + plan.regenerate_s)
    if manifest.num_sequences == 0:
        raise RuntimeError("regeneration produced no sequences: check the prompt sources and max_new_tokens")
    regen_s = manifest.seconds if trained_before else time.perf_counter() - t_regen

    # 2. train for what is left, at most max_epochs passes
    dataset = FeatureCacheDataset(cache_dir, layer_ids=layer_ids)
    if config.draft_vocab and config.draft_vocab < drafter.config.vocab_size and drafter.config.draft_vocab_size is None:
        drafter.restrict_draft_vocab(frequent_cached_tokens(dataset, config.draft_vocab))
    on_cpu = target.device.type == "cpu"
    if trained_before:
        with open(training_file) as f:
            trained = json.load(f)
        steps, train_seconds = trained["steps"], trained["train_seconds"]
        clock = _TimeBudget(train_seconds, steps, config.curve_points)
        clock.saved_at = {int(k): v for k, v in trained["saved_at"].items()}
        clock.cpu_hours_at = {int(k): v for k, v in trained["cpu_hours_at"].items()}
        plan_record = trained.get("plan", {})
    else:
        plan = plan_training(deadline - time.perf_counter(), len(dataset), PhaseCosts(answer_s, step_s, eval_s, tail_s),
                             config.batch_size, config.max_epochs, config.curve_points)
        planned_steps = max(min(plan.steps, config.max_steps), 1)
        clock = _TimeBudget(plan.train_s, planned_steps, plan.curve_points, bar, len(dataset), config.batch_size, config.max_epochs)
        trainer_cls = _budget_trainer(JetSpecTrainer, clock, min(config.warmup_steps, max(planned_steps // 10, 1)))
        trainer = trainer_cls(model=drafter, args=_training_args(out, config, drafter, on_cpu, planned_steps), target=target,
                              train_dataset=dataset, data_collator=FeatureCacheCollator(pad_id), callbacks=[clock])
        t_train = time.perf_counter()
        trainer.train()
        train_seconds = time.perf_counter() - t_train
        steps = trainer.state.global_step
        drafter.save_pretrained(final)
        plan_record = asdict(plan) | {"rates": {"answer_s": round(answer_s, 4), "step_s": round(step_s, 4), "eval_s": round(eval_s, 3),
                                                "item_s": round(item_s, 3)}}
        with open(training_file, "w") as f:
            json.dump({"steps": steps, "train_seconds": round(train_seconds, 1), "saved_at": clock.saved_at,
                       "cpu_hours_at": clock.cpu_hours_at, "plan": plan_record}, f, indent=1)

    # 3. evaluate: the final checkpoint first, then earlier ones, newest first, while the budget lasts
    t_eval = time.perf_counter()
    ckpt_root = os.path.join(out, "checkpoints")
    folders = sorted(((int(n.split("-")[-1]), os.path.join(ckpt_root, n)) for n in os.listdir(ckpt_root) if n.startswith("checkpoint-")),
                     reverse=True)
    curve = []
    for k, (step, folder) in enumerate(folders):
        if k > 0 and deadline - time.perf_counter() < tail_s + eval_s:
            break  # the reserve after the pipeline comes first
        bar.show("evaluate", f"checkpoint {k + 1}/{len(folders)} (step {step}), {len(items)} held-out items")
        t0 = time.perf_counter()
        model = JetSpecDrafter.from_pretrained(folder, dtype=torch.float32).eval()
        r = acceptance_on_items(target, model, items, config.eval_new_tokens, references, num_jacobi_passes=config.jacobi_passes,
                                budget=config.budget, policy=False)
        eval_s = time.perf_counter() - t0
        curve.append({"step": step, "tau": round(r["tau"], 4), "identical_to_plain": r["exact"], "regenerate_seconds": round(regen_s, 1),
                      "train_seconds": clock.saved_at.get(step),
                      "train_cpu_hours": clock.cpu_hours_at.get(step), "regenerate_cpu_hours": round(manifest.cpu_seconds / 3600, 4)})
    curve.sort(key=lambda row: row["step"])
    evaluate_seconds = time.perf_counter() - t_eval
    epochs = round(steps * config.batch_size / max(manifest.num_sequences, 1), 2)
    result = PipelineResult(final, manifest.num_sequences, manifest.generated_tokens, round(regen_s, 1), round(manifest.tokens_per_s, 1),
                            steps, round(train_seconds, 1), round(evaluate_seconds, 1), curve, str(target.device), epochs,
                            plan_record, round(item_s, 3))
    with open(os.path.join(out, "learning_curve.json"), "w") as f:
        json.dump({"target": target_name, "curve": curve, "jacobi_passes": config.jacobi_passes, "budget": config.budget,
                   "eval_items": [i for i, _ in eval_items], "eval_new_tokens": config.eval_new_tokens}, f, indent=1)
    with open(os.path.join(out, "pipeline.json"), "w") as f:
        json.dump({"config": asdict(config), "result": asdict(result), "target": target_name, "dtype": str(target.dtype)}, f, indent=1,
                  default=str)
    if own_bar:
        bar.close()
    return result
