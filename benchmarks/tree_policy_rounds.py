"""Per-round view of the tree round policy: planning time, verification time, predicted and realised
acceptance, split by the round's source (drafter, n-gram, plain).

    python benchmarks/tree_policy_rounds.py --prompts gsm8k --limit 8 --budget 8

Wraps ``TreeRoundPolicy.plan`` / ``observe`` (no change to what the policy does) and generates with
the shipped SmolLM2 drafter under ``tree="auto"`` and the policy. For drafted rounds,
``pred_accepted`` is the sum of the expected acceptance of the nodes the policy chose to verify and
``pred_ngram`` / ``accepted_ngram`` the n-gram nodes' part of it, predicted and realised.
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import time

from hf_jetspec.generation import tree_decoding as td
from hf_jetspec.tools.bench import BenchConfig, load_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prompts", default="gsm8k")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()

    cfg = BenchConfig(target=args.target, prompts=args.prompts, limit=args.limit, max_new_tokens=args.max_new_tokens, dtype=args.dtype,
                      methods=["jetspec-tree-policy"], budget=args.budget)
    setup = load_bench(cfg)
    target, drafter = setup.target, setup.drafter
    drafter.drafting_config = drafter.drafting_config.replace(tree="auto", policy=True)
    log: list[dict] = []
    plan, observe, choose = td.TreeRoundPolicy.plan, td.TreeRoundPolicy.observe, td.choose_tree_size

    def traced_plan(self, input_ids, max_depth, draft):
        rec: dict = {}
        chosen: list = []

        def timed_draft(seed=()):
            t = time.perf_counter()
            out = draft(seed)
            rec["draft_s"] = time.perf_counter() - t
            return out

        def spy(expected, costs, draft_cost=0.0):
            c = choose(expected, costs, draft_cost=draft_cost)
            chosen.append((list(expected), c))
            return c

        td.choose_tree_size = spy
        t = time.perf_counter()
        try:
            tree, source = plan(self, input_ids, max_depth, timed_draft)
        finally:
            td.choose_tree_size = choose
        rec.update(plan_s=time.perf_counter() - t, source=source, nodes=len(tree))
        if chosen:
            expected, c = chosen[0]
            rec["pred_accepted"] = sum(expected[: c.length])
            rec["pred_ngram"] = sum(expected[i] for i in self._ngram_nodes)
        log.append(rec)
        return tree, source

    def traced_observe(self, nodes, accepted, seconds):
        log[-1].update(accepted=len(accepted), verify_s=seconds, accepted_ngram=len(set(accepted) & set(self._ngram_nodes)))
        return observe(self, nodes, accepted, seconds)

    td.TreeRoundPolicy.plan, td.TreeRoundPolicy.observe = traced_plan, traced_observe
    for _, ids in setup.items:
        target.generate(ids, assistant_model=drafter, max_new_tokens=args.max_new_tokens, do_sample=False)
    for source in ("drafter", "ngram", "plain"):
        rows = [r for r in log if r["source"] == source]
        if not rows:
            continue
        out = {"rounds": len(rows), "plan_ms": 1000 * st.mean(r["plan_s"] for r in rows), "verify_ms": 1000 * st.mean(r["verify_s"] for r in rows),
               "accepted": st.mean(r["accepted"] for r in rows), "nodes": st.mean(r["nodes"] for r in rows)}
        if source == "drafter":
            out |= {"draft_ms": 1000 * st.mean(r["draft_s"] for r in rows), "pred_accepted": st.mean(r["pred_accepted"] for r in rows),
                    "pred_ngram": st.mean(r["pred_ngram"] for r in rows), "accepted_ngram": st.mean(r["accepted_ngram"] for r in rows)}
        print(source, json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
