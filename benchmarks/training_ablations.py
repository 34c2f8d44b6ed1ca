"""Equal-budget training ablations of the drafter: labels, block inputs, attention.

    python benchmarks/training_ablations.py --steps 80 --output benchmarks/results/training_ablations.json

Trains one drafter per variant with the same recipe, data, seed and number of steps (so the same
target forwards and sequences), each resumable, then measures greedy tau on held-out GSM8K prompts
at J0, J1, J3 (budget 16) and at budget 32 (J1):

* labels: corpus, erase, alr, alr+ira (Jacobi-forcing inputs, causal);
* inputs: jacobi vs fully-noised mask blocks (corpus labels, the seed's Table 4 control);
* attention: causal vs bidirectional (corpus labels, Jacobi inputs).

Training steps are skipped for variants whose final folder exists. tau needs no timing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

VARIANTS = {
    "corpus": ["--labels", "corpus", "--inputs", "jacobi"],
    "erase": ["--labels", "erase", "--inputs", "jacobi"],
    "alr": ["--labels", "alr", "--inputs", "jacobi"],
    "alr+ira": ["--labels", "alr+ira", "--inputs", "jacobi"],
    "mask-noised": ["--labels", "corpus", "--inputs", "mask"],
    "bidirectional": ["--labels", "corpus", "--inputs", "jacobi", "--attention", "bidirectional"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--runs", default="runs/ablations")
    ap.add_argument("--num-sequences", type=int, default=1000)
    ap.add_argument("--eval-limit", type=int, default=8)
    ap.add_argument("--eval-offset", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--passes", default="0,1,3", help="Jacobi passes measured at budget 16")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    here = Path(__file__).resolve().parents[1]
    common = ["--init-layers-from-target", "--draft-vocab-from-sharegpt", "8192", "--num-sequences", str(args.num_sequences),
              "--max-steps", str(args.steps), "--save-steps", str(args.steps), "--blocks-per-sequence", "32", "--lr", "1.5e-3"]
    names = [v for v in args.variants.split(",") if v]
    cost = {}
    for name in names:
        out = Path(args.runs) / name
        if (out / "final" / "config.json").is_file():
            continue
        t0 = time.time()
        cmd = [sys.executable, str(here / "examples" / "train_drafter.py"), *VARIANTS[name], *common, "--output-dir", str(out)]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        cost[name] = time.time() - t0

    from hf_jetspec import JetSpecDrafter, load_target
    from hf_jetspec.tools.bench import acceptance_on_items, build_items
    from hf_jetspec.tools.data import load_eval_prompts

    target, tok = load_target("smollm2-135m")
    items = build_items(tok, target, load_eval_prompts("gsm8k", limit=args.eval_limit, offset=args.eval_offset), args.max_new_tokens)
    refs: dict = {}
    rows = {}
    for name in names:
        drafter = JetSpecDrafter.from_pretrained(str(Path(args.runs) / name / "final"), dtype=torch.float32).eval()
        row = {"train_seconds": cost.get(name)}
        for j in [int(x) for x in args.passes.split(",")]:
            r = acceptance_on_items(target, drafter, items, args.max_new_tokens, refs, num_jacobi_passes=j, budget=16)
            row[f"tau_b16_J{j}"], row[f"exact_b16_J{j}"] = r["tau"], r["exact"]
        r = acceptance_on_items(target, drafter, items, args.max_new_tokens, refs, num_jacobi_passes=1, budget=32)
        row["tau_b32_J1"], row["exact_b32_J1"] = r["tau"], r["exact"]
        rows[name] = row
        print(name, row, flush=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"config": vars(args), "variants": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
