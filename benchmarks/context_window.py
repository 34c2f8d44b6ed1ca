"""The drafter alone on long prompts, by how many verified positions it reads (``context_window``).

    python benchmarks/context_window.py --output benchmarks/results/context_window_smollm2.json

A drafter attends to every verified position, so its pass and its cache fill grow with the prompt
(``benchmarks/round_profile.py`` measures them by context length). A window bounds both; this script
measures what it does to acceptance: tau with full blocks (policy off, the drafter's own J passes)
on the long-prompt sets, per window, in one process, against the same greedy references.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", default=None, help="drafter folder (default: the target's shipped drafter)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--sets", default="long-2k,long-4k")
    parser.add_argument("--windows", default="none,256,512,1024")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    from hf_jetspec.tools.bench import build_items
    from hf_jetspec.tools.environment import describe_environment
    from hf_jetspec.training.drafter_tau import acceptance_on_items
    from hf_jetspec.data import load_eval_prompts
    from hf_jetspec.tools.targets import load_drafter_for, load_target

    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter, what = load_drafter_for(target, args.target, args.drafter)
    windows = [None if w == "none" else int(w) for w in args.windows.split(",")]
    result = {"command": "python benchmarks/context_window.py " + " ".join(argv or __import__("sys").argv[1:]),
              "target": args.target, "drafter": what, "dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
              "drafting": "policy off, full blocks, the drafter's own Jacobi passes", "environment": describe_environment(target.device), "rows": []}
    for name in args.sets.split(","):
        items = build_items(tokenizer, target, load_eval_prompts(name, tokenizer=tokenizer), args.max_new_tokens)
        references: dict = {}
        for window in windows:
            t0 = time.perf_counter()
            r = acceptance_on_items(target, drafter, items, args.max_new_tokens, references, policy=False, context_window=window)
            row = {"set": name, "prompts": len(items), "context_window": window, "tau": round(r["tau"], 4), "rounds": r["rounds"],
                   "identical_to_ar": r["exact"], "seconds": round(time.perf_counter() - t0, 1)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
