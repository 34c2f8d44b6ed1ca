"""One command from a target to a drafter: ``hf-jetspec train --target NAME_OR_FOLDER --output FOLDER --hours H``.

``--hours`` is the wall time of the whole command, from its start to the verdict. Within it, it

1. regenerates: the target answers prompts of the offline training sources (evaluation overlap
   excluded), and the same forwards write the feature cache;
2. trains a drafter initialised from the target's top layers on that cache, at most four passes
   over the answers while there is time to make more (the measured scaling curve: more answers
   beat more epochs), checkpoints along the way;
3. evaluates the checkpoints' drafter-alone tau on held-out MT-Bench turns (the learning curve);
4. calibrates the round policy on rounds recorded from other held-out turns;
5. gives a verdict: the trained drafter and the drafter-free assistant, each with its defaults,
   against plain decoding on further held-out turns in one interleaved run, and says which to use;
6. writes ``drafter/``, a Hub-ready folder: weights, config, the calibration and a model card with
   the counts, the curve and the verdict.

Phases 1-3 are :func:`hf_jetspec.training.pipeline.run_pipeline` (the same call on a GPU); the
split of the budget is planned from the rates the run measures on its first batches
(:mod:`hf_jetspec.training.budget`), with the calibration and the verdict reserved from the start,
and one progress bar shows seconds against the budget with the phase and its counts. The command
overruns its budget by at most the batch or step that was running when time ran out. Run the same
command again after an interruption: a finished phase is not repeated (its files say it is done),
and an interrupted regeneration resumes after its last shard. Options a user must not get wrong
default by the target's size (:func:`defaults_for`).
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
    # held-out MT-Bench questions (two turns, so two items, each); a short budget measures fewer
    # (training.budget.held_out_counts: at most 40% of the budget, never fewer than one item each)
    eval_prompts: int = 6  # for the learning curve
    calibration_prompts: int = 6  # other questions, for the round policy's calibration
    verdict_prompts: int = 4  # further questions, for the verdict
    eval_new_tokens: int = 64
    max_new_tokens: int = 256  # per regenerated answer
    seed: int = 0

    def __post_init__(self):
        if not self.hours > 0:
            raise ValueError(f"hours must be > 0, got {self.hours}")
        if self.eval_prompts < 1 or self.calibration_prompts < 1 or self.verdict_prompts < 1:
            raise ValueError("eval_prompts, calibration_prompts and verdict_prompts must be >= 1")



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
- Wall clock in all: {record['wall_hours']} h (budget {record['budget_hours']} h).

## Verdict

{verdict_text(record['verdict'], record['command'])}

Drafter-alone tau (chains, J1, budget 16, policy off) on held-out MT-Bench turns, per checkpoint
(the training log's `train_tau_est` describes the training answers, not held-out text):

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


VERDICT_MARGIN = 1.05  # the drafter must be this much faster than the drafter-free assistant to be recommended


def measure_verdict(target, tokenizer, drafter_folder: str, items: list, max_new_tokens: int, progress: bool = False,
                    deadline: float | None = None) -> dict:
    """The trained drafter and the drafter-free assistant, each with its defaults, against plain
    decoding on ``items``, interleaved item by item as ``hf-jetspec bench`` runs methods (greedy,
    after an untimed warm-up of each). Returns each method's tokens per second, speed against plain
    decoding, tau and share of outputs identical to plain decoding's, and which of the two to use."""
    from ..assistant import DrafterFreeAssistant
    from ..drafter.modeling_drafter import JetSpecDrafter
    from .bench import BenchConfig, BenchSetup, run_methods

    drafter = JetSpecDrafter.from_pretrained(drafter_folder)
    drafter.attach_target(target)
    free = DrafterFreeAssistant.for_target(target)
    bench = BenchConfig(target="(the trained target)", methods=("ar", "jetspec", "drafter-free"), max_new_tokens=max_new_tokens,
                        warmup_tokens=8, limit=len(items))
    gen_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_k=None, top_p=None)
    setup = BenchSetup(target, tokenizer, items, gen_kwargs, {"jetspec": {"drafting_config": asdict(drafter.drafting_config)}},
                       drafter=drafter, drafter_free={"drafter-free": free})
    setup.memories["drafter-free"] = free.output_memory
    records = run_methods(setup, bench, progress=progress, deadline=deadline)
    items = items[: len(records["ar"].tokens)]  # a deadline may have cut the list
    rate = {name: sum(r.tokens) / max(sum(r.seconds), 1e-9) for name, r in records.items()}
    ar = records["ar"].outputs
    out = {"items": len(items), "max_new_tokens": max_new_tokens, "plain_tokens_per_s": round(rate["ar"], 2)}
    for name, key in (("jetspec", "drafter"), ("drafter-free", "drafter_free")):
        r = records[name]
        out[key] = {"tokens_per_s": round(rate[name], 2), "speedup_vs_plain": round(rate[name] / rate["ar"], 3),
                    "tau": round(sum(r.committed) / max(sum(r.rounds), 1), 3),
                    "identical_to_plain": round(sum(a == b for a, b in zip(r.outputs, ar)) / len(ar), 3)}
    out["ratio"] = round(out["drafter"]["tokens_per_s"] / max(out["drafter_free"]["tokens_per_s"], 1e-9), 3)
    # weights are worth carrying only for a clear gain: within VERDICT_MARGIN the simpler path wins
    out["use"] = "drafter" if out["ratio"] >= VERDICT_MARGIN else "drafter-free"
    out["margin"] = VERDICT_MARGIN
    return out


def verdict_text(verdict: dict, command: str) -> str:
    """The verdict in words, for the card and the terminal."""
    d, f = verdict["drafter"], verdict["drafter_free"]
    measured = (f"Measured on {verdict['items']} held-out MT-Bench turns ({verdict['max_new_tokens']} new tokens, greedy, one "
                f"interleaved run): plain decoding {verdict['plain_tokens_per_s']:.1f} tok/s; this drafter with its defaults "
                f"**{d['speedup_vs_plain']:.2f}x** (tau {d['tau']:.2f}); the drafter-free assistant (`DrafterFreeAssistant`, no "
                f"weights) {f['speedup_vs_plain']:.2f}x (tau {f['tau']:.2f}).")
    if verdict["use"] == "drafter":
        return f"{measured}\n\n**Use this drafter**: {verdict['ratio']:.2f}x the drafter-free assistant's speed."
    return (f"{measured}\n\n**Use the drafter-free assistant for now**: this drafter runs at {verdict['ratio']:.2f}x its speed "
            f"(a drafter is recommended from {verdict.get('margin', VERDICT_MARGIN):.2f}x). "
            f"A drafter pays from thousands of answers; add answers and training with `{command} --resume` and more hours "
            f"(it keeps the answers it has, makes more and continues this drafter).")


def run_train_command(config: TrainCommandConfig, progress: bool = True, pipeline_overrides: dict | None = None,
                      regeneration_overrides: dict | None = None, resume: bool = False) -> dict:
    """Run (or resume) the whole command within ``config.hours`` of wall time; returns the record
    written to ``train.json``. ``resume`` continues a finished run for ``config.hours`` more: more
    answers, then its drafter trained on all of them, calibrated and judged again."""
    from ..data import load_eval_prompts
    from ..policy.calibrate import calibrate_acceptance, record_acceptance
    from ..training.budget import BudgetBar, held_out_counts
    from ..training.pipeline import PipelineConfig, run_pipeline
    from ..training.regenerate import RegenerationConfig
    from .bench import build_items
    from .targets import load_target

    start = time.perf_counter()
    budget_s = config.hours * 3600.0
    deadline = start + budget_s
    bar = BudgetBar(budget_s, start, disable=not progress)
    bar.show("load", config.target)
    os.makedirs(config.output, exist_ok=True)
    record_path = os.path.join(config.output, "train.json")
    pipeline_file = os.path.join(config.output, "pipeline.json")
    init_from = None
    if resume and os.path.isfile(pipeline_file) and os.path.isfile(record_path):
        init_from = _start_next_stint(config.output)
    kwargs = {"device": config.device} if config.device else {}
    target, tokenizer = load_target(config.target, dtype=config.dtype, **kwargs)
    text = target.config.get_text_config()
    defaults = defaults_for(sum(p.numel() for p in target.parameters()), text.vocab_size)

    def held_out(first_question: int, items: int):
        """``items`` held-out turns from MT-Bench question ``first_question`` on (two turns a question)."""
        prompts = load_eval_prompts("mt-bench", limit=(items + 1) // 2, offset=first_question)
        return build_items(tokenizer, target, prompts, config.eval_new_tokens)[:items]

    # what the held-out measurements may cost: one plain generation of a held-out item prices them
    e0, c0, v0 = 20, 20 + config.eval_prompts, 20 + config.eval_prompts + config.calibration_prompts  # disjoint questions
    probe = held_out(e0, 1)[0][1].to(target.device)
    t_item = time.perf_counter()
    with torch.no_grad():
        target.generate(probe, attention_mask=torch.ones_like(probe), do_sample=False, max_new_tokens=config.eval_new_tokens)
    item_s = time.perf_counter() - t_item
    points = (pipeline_overrides or {}).get("curve_points", 4)
    counts = held_out_counts(deadline - time.perf_counter(), item_s, 2 * config.eval_prompts, points, 2 * config.calibration_prompts,
                             2 * config.verdict_prompts)

    # 1-3: regenerate, train, learning curve (skipped when the pipeline finished before)
    if not os.path.isfile(pipeline_file):
        regeneration = RegenerationConfig(**{"num_prompts": 100_000, "max_new_tokens": config.max_new_tokens,
                                             "batch_size": defaults.regen_batch_size, "seed": config.seed,
                                             **(regeneration_overrides or {})})
        pipeline = PipelineConfig(**{"minutes": config.hours * 60.0, "regeneration": regeneration,
                                     "drafter_layers": defaults.drafter_layers, "draft_vocab": defaults.draft_vocab,
                                     "batch_size": defaults.batch_size, "lr": defaults.lr, "eval_new_tokens": config.eval_new_tokens,
                                     "bf16": target.dtype == torch.bfloat16, "seed": config.seed,
                                     "reserve_generations": 1.5 * counts.calibration_items + 4.5 * counts.verdict_items + 1.0,
                                     **(pipeline_overrides or {}), "curve_points": counts.curve_points})
        run_pipeline(target, tokenizer, config.output, pipeline, held_out(e0, counts.eval_items), config.target, progress=progress,
                     start=start, bar=bar, init_from=init_from)
    with open(pipeline_file) as f:
        done = json.load(f)
    folder = done["result"]["drafter_folder"]
    item_s = done["result"].get("item_seconds") or item_s

    # 4: the round policy's calibration on other held-out turns, as many as the budget leaves beside the verdict
    from ..assistant import JetSpecAssistant

    assistant = JetSpecAssistant.from_pretrained(folder, dtype=torch.float32)
    if not assistant.acceptance_model.calibrated:
        drafter = assistant.drafter.to(target.device)
        spare = deadline - time.perf_counter() - (4.5 * counts.verdict_items + 1.0) * item_s
        n = max(1, min(counts.calibration_items, int(spare / (1.5 * item_s)) if item_s > 0 else counts.calibration_items))
        bar.show("calibrate", f"{n} held-out items")
        per_item = record_acceptance(target, drafter, held_out(c0, n), config.eval_new_tokens, progress=False)
        model = calibrate_acceptance(per_item, num_jacobi_passes=drafter.drafting_config.num_jacobi_passes,
                                     budget=drafter.drafting_config.budget, prompts=["mt-bench"])
        model.save(folder)
        calibration_rounds = model.num_rounds
    else:
        calibration_rounds = assistant.acceptance_model.num_rounds

    # 5: the verdict, on further held-out turns (fewer if the budget is short, never none)
    previous = json.loads(open(record_path).read()) if os.path.isfile(record_path) else {}
    verdict = previous.get("verdict") if previous.get("drafter_folder_mtime") == _mtime(folder) else None
    if verdict is None:
        spare = deadline - time.perf_counter() - 1.0 * item_s
        n = max(1, min(counts.verdict_items, int(spare / (4.5 * item_s)) if item_s > 0 else counts.verdict_items))
        bar.show("verdict", f"plain, drafter and drafter-free on up to {n} held-out items")
        # no item starts once the budget is spent (the first always runs): the overrun is at most one item
        verdict = measure_verdict(target, tokenizer, folder, held_out(v0, n), config.eval_new_tokens, deadline=deadline)

    # 6: the card and the record
    result = done["result"]
    command = f"hf-jetspec train --target {config.target} --output {config.output} --hours {config.hours}"
    record = {
        "command": command, "target": config.target, "dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device),
        "defaults": asdict(defaults), "regenerated_sequences": result["regenerated_sequences"],
        "generated_tokens": result["generated_tokens"], "regenerate_seconds": result["regenerate_seconds"],
        "train_steps": result["train_steps"], "train_seconds": result["train_seconds"], "epochs": result.get("epochs"),
        "plan": result.get("plan", {}), "held_out": asdict(counts), "curve": result["curve"], "calibration_rounds": calibration_rounds, "verdict": verdict,
        "budget_hours": config.hours, "this_run_hours": round((time.perf_counter() - start) / 3600, 4),
        "wall_hours": round((time.perf_counter() - start) / 3600 + _previous_hours(record_path), 4),
        "stints": previous.get("stints", []) + [{"hours": config.hours, "resume": bool(resume)}],
    }
    write_card(folder, record)
    record["drafter_folder_mtime"] = _mtime(folder)
    with open(record_path, "w") as f:
        json.dump(record, f, indent=1)
    bar.show("done", f"{result['regenerated_sequences']} answers, {result['train_steps']} steps; use the {verdict['use']}")
    bar.close()
    return record


def _mtime(folder: str) -> int:
    path = os.path.join(folder, "model.safetensors")
    return os.stat(path).st_mtime_ns if os.path.isfile(path) else 0


def _start_next_stint(output: str) -> str:
    """Set a finished run aside to continue it: its drafter becomes the next stint's starting point,
    its checkpoints and pipeline record move under ``stints/``; the answers stay where they are."""
    import shutil

    stints = os.path.join(output, "stints")
    os.makedirs(stints, exist_ok=True)
    n = len([d for d in os.listdir(stints) if d.startswith("stint-")])
    here = os.path.join(stints, f"stint-{n}")
    os.makedirs(here)
    for name in ("pipeline.json", "training.json", "learning_curve.json", "checkpoints", "drafter"):
        if os.path.exists(os.path.join(output, name)):
            shutil.move(os.path.join(output, name), os.path.join(here, name))
    return os.path.join(here, "drafter")


def _previous_hours(record_path: str) -> float:
    """Wall hours an earlier, interrupted or finished, run of the same command already spent."""
    if not os.path.isfile(record_path):
        return 0.0
    with open(record_path) as f:
        return float(json.load(f).get("wall_hours", 0.0))
