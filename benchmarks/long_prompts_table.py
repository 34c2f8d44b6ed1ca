"""The long-prompt tables from the saved bench JSONs: per dtype, size and kind (chat / code edits).

    python benchmarks/long_prompts_table.py benchmarks/results/long_*_smollm2_*.json > benchmarks/results/long_prompts_smollm2.md

Each JSON is one interleaved ``hf-jetspec bench --prompts long-SIZE`` run. A kind's speed is its
items' new tokens over their seconds, per method, against AR's on the same items of the same run.
Runs that recorded each generation's first delivered chunk (``first_chunk_s_per_item``) also get
the prefill's share of AR's time, the end-to-end ceiling it implies (AR's time over the prefill
alone: what a method with free decoding would reach) and the decoding speedup (tokens after the
first chunk over the time after it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hf_jetspec.tools.bench import decode_rate  # noqa: E402


def kind_rows(result: dict) -> list[dict]:
    items = result["config"]["items"]
    methods = result["methods"]
    rows = []
    for kind in ("all", "chat", "code"):
        picked = [i for i, item in enumerate(items) if kind == "all" or item.startswith(f"long-{kind}-")]
        if not picked:
            continue
        speed, decode = {}, {}
        for name, m in methods.items():
            tokens = [len(m["outputs"][i]) for i in picked]
            seconds = [m["seconds_per_item"][i] for i in picked]
            speed[name] = sum(tokens) / sum(seconds)
            if "first_chunk_s_per_item" in m:
                first_s = [m["first_chunk_s_per_item"][i] for i in picked]
                first_tokens = [m["first_chunk_tokens_per_item"][i] for i in picked]
                decode[name] = decode_rate(tokens, seconds, first_tokens, first_s)
        row = {"dtype": result["config"]["dtype"], "set": result["config"]["prompts"], "kind": kind, "prompts": len(picked),
               "ar_tok_s": speed["ar"]}
        if "ar" in decode:
            ar_first = sum(methods["ar"]["first_chunk_s_per_item"][i] for i in picked)
            ar_total = sum(methods["ar"]["seconds_per_item"][i] for i in picked)
            row["prefill_share"] = ar_first / ar_total
            row["ceiling"] = ar_total / ar_first
        for name in methods:
            if name != "ar":
                row[name] = speed[name] / speed["ar"]
                row[f"{name}_tau"] = methods[name].get("tau")
                row[f"{name}_ties"] = methods[name].get("tie_explained_vs_ar")
                row[f"{name}_exact"] = methods[name].get("exact_match_vs_ar")
                if name in decode and "ar" in decode:
                    row[f"{name}_decode"] = decode[name] / decode["ar"]
        rows.append(row)
    return rows


def default_and_trees(r: dict, suffix: str = "") -> tuple:
    """(the defaults' figure, the tree rounds' figure or None). The defaults run chain rounds past
    1,024 prompt tokens: ``jetspec-chain`` where a run measured both, else ``jetspec`` (runs from
    before tree rounds existed ran chains)."""
    if f"jetspec-chain{suffix}" in r:
        return r[f"jetspec-chain{suffix}"], r.get(f"jetspec{suffix}")
    return r.get(f"jetspec{suffix}"), None


def _x(value, bold: bool = False) -> str:
    if value is None:
        return "-"
    return f"**{value:.2f}x**" if bold else f"{value:.2f}x"


def main(paths: list[str]) -> None:
    rows = []
    for path in paths:
        rows += kind_rows(json.loads(Path(path).read_text()))
    rows.sort(key=lambda r: (r["dtype"], int(r["set"].split("-")[-1][:-1]), ("all", "chat", "code").index(r["kind"])))
    print("| dtype | set | prompts | AR tok/s | prompt lookup | jetspec (defaults: chain rounds) | tree rounds | defaults / prompt lookup | "
          "identical to AR (PL / jetspec) | divergences tie-explained |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        label = r["set"] if r["kind"] == "all" else f"{r['set']}, {r['kind']}"
        pl = r.get("prompt-lookup")
        js, trees = default_and_trees(r)
        ours = "jetspec-chain" if "jetspec-chain" in r else "jetspec"

        def share(key):  # None: nothing to explain (no divergence)
            value = r.get(key)
            return "-" if value is None else f"{value:.2f}"

        ties = "" if r["kind"] != "all" else f"{share('prompt-lookup_ties')} / {share(ours + '_ties')}"
        exact = "" if r["kind"] != "all" else f"{share('prompt-lookup_exact')} / {share(ours + '_exact')}"
        print(f"| {r['dtype']} | {label} | {r['prompts']} | {r['ar_tok_s']:.1f} | {_x(pl)} | {_x(js, True)} | {_x(trees)} | {js / pl:.2f} | {exact} | {ties} |")
    decoded = [r for r in rows if "ceiling" in r]
    if decoded:
        print()
        print("| dtype | set | AR's time in the prefill | end-to-end ceiling | prompt lookup, decoding | jetspec (defaults), decoding | tree rounds, decoding |")
        print("|---|---|---|---|---|---|---|")
        for r in decoded:
            label = r["set"] if r["kind"] == "all" else f"{r['set']}, {r['kind']}"
            js, trees = default_and_trees(r, "_decode")
            print(f"| {r['dtype']} | {label} | {100 * r['prefill_share']:.0f}% | {r['ceiling']:.2f}x | {_x(r.get('prompt-lookup_decode'))} | "
                  f"{_x(js, True)} | {_x(trees)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
