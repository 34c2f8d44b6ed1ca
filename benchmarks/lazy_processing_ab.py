"""Sampled rounds with the target's logits processors applied lazily, against every row, end to end.

    python benchmarks/lazy_processing_ab.py --target smollm2-135m --prompts mt-bench --limit 20 \
        --output benchmarks/results/lazy_processing_smollm2_mt-bench_t0.7.json

Under sampling, transformers applies the target's processors (temperature, top-k, top-p: a sort of
the whole vocabulary per row) to every row of a verified block before verification. JetSpec's chain
rounds defer them to the verifier, which processes only the rows it reads, through the first
rejection (``seam._DeferredProcessors``); tree rounds (the defaults at T <= 0.5) process a node's
row when verification first reads it (``tree_decoding.ProcessedRows``), only along the accepted
path. This script runs the shipped drafter with its defaults on each item twice, lazily and with
every row processed (``row_pure`` answering no, so every row is processed as it would be without
hf_jetspec), alternating which goes first, and reports tokens per second, tau and the verification
milliseconds per round of each. The two sides follow the same law; their sampled texts differ where
the round policy, which reads the measured round times, chooses differently, so tau is reported
beside the speed.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import hf_jetspec.generation.candidate_generator as candidate_generator
import hf_jetspec.generation.tree_decoding as tree_decoding
from hf_jetspec import load_target
from hf_jetspec.policy import OutputMemory
from hf_jetspec.tools.bench import build_items
from hf_jetspec.tools.environment import describe_environment
from hf_jetspec.data import load_eval_prompts
from hf_jetspec.tools.targets import load_drafter_for
from hf_jetspec.assistant import assistant_for


def run(target, drafter, ids, max_new_tokens, temperature, top_p, seed) -> dict:
    torch.manual_seed(seed)
    t = time.perf_counter()
    with torch.no_grad():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, do_sample=True,
                              temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
    seconds = time.perf_counter() - t
    stats = drafter.generation_stats
    return {"tokens": out.shape[1] - ids.shape[1], "seconds": seconds, "rounds": stats.rounds,
            "accepted": sum(stats.accepted_lengths), "verify_s": stats.verify_time_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=None, help="a drafter folder (default: the one shipped for the target)")
    ap.add_argument("--prompts", default="mt-bench")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter, _ = load_drafter_for(target, args.target, args.drafter)
    items = build_items(tokenizer, target, load_eval_prompts(args.prompts, limit=args.limit, tokenizer=tokenizer),
                        args.max_new_tokens)
    row_pure = candidate_generator.row_pure
    sides = {"lazy": row_pure, "every_row": lambda processors: False}
    modules = (candidate_generator, tree_decoding)  # chain rounds and tree rounds (the defaults at T <= 0.5)
    # each side keeps its own earlier outputs, as `hf-jetspec bench` gives each method its own: a side
    # must not draft the other's answer to the same prompt and seed from memory
    memories = {side: OutputMemory() for side in sides}
    run(target, drafter, items[0][1], 16, args.temperature, args.top_p, 0)  # warm-up
    totals = {name: {"tokens": 0, "seconds": 0.0, "rounds": 0, "accepted": 0, "verify_s": 0.0} for name in sides}
    for k, (name_k, ids) in enumerate(items):
        order = list(sides) if k % 2 == 0 else list(sides)[::-1]
        for side in order:
            for module in modules:
                module.row_pure = sides[side]
            assistant_for(drafter).output_memory = memories[side]
            try:
                rec = run(target, drafter, ids, args.max_new_tokens, args.temperature, args.top_p, seed=k)
            finally:
                for module in modules:
                    module.row_pure = row_pure
            for key, value in rec.items():
                totals[side][key] += value
        print(name_k, {side: round(totals[side]["tokens"] / totals[side]["seconds"], 2) for side in sides}, flush=True)
    summary = {}
    for side, t in totals.items():
        summary[side] = {"tokens_per_s": round(t["tokens"] / t["seconds"], 3), "tau": round(1 + t["accepted"] / max(t["rounds"], 1), 4),
                         "rounds": t["rounds"], "verify_ms_per_round": round(1000 * t["verify_s"] / max(t["rounds"], 1), 3),
                         "tokens": t["tokens"], "seconds": round(t["seconds"], 3)}
    summary["lazy_vs_every_row"] = round(summary["lazy"]["tokens_per_s"] / summary["every_row"]["tokens_per_s"], 4)
    result = {"config": vars(args), "items": [name for name, _ in items], "results": summary,
              "environment": describe_environment(target.device)}
    print(json.dumps(summary, indent=1))
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
