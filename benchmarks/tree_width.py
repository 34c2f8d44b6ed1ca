"""tau of full best-first trees by candidates per depth (``tree_top_k``), against the chain at the same node budget.

    python benchmarks/tree_width.py --prompts mt-bench --limit 5 --budget 8 --top-k 2,3,4 --max-new-tokens 128 \
        --output benchmarks/results/tree_width_smollm2_mt-bench_budget8.json

No timing (tau and exactness only), so it may run beside other work. Every config verifies a full
block or tree every round (``policy=False``); outputs are checked against plain greedy decoding.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_jetspec import load_target
from hf_jetspec.tools.bench import acceptance_on_items, build_items
from hf_jetspec.tools.data import load_eval_prompts
from hf_jetspec.tools.targets import load_drafter_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=None, help="drafter folder (default: the one shipped for the target)")
    ap.add_argument("--prompts", default="mt-bench")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--top-k", default="2,3,4")
    ap.add_argument("--branches", type=int, default=0, help="tree_branches of every tree config")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    target, tok = load_target(args.target, dtype=args.dtype)
    drafter, what = load_drafter_for(target, args.target, args.drafter)
    items = build_items(tok, target, load_eval_prompts(args.prompts, limit=args.limit), args.max_new_tokens)
    refs: dict = {}
    common = dict(budget=args.budget, policy=False, num_jacobi_passes=1)
    rows = [{"config": "chain", **acceptance_on_items(target, drafter, items, args.max_new_tokens, refs, tree=None, **common)}]
    print(rows[-1], flush=True)
    for k in [int(x) for x in args.top_k.split(",")]:
        r = acceptance_on_items(target, drafter, items, args.max_new_tokens, refs, tree="auto", tree_top_k=k,
                                tree_branches=min(args.branches, k - 1), **common)
        rows.append({"config": f"tree top-{k}" + (f" branches {min(args.branches, k - 1)}" if args.branches else ""), **r,
                     "tau_vs_chain": r["tau"] / rows[0]["tau"]})
        print(rows[-1], flush=True)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "drafter": what, "items": len(items), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
