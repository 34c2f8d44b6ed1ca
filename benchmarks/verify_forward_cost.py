"""What a verification forward of n tokens costs over a long cache, with transformers' SDPA path and
with :mod:`hf_jetspec.generation.gqa_attention` (grouped-query attention without copying the cache).

    python benchmarks/verify_forward_cost.py --output benchmarks/results/verify_forward_cost_smollm2.json

Per dtype and context: a random prefix of that many tokens fills a DynamicCache, then forwards of
1, 2, 4 and 16 tokens (with the 2-D attention mask ``generate`` passes) are timed, the two attention
paths taking turns; the cache is cropped back after each. Reported: the median ms of each, and
whether the logits of the two paths are identical.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--contexts", default="2048,8000")
    parser.add_argument("--sizes", default="1,2,4,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    from transformers import DynamicCache

    from hf_jetspec.tools.environment import describe_environment
    from hf_jetspec.generation.gqa_attention import masked_gqa
    from hf_jetspec.tools.targets import load_target

    sizes = [int(n) for n in args.sizes.split(",")]
    result = {"command": "python benchmarks/verify_forward_cost.py " + " ".join(argv or __import__("sys").argv[1:]),
              "target": args.target, "repeats": args.repeats, "rows": []}
    for dtype in args.dtypes.split(","):
        target, _ = load_target(args.target, dtype=dtype)
        result.setdefault("environment", describe_environment(target.device))
        vocab = target.config.vocab_size
        for context in [int(c) for c in args.contexts.split(",")]:
            gen = torch.Generator().manual_seed(0)
            cache = DynamicCache(config=target.config)
            with torch.no_grad():
                target(input_ids=torch.randint(0, vocab, (1, context), generator=gen), cache=cache, use_cache=True)
            row = {"dtype": dtype, "context": context}
            for n in sizes:
                block = torch.randint(0, vocab, (1, n), generator=gen)
                mask = torch.ones(1, context + n, dtype=torch.long)
                times = {"sdpa": [], "gqa": []}
                logits = {}
                for rep in range(args.repeats + 1):
                    for path in ("sdpa", "gqa") if rep % 2 == 0 else ("gqa", "sdpa"):
                        cache.crop(context - cache.get_seq_length()) if cache.get_seq_length() > context else None
                        t0 = time.perf_counter()
                        with torch.no_grad():
                            if path == "gqa":
                                with masked_gqa(target):
                                    out = target(input_ids=block, cache=cache, use_cache=True, attention_mask=mask)
                            else:
                                out = target(input_ids=block, cache=cache, use_cache=True, attention_mask=mask)
                        if rep:  # the first of each is a warm-up
                            times[path].append(time.perf_counter() - t0)
                        logits[path] = out.logits
                row[n] = {"sdpa_ms": round(1000 * statistics.median(times["sdpa"]), 2),
                          "gqa_ms": round(1000 * statistics.median(times["gqa"]), 2),
                          "identical_logits": bool(torch.equal(logits["sdpa"], logits["gqa"]))}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
        del target
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
