"""Acceptance length (tau) of several drafter folders on the same held-out prompts, side by side.

    python benchmarks/drafter_tau.py --drafters hub_cards/jetspec-smollm2-135m,runs/smollm2-int8 \
        --prompts gsm8k:100,humaneval:100,mt-bench:60 --limit 10 --output benchmarks/results/drafter_tau.json

For comparing two storages or two trainings of one drafter. ``FOLDER@int8`` drafts with that folder
in int8 arithmetic (``DraftingConfig(int8=True)``), e.g. ``--drafters D,D@int8`` for what int8 drafting
costs in acceptance. tau is the drafter's alone (a full block
every round, the round policy off), so it needs no timing and may run on a busy machine; every
output is checked token for token against the target's own greedy output (use the float32 target
for that to be a strict check).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.tools.bench import build_items
from hf_jetspec.training.drafter_tau import acceptance_on_items
from hf_jetspec.data import load_eval_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafters", required=True, help="comma list of drafter folders, each optionally FOLDER@int8")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prompts", default="gsm8k:100,humaneval:100,mt-bench:60",
                    help="comma list of SET:OFFSET; the offsets skip the prompts the bench uses")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--jacobi-passes", type=int, default=1)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float32"], help="the target's dtype")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    target, tok = load_target(args.target, dtype=args.dtype)
    specs = args.drafters.split(",")
    for spec in specs:
        if spec.partition("@")[2] not in ("", "int8"):
            raise SystemExit(f"{spec!r}: the only drafter flag is @int8")
    drafters = {spec: JetSpecDrafter.from_pretrained(spec.partition("@")[0]).eval() for spec in specs}
    for drafter in drafters.values():
        drafter.attach_target(target)
    rows = []
    for spec in args.prompts.split(","):
        name, _, offset = spec.partition(":")
        prompts = load_eval_prompts(name, limit=args.limit, offset=int(offset or 0))
        if not prompts:
            raise SystemExit(f"{spec!r} selects no prompts (the offset is past the end of the set)")
        items = build_items(tok, target, prompts, args.max_new_tokens)
        refs: dict = {}
        row = {"prompts": spec, "items": len(items)}
        for spec, drafter in drafters.items():
            r = acceptance_on_items(target, drafter, items, args.max_new_tokens, refs, num_jacobi_passes=args.jacobi_passes,
                                    budget=args.budget, policy=False, int8=spec.endswith("@int8"))
            row[spec] = r | {"divergent": [d["item"] for d in r["divergent"]]}  # the items; data_scaling.py scores them
        rows.append(row)
        print(json.dumps(row))
    out = {"config": vars(args), "rows": rows}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
