"""Markdown tables of the sampling runs (``hf-jetspec bench --temperature T --top-p P``) from their JSONs.

    python benchmarks/sampling_table.py benchmarks/results/sampling_*.json > benchmarks/results/sampling.md

Per run: each method's speed against plain decoding and prompt lookup (same run), tau and the
round sources; then, for the chain methods with a drafter, the acceptance rate of each draft
position in the drafter's rounds (accepted / reached: rounds that verified the position and
accepted every position before it), the point-mass proposal against drafts sampled from q.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fmt(v, spec="{:.2f}"):
    return "-" if v is None else spec.format(v)


def run_table(result: dict) -> str:
    cfg, methods = result["config"], result["methods"]
    pl = methods.get("prompt-lookup", {}).get("tokens_per_s")
    head = (f"**{cfg['target']}, {cfg['prompts']} ({cfg['num_items']} prompts, {cfg['max_new_tokens']} new tokens), "
            f"T = {cfg['temperature']}, top-p {cfg.get('top_p', 1.0)}, {cfg['target_dtype']}**\n")
    lines = [head, "| method | tok/s | vs AR | vs prompt lookup | tau | rounds: drafter / n-gram / plain | drafts from q |",
             "|---|---|---|---|---|---|---|"]
    for name, m in methods.items():
        if "tokens_per_s" not in m:
            lines.append(f"| {name} | not run: {m.get('unavailable', '')} | | | | | |")
            continue
        src = m.get("source_counts") or {}
        sources = " / ".join(str(src.get(k, 0)) for k in ("drafter", "ngram", "plain")) if src else "-"
        lines.append(f"| {name} | {m['tokens_per_s']:.1f} | {fmt(m['speedup_vs_ar'], '{:.2f}x')} | "
                     f"{fmt(m['tokens_per_s'] / pl if pl else None, '{:.2f}x')} | {fmt(m['tau'])} | {sources} | "
                     f"{m.get('sampled_drafts', '-') if name.startswith('jetspec') else '-'} |")
    rows = []
    for name in ("jetspec", "jetspec-pointmass"):
        pa = (methods.get(name, {}).get("position_acceptance") or {}).get("drafter")
        if pa:
            rates = [f"{a / r:.2f} ({r})" if r else "-" for r, a in pa[:5]]
            rows.append(f"| {name} | " + " | ".join(rates + ["-"] * (5 - len(rates))) + " |")
    if rows:
        lines += ["", "Acceptance per draft position in drafter rounds, accepted / reached (rounds reaching it):", "",
                  "| method | 1 | 2 | 3 | 4 | 5 |", "|---|---|---|---|---|---|", *rows]
    return "\n".join(lines) + "\n"


def summary_table(results: list[dict]) -> str:
    """One row per run: speed against plain decoding of every method, and the drafter's first-position acceptance."""
    names = []
    for r in results:
        names += [n for n in r["methods"] if n != "ar" and n not in names]
    lines = ["| target | prompts | T | " + " | ".join(names) + " | drafter pos. 1: q / point mass |",
             "|" + "---|" * (len(names) + 4)]
    for r in results:
        cfg, m = r["config"], r["methods"]

        def first(name):
            pa = (m.get(name, {}).get("position_acceptance") or {}).get("drafter")
            return f"{pa[0][1] / pa[0][0]:.2f}" if pa and pa[0][0] else "-"

        cells = [fmt(m.get(n, {}).get("speedup_vs_ar"), "{:.2f}x") for n in names]
        lines.append(f"| {cfg['target']} | {cfg['prompts']} ({cfg['num_items']}) | {cfg['temperature']} | " + " | ".join(cells)
                     + f" | {first('jetspec')} / {first('jetspec-pointmass')} |")
    return "\n".join(lines) + "\n"


def main(paths: list[str]) -> None:
    results = [json.loads(Path(p).read_text()) for p in paths]
    print("Speed against plain decoding (each row one interleaved run):\n")
    print(summary_table(results))
    for path, result in zip(paths, results):
        print(f"`{Path(path).name}`\n")
        print(run_table(result))


if __name__ == "__main__":
    main(sys.argv[1:])
