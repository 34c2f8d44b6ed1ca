"""What computing the final norm and LM head in fp32 costs a bf16 target (``hf-jetspec bench --fp32-head``).

    python benchmarks/fp32_head.py --target smollm2-135m --output benchmarks/results/fp32_head_cost_smollm2.json

Times forwards of 1, 8 and 16 tokens over a 64-token KV cache with the bf16 head, then with the
fp32 head, alternating three times (median per configuration). Run it alone on the machine. What
the fp32 head does to divergences is measured by the bench itself (``--fp32-head``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_jetspec import load_target
from hf_jetspec.tools.numerics import upcast_head
from hf_jetspec.policy import profile_forward_cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    sizes = [1, 8, 16]
    plain, _ = load_target(args.target, dtype="bfloat16")
    fp32_head, _ = load_target(args.target, dtype="bfloat16")
    upcast_head(fp32_head)
    runs = {"bf16_head": [], "fp32_head": []}
    for _ in range(args.rounds):
        runs["bf16_head"].append(profile_forward_cost(plain, sizes, repeats=5))
        runs["fp32_head"].append(profile_forward_cost(fp32_head, sizes, repeats=5))
    med = {k: [sorted(r[i] for r in v)[len(v) // 2] for i in range(len(sizes))] for k, v in runs.items()}
    result = {
        "target": args.target,
        "sizes": sizes,
        "ms": {k: [round(1000 * x, 2) for x in v] for k, v in med.items()},
        "fp32_head_cost_ratio": [f / b for f, b in zip(med["fp32_head"], med["bf16_head"])],
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
