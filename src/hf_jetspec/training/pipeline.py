"""A drafter from nothing within a time budget: regenerate with the target, train, evaluate, save.

The same call runs on the CPU and on a GPU (the target's device decides); it is what
``examples/pipeline.py`` runs for users and what ``benchmarks/gpu_check.py`` runs in its
``train_pipeline`` section. The budget is wall-clock minutes, split between the phases:

1. **regenerate** (``regenerate_share`` of the budget): the target answers training prompts and
   the same forwards write the feature cache (:func:`~hf_jetspec.training.regenerate.regenerate`
   with a deadline);
2. **train** (what is left after the evaluation reserve): a drafter initialised from the
   target's own layers trains on the cache. A time budget does not know its step count in
   advance, so the learning rate follows :func:`budget_cosine`: linear warmup over steps, then a
   cosine over the *elapsed share of the training time*. Checkpoints are written at
   ``curve_points`` evenly spaced moments of that time;
3. **evaluate** (``evaluate_share``): every checkpoint's drafter-alone tau (J1, budget 16, full
   blocks, round policy off) on held-out items, outputs compared with plain decoding (identical
   in fp32; in bf16 a divergence can be a numerical tie, which ``hf-jetspec bench`` explains): the
   learning curve against seconds (and CPU-hours).

The output folder holds ``regenerated/`` (the cache and its manifest), ``checkpoints/``,
``drafter/`` (the final Hub-ready drafter), ``training.json`` (steps and checkpoint times),
``learning_curve.json`` and ``pipeline.json``. Run again on the same folder, it resumes: an
interrupted regeneration goes on from its last shard, and a finished training is not repeated.
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
    regenerate_share: float = 0.35  # of the budget, for the target's answers
    evaluate_share: float = 0.15  # of the budget, reserved for the learning-curve evaluations
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
        if not (0 < self.regenerate_share and 0 <= self.evaluate_share and self.regenerate_share + self.evaluate_share < 1):
            raise ValueError("regenerate_share > 0, evaluate_share >= 0 and their sum < 1 are needed: training needs time too")
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

    @property
    def final_tau(self) -> float | None:
        return self.curve[-1]["tau"] if self.curve else None


class _TimeBudget(TrainerCallback):
    """Stops training at the budget and asks for a checkpoint at each save moment."""

    def __init__(self, budget_s: float, points: int):
        self.budget_s = budget_s
        self.moments = save_moments(budget_s, points)
        self.t0: float | None = None
        self.cpu0 = 0.0
        self.saved_at: dict[int, float] = {}  # step -> elapsed training seconds when its checkpoint was written
        self.cpu_hours_at: dict[int, float] = {}  # step -> CPU-hours (all threads) spent training up to that checkpoint

    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else time.perf_counter() - self.t0

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        elapsed = self.elapsed()
        if self.moments and elapsed >= self.moments[0]:
            while self.moments and elapsed >= self.moments[0]:
                self.moments.pop(0)
            control.should_save = True
        if elapsed >= self.budget_s:
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.saved_at[state.global_step] = round(self.elapsed(), 1)
        self.cpu_hours_at[state.global_step] = round((time.process_time() - self.cpu0) / 3600.0, 5)


def _budget_trainer(base, clock: _TimeBudget, warmup_steps: int, train_s: float):
    """``base`` (a Trainer class) whose scheduler follows :func:`budget_cosine` on ``clock``."""

    class BudgetTrainer(base):
        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer if optimizer is not None else self.optimizer,
                    lambda step: budget_cosine(step, clock.elapsed(), warmup_steps, train_s))
            return self.lr_scheduler

    return BudgetTrainer


def run_pipeline(target, tokenizer, output: str | os.PathLike, config: PipelineConfig, eval_items: list, target_name: str = "",
                 prompts=None, progress: bool = True, drafter_overrides: dict | None = None) -> PipelineResult:
    """Regenerate, train and evaluate within ``config.minutes``; see the module docstring.

    ``eval_items``: (id, input_ids) pairs no phase trains on (``hf_jetspec.tools.bench.build_items``).
    ``prompts``: regeneration prompts (default: the offline training sources, evaluation overlap excluded).
    """
    from ..drafter.modeling_drafter import JetSpecDrafter
    from .drafter_tau import acceptance_on_items
    from .config import JetSpecTrainingArguments
    from .feature_cache import FeatureCacheCollator, FeatureCacheDataset, frequent_cached_tokens
    from .trainer import JetSpecTrainer

    if not eval_items:
        raise ValueError("run_pipeline needs held-out evaluation items for its learning curve")
    out = os.fspath(output)
    os.makedirs(out, exist_ok=True)
    budget_s = config.minutes * 60.0
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    drafter = JetSpecDrafter.for_target(target, init_layers_from_target=True, num_hidden_layers=config.drafter_layers,
                                        **(drafter_overrides or {}))
    layer_ids = list(drafter.config.target_layer_ids)

    # 1. regenerate
    regen_cfg = config.regeneration
    if str(target.dtype) == "torch.bfloat16" and regen_cfg.states_dtype == "float16":
        regen_cfg = replace(regen_cfg, states_dtype="bfloat16")
    cache_dir = os.path.join(out, "regenerated")
    final = os.path.join(out, "drafter")
    training_file = os.path.join(out, "training.json")
    trained_before = os.path.isfile(training_file) and os.path.isdir(final)  # only the evaluation was interrupted
    manifest = regenerate(target, tokenizer, cache_dir, layer_ids, regen_cfg, target_name, prompts=prompts, progress=progress,
                          resume=os.path.isfile(os.path.join(cache_dir, "regeneration.json")),
                          deadline=0.0 if trained_before else start + budget_s * config.regenerate_share)
    if manifest.num_sequences == 0:
        raise RuntimeError("regeneration produced no sequences: check the prompt sources and max_new_tokens")
    regen_s = manifest.seconds if trained_before else time.perf_counter() - start

    # 2. train
    dataset = FeatureCacheDataset(cache_dir, layer_ids=layer_ids)
    if config.draft_vocab and config.draft_vocab < drafter.config.vocab_size:
        drafter.restrict_draft_vocab(frequent_cached_tokens(dataset, config.draft_vocab))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    train_s = max(budget_s * (1.0 - config.evaluate_share) - regen_s, 1.0)
    clock = _TimeBudget(train_s, config.curve_points)
    on_cpu = target.device.type == "cpu"
    args = JetSpecTrainingArguments(
        output_dir=os.path.join(out, "checkpoints"), per_device_train_batch_size=config.batch_size, learning_rate=config.lr,
        weight_decay=0.0, max_steps=config.max_steps, save_strategy="steps", save_steps=config.max_steps, logging_steps=10,
        report_to=[], bf16=config.bf16, use_cpu=on_cpu, dataloader_num_workers=0, seed=config.seed, block_inputs="jacobi"
        if drafter.config.block_inputs != "mask" else "noised", blocks_per_sequence=config.blocks_per_sequence,
        disable_tqdm=not progress,
    )
    if trained_before:
        with open(training_file) as f:
            trained = json.load(f)
        steps, train_seconds = trained["steps"], trained["train_seconds"]
        clock.saved_at = {int(k): v for k, v in trained["saved_at"].items()}
        clock.cpu_hours_at = {int(k): v for k, v in trained["cpu_hours_at"].items()}
    else:
        trainer_cls = _budget_trainer(JetSpecTrainer, clock, config.warmup_steps, train_s)
        trainer = trainer_cls(model=drafter, args=args, target=target, train_dataset=dataset,
                              data_collator=FeatureCacheCollator(pad_id), callbacks=[clock])
        t_train = time.perf_counter()
        trainer.train()
        train_seconds = time.perf_counter() - t_train
        steps = trainer.state.global_step
        drafter.save_pretrained(final)
        with open(training_file, "w") as f:
            json.dump({"steps": steps, "train_seconds": round(train_seconds, 1), "saved_at": clock.saved_at,
                       "cpu_hours_at": clock.cpu_hours_at}, f, indent=1)

    # 3. evaluate every checkpoint (the learning curve)
    t_eval = time.perf_counter()
    ckpt_root = os.path.join(out, "checkpoints")
    folders = sorted((int(n.split("-")[-1]), os.path.join(ckpt_root, n)) for n in os.listdir(ckpt_root) if n.startswith("checkpoint-"))
    references: dict = {}
    items = [(i, ids.to(target.device)) for i, ids in eval_items]
    curve = []
    for step, folder in folders:
        model = JetSpecDrafter.from_pretrained(folder, dtype=torch.float32).eval()
        r = acceptance_on_items(target, model, items, config.eval_new_tokens, references, num_jacobi_passes=config.jacobi_passes,
                                budget=config.budget, policy=False)
        curve.append({"step": step, "tau": round(r["tau"], 4), "identical_to_plain": r["exact"], "regenerate_seconds": round(regen_s, 1),
                      "train_seconds": clock.saved_at.get(step),
                      "train_cpu_hours": clock.cpu_hours_at.get(step), "regenerate_cpu_hours": round(manifest.cpu_seconds / 3600, 4)})
    evaluate_seconds = time.perf_counter() - t_eval
    result = PipelineResult(final, manifest.num_sequences, manifest.generated_tokens, round(regen_s, 1), round(manifest.tokens_per_s, 1),
                            steps, round(train_seconds, 1), round(evaluate_seconds, 1), curve, str(target.device))
    with open(os.path.join(out, "learning_curve.json"), "w") as f:
        json.dump({"target": target_name, "curve": curve, "jacobi_passes": config.jacobi_passes, "budget": config.budget,
                   "eval_items": [i for i, _ in eval_items], "eval_new_tokens": config.eval_new_tokens}, f, indent=1)
    with open(os.path.join(out, "pipeline.json"), "w") as f:
        json.dump({"config": asdict(config), "result": asdict(result), "target": target_name, "dtype": str(target.dtype)}, f, indent=1,
                  default=str)
    return result
