"""The long-prompt tables from the saved bench JSONs: per dtype, size and kind (chat / code edits).

    python benchmarks/long_prompts_table.py benchmarks/results/long_*_smollm2_*.json > benchmarks/results/long_prompts_smollm2.md

Each JSON is one interleaved ``hf-jetspec bench --prompts long-SIZE`` run. A kind's speed is its
items' new tokens over their seconds, per method, against AR's on the same items of the same run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def kind_rows(result: dict) -> list[dict]:
    items = result["config"]["items"]
    methods = result["methods"]
    rows = []
    for kind in ("all", "chat", "code"):
        picked = [i for i, item in enumerate(items) if kind == "all" or item.startswith(f"long-{kind}-")]
        if not picked:
            continue
        speed = {}
        for name, m in methods.items():
            tokens = sum(len(m["outputs"][i]) for i in picked)
            seconds = sum(m["seconds_per_item"][i] for i in picked)
            speed[name] = tokens / seconds
        row = {"dtype": result["config"]["dtype"], "set": result["config"]["prompts"], "kind": kind, "prompts": len(picked),
               "ar_tok_s": speed["ar"]}
        for name in methods:
            if name != "ar":
                row[name] = speed[name] / speed["ar"]
                row[f"{name}_tau"] = methods[name].get("tau")
                row[f"{name}_ties"] = methods[name].get("tie_explained_vs_ar")
                row[f"{name}_exact"] = methods[name].get("exact_match_vs_ar")
        rows.append(row)
    return rows


def main(paths: list[str]) -> None:
    rows = []
    for path in paths:
        rows += kind_rows(json.loads(Path(path).read_text()))
    rows.sort(key=lambda r: (r["dtype"], int(r["set"].split("-")[-1][:-1]), ("all", "chat", "code").index(r["kind"])))
    print("| dtype | set | prompts | AR tok/s | prompt lookup | jetspec | jetspec / prompt lookup | identical to AR (PL / jetspec) | divergences tie-explained |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        label = r["set"] if r["kind"] == "all" else f"{r['set']}, {r['kind']}"
        pl, js = r.get("prompt-lookup"), r.get("jetspec")
        def share(key):  # None: nothing to explain (no divergence)
            value = r.get(key)
            return "-" if value is None else f"{value:.2f}"

        ties = "" if r["kind"] != "all" else f"{share('prompt-lookup_ties')} / {share('jetspec_ties')}"
        exact = "" if r["kind"] != "all" else f"{share('prompt-lookup_exact')} / {share('jetspec_exact')}"
        print(f"| {r['dtype']} | {label} | {r['prompts']} | {r['ar_tok_s']:.1f} | {pl:.2f}x | **{js:.2f}x** | {js / pl:.2f} | {exact} | {ties} |")


if __name__ == "__main__":
    main(sys.argv[1:])
