"""The drafter-free round policy replayed on greedy outputs, priced with a measured cost profile.

    python benchmarks/ngram_policy_replay.py benchmarks/results/drafter_free_{gemma3_continuation,smollm2_gsm8k,smollm2_humaneval}.json \
        --output benchmarks/results/ngram_policy_replay.json
    # with the tree rounds' row, on all five sets:
    python benchmarks/ngram_policy_replay.py \
        benchmarks/results/drafter_free_{gemma3_continuation,smollm2_gsm8k,smollm2_humaneval,smollm2_mt-bench,qwen15_humaneval}.json \
        --output benchmarks/results/ngram_tree_replay.json

No model runs. For each bench result file, the plain-decoding outputs of its first turns are
replayed round by round: the drafter-free path's own code (:class:`~hf_jetspec.policy.NgramIndex`,
:class:`~hf_jetspec.policy.OutputMemory` with its running acceptance counts,
:func:`~hf_jetspec.policy.best_candidate`) chooses each round's verify length under the verify
costs the file's drafter-free run measured (``cost_model.verify_ms``), and the round commits the
proposal's prefix that matches the output plus one token. Transformers' prompt lookup (earliest
match of the last 2, then 1 tokens, 10 tokens) is replayed on the same outputs and priced the same
way; ``all`` verifies every proposal whole; ``trees`` replays the drafter-free tree rounds
(:class:`~hf_jetspec.generation.ngram_tree.NgramTreePolicy`) on the same outputs and prices. Reported per proposer: tokens per round and tokens per
priced second relative to prompt lookup. Per-round costs outside the forward (the loop, the
proposer) are not in these prices, so measured ratios run a few percent below them.
"""

from __future__ import annotations

import argparse
import json

from ngram_tree_headroom import common_prefix, first_turns, prompt_lookup

from hf_jetspec.generation.ngram_tree import NgramTreePolicy
from hf_jetspec.policy import Candidate, CostModel, NgramIndex, OutputMemory, best_candidate, propose_ngram


def replay_policy(prompts: list[list[int]], outputs: list[list[int]], costs: list[float], verify_all: bool = False,
                  budget: int = 16) -> dict:
    """Rounds of the drafter-free policy over ``outputs``; the output memory carries across items as in a bench run."""
    memory = OutputMemory()
    rounds = committed = 0
    seconds = 0.0
    for prompt, output in zip(prompts, outputs):
        index = NgramIndex(max_ngram=4)
        index.extend(prompt)
        t = 0
        while t < len(output):
            gamma = min(budget - 1, len(output) - t)
            proposal = propose_ngram(index, memory, gamma)
            length = accepted = 0
            if proposal is not None:
                if verify_all:
                    length = len(proposal.tokens)
                else:
                    length = len(best_candidate([Candidate("ngram", proposal.tokens, memory.accept_probs(proposal))], costs).tokens)
                accepted = common_prefix(proposal.tokens[:length], output[t:])
                if length:
                    memory.observe(proposal, verified=length, accepted=accepted)
            seconds += costs[min(length, len(costs) - 1)]
            rounds += 1
            committed += accepted + 1
            index.extend(output[t : t + accepted + 1])
            t += accepted + 1
        memory.add_sequence(prompt + output)
    return {"tokens_per_round": committed / rounds, "tokens_per_s": committed / seconds, "rounds": rounds}


def replay_tree_policy(prompts: list[list[int]], outputs: list[list[int]], costs: list[float], budget: int = 16,
                       candidates: int = 4) -> dict:
    """Drafter-free tree rounds (:class:`~hf_jetspec.generation.ngram_tree.NgramTreePolicy`, its own
    code) over ``outputs``: each round commits the longest path of the planned tree that the output
    follows, plus one token, and pays the verify cost of its node count."""
    memory = OutputMemory()
    cost = CostModel(list(range(1, len(costs) + 1)), costs)
    rounds = committed = trees = 0
    seconds = 0.0
    for prompt, output in zip(prompts, outputs):
        policy = NgramTreePolicy(memory, cost, budget, candidates=candidates)
        t = 0
        while t < len(output):
            tree, source = policy.plan(prompt + output[:t], min(budget - 1, len(output) - t))
            accepted, node = [], -1
            while t + len(accepted) < len(output):
                child = tree.children(node).get(output[t + len(accepted)])
                if child is None:
                    break
                accepted.append(child)
                node = child
            policy.observe(len(tree), accepted, costs[min(len(tree), len(costs) - 1)])
            seconds += costs[min(len(tree), len(costs) - 1)]
            rounds += 1
            trees += source == "ngram-tree"
            committed += len(accepted) + 1
            t += len(accepted) + 1
        memory.add_sequence(prompt + output)
    return {"tokens_per_round": committed / rounds, "tokens_per_s": committed / seconds, "rounds": rounds,
            "tree_rounds": trees}


def replay_prompt_lookup(prompts, outputs, costs, length: int = 10) -> dict:
    rounds = committed = 0
    seconds = 0.0
    for prompt, output in zip(prompts, outputs):
        t = 0
        while t < len(output):
            cands = prompt_lookup(prompt + output[:t], length)
            proposal = cands[0][: len(output) - t] if cands else []
            accepted = common_prefix(proposal, output[t:])
            seconds += costs[min(len(proposal), len(costs) - 1)]
            rounds += 1
            committed += accepted + 1
            t += accepted + 1
    return {"tokens_per_round": committed / rounds, "tokens_per_s": committed / seconds, "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="bench result files with 'ar' and 'drafter-free' methods")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    report = {}
    for path in args.results:
        with open(path) as f:
            costs = [ms / 1000 for ms in json.load(f)["methods"]["drafter-free"]["cost_model"]["verify_ms"]]
        prompts, outputs, config = first_turns(path)
        rows = {"prompt-lookup": replay_prompt_lookup(prompts, outputs, costs),
                "drafter-free": replay_policy(prompts, outputs, costs),
                "drafter-free, all verified": replay_policy(prompts, outputs, costs, verify_all=True),
                "drafter-free trees": replay_tree_policy(prompts, outputs, costs)}
        base = rows["prompt-lookup"]["tokens_per_s"]
        for row in rows.values():
            row["vs_prompt_lookup"] = round(row["tokens_per_s"] / base, 3)
            row["tokens_per_round"] = round(row["tokens_per_round"], 3)
            row["tokens_per_s"] = round(row["tokens_per_s"], 2)
        report[path.split("/")[-1]] = {"target": config["target"], "prompts": config["prompts"], "items": len(outputs),
                                       "verify_ms": [round(c * 1000, 2) for c in costs], "proposers": rows}
        print(config["target"], config["prompts"], {k: (v["tokens_per_round"], v["vs_prompt_lookup"]) for k, v in rows.items()}, flush=True)
    with open(args.output, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
