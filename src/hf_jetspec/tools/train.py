"""One command from a target to a drafter: ``hf-jetspec train --target NAME_OR_FOLDER --output FOLDER``.

Within a budget of hours of wall clock on the target's device it

1. regenerates: the target answers prompts of the offline training sources (evaluation overlap
   excluded), and the same forwards write the feature cache;
2. trains a drafter initialised from the target's top layers on that cache, its learning rate on a
   cosine over the training time, checkpoints along the way;
3. evaluates every checkpoint's drafter-alone tau on held-out MT-Bench turns (the learning curve);
4. calibrates the round policy on rounds recorded from other held-out turns;
5. writes ``drafter/``, a Hub-ready folder: weights, config, the calibration and a model card.

Phases 1-3 are :func:`hf_jetspec.training.pipeline.run_pipeline` (the same call on a GPU), phase 4
is what ``hf-jetspec calibrate-policy`` runs. Run the same command again after an interruption: a
finished phase is not repeated (its files say it is done), and an interrupted regeneration resumes
after its last shard. Options a user must not get wrong default by the target's size
(:func:`defaults_for`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class SizeDefaults:
    """Options chosen from the target's parameter count."""

    drafter_layers: int
    draft_vocab: int | None  # the most frequent regenerated tokens; None keeps the whole head
    regen_batch_size: int
    batch_size: int
    lr: float


def defaults_for(num_params: int, vocab_size: int) -> SizeDefaults:
    """Per target size: up to 300M parameters two drafter layers and large regeneration batches (a
    forward is cheap); up to 2B two layers and smaller batches; beyond that one layer (a drafter
    layer of a large target is itself dear). A vocabulary above 32K drafts over its 8,192 most
    frequent answer tokens (the head dominates a small drafter's cost: Gemma-3's 262K-row head
    is most of a 270M model), and regenerates in smaller batches."""
    draft_vocab = 8192 if vocab_size > 32_768 else None
    if num_params <= 300e6:
        layers, batch, lr = 2, 32, 1.5e-3
    elif num_params <= 2e9:
        layers, batch, lr = 2, 16, 1e-3
    else:
        layers, batch, lr = 1, 8, 5e-4
    # a regeneration batch holds the prompts' logits over the whole vocabulary: past SmolLM2's 49K,
    # the batch shrinks with the vocabulary so that those logits take the same memory (Gemma-3's 262K: 6)
    batch = max(2, min(batch, batch * 49_152 // vocab_size))
    return SizeDefaults(layers, draft_vocab, batch, 8, lr)


@dataclass
class TrainCommandConfig:
    """What ``hf-jetspec train`` does."""

    target: str
    output: str
    hours: float = 1.0
    dtype: str = "auto"
    device: str | None = None
    eval_prompts: int = 6  # held-out MT-Bench questions for the learning curve
    calibration_prompts: int = 6  # other held-out MT-Bench questions for the round policy
    eval_new_tokens: int = 64
    max_new_tokens: int = 256  # per regenerated answer
    seed: int = 0

    def __post_init__(self):
        if not self.hours > 0:
            raise ValueError(f"hours must be > 0, got {self.hours}")
        if self.eval_prompts < 1 or self.calibration_prompts < 1:
            raise ValueError("eval_prompts and calibration_prompts must be >= 1")


def write_card(folder: str, record: dict) -> str:
    """The drafter folder's model card (``README.md``): target, recipe, counts, curve and the command."""
    curve = record["curve"]
    rows = "\n".join(f"| {p['step']} | {p['tau']} | {p['train_cpu_hours']} |" for p in curve)
    text = f"""---
library_name: hf_jetspec
tags: [speculative-decoding, jetspec, drafter]
---

# JetSpec drafter for `{record['target']}`

Written by `{record['command']}`.

- Target dtype: {record['dtype']}; device: {record['device']}.
- Regenerated answers: {record['regenerated_sequences']} ({record['generated_tokens']} tokens), in {record['regenerate_seconds']} s.
- Training: {record['train_steps']} steps in {record['train_seconds']} s; drafter layers {record['defaults']['drafter_layers']}, draft vocabulary {record['defaults']['draft_vocab'] or 'full'}.
- Round policy calibrated on {record['calibration_rounds']} rounds of held-out MT-Bench turns.
- Wall clock in all: {record['wall_hours']} h.

Drafter-alone tau (chains, J1, budget 16, policy off) on held-out MT-Bench turns, per checkpoint:

| step | tau | training CPU-hours |
| --- | --- | --- |
{rows}

```python
from hf_jetspec import JetSpecDrafter
drafter = JetSpecDrafter.from_pretrained("{os.path.basename(os.path.normpath(folder))}")
out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=256)
```
"""
    path = os.path.join(folder, "README.md")
    with open(path, "w") as f:
        f.write(text)
    return path


def run_train_command(config: TrainCommandConfig, progress: bool = True, pipeline_overrides: dict | None = None,
                      regeneration_overrides: dict | None = None) -> dict:
    """Run (or resume) the whole command; returns the record written to ``train.json``."""
    from ..data import load_eval_prompts
    from ..policy.calibrate import calibrate_acceptance, record_acceptance
    from ..training.pipeline import PipelineConfig, run_pipeline
    from ..training.regenerate import RegenerationConfig
    from .bench import build_items
    from .targets import load_target

    start = time.perf_counter()
    os.makedirs(config.output, exist_ok=True)
    record_path = os.path.join(config.output, "train.json")
    kwargs = {"device": config.device} if config.device else {}
    target, tokenizer = load_target(config.target, dtype=config.dtype, **kwargs)
    text = target.config.get_text_config()
    defaults = defaults_for(sum(p.numel() for p in target.parameters()), text.vocab_size)

    # 1-3: regenerate, train, learning curve (skipped when the pipeline finished before)
    pipeline_file = os.path.join(config.output, "pipeline.json")
    if not os.path.isfile(pipeline_file):
        eval_items = build_items(tokenizer, target, load_eval_prompts("mt-bench", limit=config.eval_prompts, offset=20),
                                 config.eval_new_tokens)
        regeneration = RegenerationConfig(**{"num_prompts": 100_000, "max_new_tokens": config.max_new_tokens,
                                             "batch_size": defaults.regen_batch_size, "seed": config.seed,
                                             **(regeneration_overrides or {})})
        pipeline = PipelineConfig(**{"minutes": config.hours * 60.0, "regeneration": regeneration,
                                     "drafter_layers": defaults.drafter_layers, "draft_vocab": defaults.draft_vocab,
                                     "batch_size": defaults.batch_size, "lr": defaults.lr, "eval_new_tokens": config.eval_new_tokens,
                                     "bf16": target.dtype == torch.bfloat16, "seed": config.seed, **(pipeline_overrides or {})})
        run_pipeline(target, tokenizer, config.output, pipeline, eval_items, config.target, progress=progress)
    with open(pipeline_file) as f:
        done = json.load(f)
    folder = done["result"]["drafter_folder"]

    # 4: the round policy's calibration on other held-out turns
    from ..assistant import JetSpecAssistant

    assistant = JetSpecAssistant.from_pretrained(folder, dtype=torch.float32)
    if not assistant.acceptance_model.calibrated:
        drafter = assistant.drafter.to(target.device)
        calib_items = build_items(tokenizer, target, load_eval_prompts("mt-bench", limit=config.calibration_prompts,
                                                                      offset=20 + config.eval_prompts), config.eval_new_tokens)
        per_item = record_acceptance(target, drafter, calib_items, config.eval_new_tokens, progress=progress)
        model = calibrate_acceptance(per_item, num_jacobi_passes=drafter.drafting_config.num_jacobi_passes,
                                     budget=drafter.drafting_config.budget, prompts=["mt-bench"])
        model.save(folder)
        calibration_rounds = model.num_rounds
    else:
        calibration_rounds = assistant.acceptance_model.num_rounds

    # 5: the card and the record
    result = done["result"]
    record = {
        "command": f"hf-jetspec train --target {config.target} --output {config.output} --hours {config.hours}",
        "target": config.target, "dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device),
        "defaults": asdict(defaults), "regenerated_sequences": result["regenerated_sequences"],
        "generated_tokens": result["generated_tokens"], "regenerate_seconds": result["regenerate_seconds"],
        "train_steps": result["train_steps"], "train_seconds": result["train_seconds"], "curve": result["curve"],
        "calibration_rounds": calibration_rounds,
        "wall_hours": round((time.perf_counter() - start) / 3600 + _previous_hours(record_path), 4),
    }
    write_card(folder, record)
    with open(record_path, "w") as f:
        json.dump(record, f, indent=1)
    return record


def _previous_hours(record_path: str) -> float:
    """Wall hours an earlier, interrupted or finished, run of the same command already spent."""
    if not os.path.isfile(record_path):
        return 0.0
    with open(record_path) as f:
        return float(json.load(f).get("wall_hours", 0.0))
