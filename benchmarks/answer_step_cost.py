"""What a training step costs with the target's features computed in the step (the answer corpus) and
read from a feature cache, side by side in one run on the same batches.

    python benchmarks/answer_step_cost.py --answers hub_cards/jetspec-smollm2-135m-answers --sequences 64 --steps 12 \
        --output benchmarks/results/answer_step_cost_smollm2.json

The first ``--sequences`` answers of the corpus (prompt + answer ids) are written once as a feature
cache (read-layer states in bfloat16, top-64 log-probabilities: the cache ``examples/regenerate.py``
writes without ``--answers``); its bytes per sequence are recorded beside the corpus's. Then each batch
of 4 sequences is stepped once per path, in rotating order, from the same weights (the shipped
drafter's, gradients zeroed, no optimizer step; bf16 autocast, 32 blocks per sequence):

- ``features cached``: the states and top-k labels read from the cache;
- ``features in the step``: a no-grad target forward over the batch gives the states and the full
  distributions (what ``examples/train_drafter.py --answers`` does).

The result gives the median milliseconds per step of each path, the target forward's share of the
online step, and the losses (the cached path's labels are the target's law truncated to its top 64,
so they differ slightly).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.tools.environment import describe_environment
from hf_jetspec.training import FeatureCacheCollator, FeatureCacheDataset, JetSpecTrainer, JetSpecTrainingArguments
from hf_jetspec.training.answer_corpus import AnswerCorpusDataset
from hf_jetspec.training.corpus import CorpusCollator
from hf_jetspec.training.feature_cache import build_feature_cache

ROOT = Path(__file__).resolve().parent.parent


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--answers", required=True)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default="hub_cards/jetspec-smollm2-135m")
    ap.add_argument("--sequences", type=int, default=64)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--prompt-cache", default="runs/answer-prompts")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    torch.manual_seed(0)
    target, tokenizer = load_target(args.target, dtype="bfloat16")
    drafter = JetSpecDrafter.from_pretrained(args.drafter, dtype=torch.float32)
    drafter.attach_target(target, follow_dtype=False)
    answers = AnswerCorpusDataset(args.answers, tokenizer, prompt_cache=args.prompt_cache, limit=args.sequences)
    items = [answers[i] for i in range(len(answers))]
    tmp = tempfile.mkdtemp(prefix="answer-step-cost-")
    t0 = time.perf_counter()
    build_feature_cache(target, items, list(drafter.config.target_layer_ids), tmp, top_k=64, batch_size=4, progress=False,
                        states_dtype=torch.bfloat16)
    cache_build_s = time.perf_counter() - t0
    cached = FeatureCacheDataset(tmp, layer_ids=drafter.config.target_layer_ids)
    targs = dict(output_dir=str(ROOT / "runs" / "answer_step_cost"), per_device_train_batch_size=4, report_to=[], bf16=True,
                 use_cpu=True, dataloader_num_workers=0, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                 blocks_per_sequence=32, block_inputs="jacobi", noise_seed=0)
    paths = {
        "features cached": (JetSpecTrainer(model=drafter, args=JetSpecTrainingArguments(**targs), target=target, train_dataset=cached,
                                           data_collator=FeatureCacheCollator(0)), FeatureCacheCollator(0), cached),
        "features in the step": (JetSpecTrainer(model=drafter, args=JetSpecTrainingArguments(**targs), target=target,
                                                train_dataset=answers, data_collator=CorpusCollator(0)), CorpusCollator(0), answers),
    }
    forward_ms = []
    original = target.forward

    def timed_forward(*a, **k):
        t = time.perf_counter()
        out = original(*a, **k)
        forward_ms.append((time.perf_counter() - t) * 1e3)
        return out

    times = {name: [] for name in paths}
    losses = {name: [] for name in paths}
    drafter.train()
    n = len(answers)
    for step in range(args.steps + 1):  # step 0 warms up and is not counted
        rows = [(4 * step + i) % n for i in range(4)]
        names = list(paths)
        order = names[step % len(names):] + names[:step % len(names)]
        for name in order:
            trainer, collate, data = paths[name]
            trainer.current_gradient_accumulation_steps = 1
            batch = collate([data[r] for r in rows])
            trainer._noise = torch.Generator().manual_seed(step)  # the same anchors and noise for both paths
            target.forward = timed_forward if name == "features in the step" else original
            t = time.perf_counter()
            loss = trainer.training_step(drafter, batch)
            elapsed = time.perf_counter() - t
            target.forward = original
            drafter.zero_grad(set_to_none=True)
            if step:
                times[name].append(elapsed * 1e3)
                losses[name].append(float(loss))
    ms = {name: statistics.median(v) for name, v in times.items()}
    fwd = statistics.median(forward_ms[1:]) if len(forward_ms) > 1 else None
    corpus_bytes = answers.manifest.bytes * len(answers) / max(answers.manifest.rows, 1)
    result = {
        "command": "python " + " ".join(sys.argv),
        "environment": describe_environment(torch.device("cpu")),
        "recipe": f"{args.drafter} (fp32 weights, bf16 autocast), batch 4, 32 blocks per sequence; target {args.target} bf16",
        "sequences": n, "steps": args.steps,
        "ms_per_step_median": ms, "ms_per_step": times, "losses": losses,
        "target_forward_ms_median": fwd,
        "online_over_cached": ms["features in the step"] / ms["features cached"],
        "cache_build_seconds": round(cache_build_s, 2),
        "bytes_per_sequence": {"feature cache": folder_bytes(tmp) / n, "answer corpus": corpus_bytes / n},
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("ms_per_step_median", "target_forward_ms_median", "online_over_cached",
                                             "bytes_per_sequence")}, indent=1))


if __name__ == "__main__":
    main()
