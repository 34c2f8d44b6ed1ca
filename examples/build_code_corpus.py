"""Build the offline code-training corpus: a JSONL of chats from the Python standard library (and,
if asked, installed packages and ShareGPT's code answers), with no line shared with the evaluation prompts.

    python examples/build_code_corpus.py --sources stdlib,sharegpt --exclude humaneval,mt-bench \
        --output runs/code-corpus.jsonl

Writes ``{"messages": [...], "source": ...}`` per line, and beside it ``<output>.json`` with the counts
per source (kept, dropped for overlap) and each source's licence. Train or cache features on it with
``--corpus runs/code-corpus.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import random

from hf_jetspec.data import load_eval_prompts
from hf_jetspec.training.code_corpus import code_chats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", default="stdlib,sharegpt", help="comma list of stdlib, sharegpt, package:NAME")
    ap.add_argument("--exclude", default="humaneval,mt-bench", help="evaluation sets whose prompts no chat may share a line with")
    ap.add_argument("--min-line-chars", type=int, default=30)
    ap.add_argument("--shuffle-seed", type=int, default=0, help="order of the written chats (sources interleaved)")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    exclude = [turn for name in args.exclude.split(",") if name for p in load_eval_prompts(name) for turn in p.turns]
    stats: dict = {}
    rows = []
    for source in args.sources.split(","):
        rows.extend({"messages": m, "source": source} for m in code_chats([source], exclude, args.min_line_chars, stats))
    random.Random(args.shuffle_seed).shuffle(rows)
    with open(args.output, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    summary = {"sources": stats, "excluded_eval_sets": args.exclude.split(","), "excluded_prompt_turns": len(exclude),
               "min_line_chars": args.min_line_chars, "shuffle_seed": args.shuffle_seed, "chats": len(rows)}
    with open(args.output + ".json", "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
