"""What a target forward of B rows x k tokens costs on this machine: the prices batched rounds choose
their width from.

    python benchmarks/batch_forward_cost.py --output benchmarks/results/batch_forward_cost_smollm2.json

Measured with :func:`hf_jetspec.policy.cost_model.profile_forward_cost`, the function a batched
``generate`` call profiles its row buckets with (a random prefix of ``--context`` tokens per row in a
DynamicCache, every size warmed once, then the sizes interleaved ``--repeats`` times, the median kept).
Printed as a table of milliseconds and of each cell's ratio to one row's one-token forward.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--sizes", default="1,8,16,32")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    from hf_jetspec.policy.cost_model import profile_forward_cost
    from hf_jetspec.tools.environment import describe_environment
    from hf_jetspec.tools.targets import load_target

    target, _ = load_target(args.target, dtype=getattr(torch, args.dtype))
    rows = [int(r) for r in args.rows.split(",")]
    sizes = [int(n) for n in args.sizes.split(",")]
    table = {}
    with torch.no_grad():
        for r in rows:
            table[r] = profile_forward_cost(target, sizes, context=args.context, repeats=args.repeats, rows=r)
    base = table[rows[0]][0]
    print(f"{args.target}, {args.dtype}, context {args.context}: ms (ratio to {rows[0]} row x {sizes[0]} token)")
    print("rows \\ tokens | " + " | ".join(str(n) for n in sizes))
    for r in rows:
        print(f"{r} | " + " | ".join(f"{1000 * s:.1f} ({s / base:.2f})" for s in table[r]))
    result = {"command": "python benchmarks/batch_forward_cost.py " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
              "target": args.target, "dtype": args.dtype, "context": args.context, "repeats": args.repeats, "sizes": sizes,
              "ms": {str(r): [round(1000 * s, 2) for s in table[r]] for r in rows}, "environment": describe_environment(target.device)}
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
