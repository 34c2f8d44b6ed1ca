"""How much a tree of n-gram continuations could add over one chain, replayed on greedy outputs.

No model runs: a bench result file's plain-decoding outputs (first turns and single-turn prompts)
are replayed round by round. At each round every proposer looks at the prompt and the output so far
and proposes; the round commits the longest prefix any of its candidates shares with the true
continuation, plus one token. Proposers: transformers' prompt lookup (earliest match of the last 2,
then 1 tokens, 10 tokens), the drafter-free chain (latest match of the longest suffix up to 4 tokens,
15 tokens), and trees of the first 2, 4 or 8 distinct continuations over all matches (longest suffix
first, latest first). Reported: tokens per round (an upper bound on what verification would commit,
with no policy deciding lengths) and the distinct tree nodes verified per round.

    python benchmarks/ngram_tree_headroom.py benchmarks/results/random_drafter_smollm2_mt-bench_float32.json \
        benchmarks/results/random_drafter_gemma3_mt-bench_float32.json --output benchmarks/results/ngram_tree_headroom.json
"""

from __future__ import annotations

import argparse
import json

from hf_jetspec.generation.ngram_tree import common_prefix


def prompt_lookup(seq: list[int], length: int = 10, max_ngram: int = 2) -> list[list[int]]:
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        suffix = seq[-n:]
        for i in range(len(seq) - n):
            if seq[i : i + n] == suffix and i + n < len(seq):
                return [seq[i + n : i + n + length]]
    return []


def continuations(seq: list[int], limit: int, length: int = 15, max_ngram: int = 4) -> list[list[int]]:
    """Distinct continuations of the sequence's suffix matches: longest suffix first, latest match first."""
    out, seen = [], set()
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        suffix = seq[-n:]
        for i in range(len(seq) - n - 1, -1, -1):
            if seq[i : i + n] == suffix:
                cont = tuple(seq[i + n : i + n + length])
                if cont and cont not in seen:
                    seen.add(cont)
                    out.append(list(cont))
                    if len(out) >= limit:
                        return out
    return out


def replay(prompts: list[list[int]], outputs: list[list[int]], propose) -> dict:
    rounds = committed = nodes = 0
    for prompt, output in zip(prompts, outputs):
        t = 0
        while t < len(output):
            cands = propose(prompt + output[:t])
            accepted = max((common_prefix(c, output[t:]) for c in cands), default=0)
            nodes += len({tuple(c[:j]) for c in cands for j in range(1, len(c) + 1)})
            rounds += 1
            committed += accepted + 1
            t += accepted + 1
    return {"tokens_per_round": round(committed / rounds, 4), "nodes_per_round": round(nodes / rounds, 2), "rounds": rounds}


PROPOSERS = {
    "prompt-lookup": prompt_lookup,
    "chain": lambda seq: continuations(seq, 1),
    "tree-2": lambda seq: continuations(seq, 2),
    "tree-4": lambda seq: continuations(seq, 4),
    "tree-8": lambda seq: continuations(seq, 8),
}


def first_turns(result_file: str) -> tuple[list[list[int]], list[list[int]], dict]:
    from transformers import AutoTokenizer

    from hf_jetspec.data import load_eval_prompts, prompt_input_ids
    from hf_jetspec.tools.targets import converted_folder, resolve_embedded

    with open(result_file) as f:
        result = json.load(f)
    config = result["config"]
    tokenizer = AutoTokenizer.from_pretrained(str(converted_folder(resolve_embedded(config["target"]))))
    prompts = load_eval_prompts(config["prompts"], limit=config["limit"], offset=config["offset"])
    ids = [prompt_input_ids(tokenizer, p, [{"role": "user", "content": p.turns[0]}])[0].tolist() for p in prompts]
    keep = [i for i, name in enumerate(config["items"]) if not name.endswith(("turn2", "turn3"))]
    outputs = [result["methods"]["ar"]["outputs"][i] for i in keep]
    return ids, outputs, config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="bench result files with an 'ar' method")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    report = {}
    for path in args.results:
        prompts, outputs, config = first_turns(path)
        rows = {name: replay(prompts, outputs, propose) for name, propose in PROPOSERS.items()}
        report[path.split("/")[-1]] = {"target": config["target"], "prompts": config["prompts"], "items": len(outputs), "proposers": rows}
        print(config["target"], config["prompts"], {k: v["tokens_per_round"] for k, v in rows.items()})
    with open(args.output, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
