"""Regeneration throughput against batch size: generated tokens per second, features included.

    python benchmarks/regeneration_throughput.py --target smollm2-135m --output benchmarks/results/regeneration_throughput_smollm2.json

Runs :func:`hf_jetspec.training.regenerate.generate_with_features` (left-padded batches, one
dynamic cache per batch, read-layer states and top-64 log-probabilities recorded at every step) on
the same regeneration prompts for each batch size, one after another in one process, and reports
generated tokens per second. Rows finish at their EOS, so a larger batch also idles on its longest
answer: that cost is part of what is measured. ``--variants`` measures each batch size once per
variant, side by side: ``padded`` (finished rows fed padding to the end of the batch) and ``drop``
(finished rows leave the batch: the default since 2026-12-04). ``--profile`` then runs one more batch
of the first batch size under ``torch.profiler`` and records where its CPU time went, per operator
and per kind (matrix products, attention, copies, the feature bookkeeping's softmax and top-k).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


OPERATOR_KINDS = {  # operator name -> kind, for the profile's summary; anything else is "other"
    "aten::mm": "matrix products", "aten::addmm": "matrix products", "aten::bmm": "matrix products",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention", "aten::_scaled_dot_product_attention_math": "attention",
    "aten::cat": "copies", "aten::copy_": "copies", "aten::index": "copies", "aten::index_select": "copies",
    "aten::_log_softmax": "log-softmax and top-k", "aten::topk": "log-softmax and top-k", "aten::argmax": "log-softmax and top-k",
}


def operator_profile(averages, seconds: float, top: int = 12) -> dict:
    """Self CPU time per operator (the ``top`` largest) and per kind (:data:`OPERATOR_KINDS`), as
    shares of the profiled total, with the batch's wall-clock seconds."""
    rows = sorted(((a.key, a.self_cpu_time_total, a.count) for a in averages), key=lambda r: -r[1])
    total = sum(r[1] for r in rows) or 1.0
    kinds: dict[str, float] = {}
    for name, self_us, _ in rows:
        kind = OPERATOR_KINDS.get(name, "other")
        kinds[kind] = kinds.get(kind, 0.0) + self_us / total
    return {"seconds": round(seconds, 2), "self_cpu_seconds": round(total / 1e6, 2),
            "kinds": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "operators": [{"name": n, "share": round(us / total, 3), "calls": c, "ms_per_call": round(us / c / 1e3, 3)}
                          for n, us, c in rows[:top]]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch-sizes", default="1,4,8,16,32")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--sources", default=None, help="comma list of regeneration sources (default: the default sources)")
    parser.add_argument("--variants", default="drop", help="comma list of padded, drop (see above); repeat the list to interleave")
    parser.add_argument("--profile", action="store_true", help="profile one more batch (see above)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    from hf_jetspec.tools.environment import describe_environment
    from hf_jetspec.drafter.configuration_drafter import default_target_layer_ids
    from hf_jetspec.tools.targets import load_target
    from hf_jetspec.training.regenerate import RegenerationConfig, generate_with_features, regeneration_prompts

    target, tokenizer = load_target(args.target, dtype=args.dtype)
    layer_ids = default_target_layer_ids(target.config.num_hidden_layers)
    sources = {"sources": tuple(args.sources.split(","))} if args.sources else {}
    prompts, _ = regeneration_prompts(tokenizer, RegenerationConfig(num_prompts=args.num_prompts, max_prompt_tokens=args.max_prompt_tokens,
                                                                    **sources))
    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
    states_dtype = torch.bfloat16 if target.dtype == torch.bfloat16 else torch.float16
    result = {"command": "python benchmarks/regeneration_throughput.py " + " ".join(argv or __import__("sys").argv[1:]),
              "target": args.target, "dtype": str(target.dtype).replace("torch.", ""), "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "environment": describe_environment(target.device), "rows": []}
    generate_with_features(target, [prompts[0].input_ids], [False], layer_ids, 4, 64, 1.0, eos_ids, 0, states_dtype)  # warm-up
    result["prompt_tokens_mean"] = round(sum(len(p.input_ids) for p in prompts) / len(prompts), 1)
    variants = {"padded": {"drop_finished": False}, "drop": {"drop_finished": True}}
    chosen = args.variants.split(",")
    if not set(chosen) <= set(variants):
        raise SystemExit(f"--variants: choose from {sorted(variants)}")
    for bsz in [int(b) for b in args.batch_sizes.split(",")]:
        for variant in chosen:
            tokens, t0 = 0, time.perf_counter()
            for b0 in range(0, len(prompts), bsz):
                batch = prompts[b0 : b0 + bsz]
                items = generate_with_features(target, [p.input_ids for p in batch], [False] * len(batch), layer_ids, args.max_new_tokens,
                                               64, 1.0, eos_ids, 0, states_dtype, **variants[variant])
                tokens += sum(int(it["input_ids"].numel()) - len(p.input_ids) for it, p in zip(items, batch))
            seconds = time.perf_counter() - t0
            row = {"batch_size": bsz, "variant": variant, "generated_tokens": tokens, "seconds": round(seconds, 2),
                   "tokens_per_s": round(tokens / seconds, 2)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    best = max(result["rows"], key=lambda r: r["tokens_per_s"])
    result["best_batch_size"] = best["batch_size"]
    n = len(dict.fromkeys(chosen))  # a variant list may repeat itself (a,b,a,b): each repetition is compared within itself
    if n > 1:
        result["speedup_vs_" + chosen[0]] = [{"batch_size": r["batch_size"], "variant": r["variant"],
                                              "speedup": round(r["tokens_per_s"] / result["rows"][i - i % n]["tokens_per_s"], 3)}
                                             for i, r in enumerate(result["rows"]) if i % n]
    if args.profile:
        bsz = int(args.batch_sizes.split(",")[0])
        batch = prompts[:bsz]
        with torch.profiler.profile() as prof:
            t0 = time.perf_counter()
            generate_with_features(target, [p.input_ids for p in batch], [False] * len(batch), layer_ids, args.max_new_tokens,
                                   64, 1.0, eos_ids, 0, states_dtype, **variants[chosen[0]])
            seconds = time.perf_counter() - t0
        result["profile"] = operator_profile(prof.key_averages(), seconds) | {"batch_size": bsz, "variant": chosen[0]}
        print(json.dumps(result["profile"]["kinds"]), flush=True)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
