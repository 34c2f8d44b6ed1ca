"""A drafter alone on prompts it trained on against held-out prompts: how far it generalises.

    python benchmarks/seen_vs_unseen.py --drafter hub_cards/jetspec-smollm2-135m --cache runs/regen-smollm2 \
        --heldout mt-bench:20 --limit 10 --output benchmarks/results/seen_vs_unseen_smollm2.json

Both sides run the same way (chains of a full block every round, J = 1, budget 16, round policy
off, greedy, 128 new tokens): the held-out side on ``--limit`` prompts of an evaluation set, the
seen side on ``--limit`` prompts spread evenly over the training feature cache (their prompts, the
answers regenerated). Reported per side: tau and ``P(accepted >= k)`` for k = 1..5 over rounds.
tau needs no timing, so this may run on a busy machine.
"""

from __future__ import annotations

import argparse
import json

import torch

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.tools.bench import build_items
from hf_jetspec.data import load_eval_prompts
from hf_jetspec.training.feature_cache import FeatureCacheDataset


def survival(target, drafter, items, max_new_tokens: int) -> dict:
    accepted = []
    for _, ids in items:
        with torch.no_grad():
            target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, do_sample=False,
                            max_new_tokens=max_new_tokens)
        accepted += drafter.generation_stats.accepted_lengths
    n = max(len(accepted), 1)
    return {"rounds": len(accepted), "tau": round(1 + sum(accepted) / n, 4),
            "P(accepted>=k), k=1..5": [round(sum(a >= k for a in accepted) / n, 4) for k in range(1, 6)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--cache", required=True, help="the feature cache the drafter trained on")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--heldout", default="mt-bench:20", help="SET:OFFSET of the held-out prompts")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    target, tok = load_target(args.target, dtype=args.dtype)
    drafter = JetSpecDrafter.from_pretrained(args.drafter).eval()
    drafter.attach_target(target)
    drafter.drafting_config = drafter.drafting_config.replace(tree=None, policy=False, num_jacobi_passes=1, budget=16)
    name, _, offset = args.heldout.partition(":")
    heldout = build_items(tok, target, load_eval_prompts(name, limit=args.limit, offset=int(offset or 0)), args.max_new_tokens)
    cache = FeatureCacheDataset(args.cache)
    step = max(1, len(cache) // args.limit)
    seen = []
    for i in range(0, len(cache), step)[: args.limit]:
        item = cache[i]
        seen.append((f"cache-{i}", item["input_ids"][: item["response_start"]][None].to(target.device)))
    result = {"drafter": args.drafter, "cache": args.cache, "settings": "chains, J1, budget 16, policy off, greedy",
              "dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
              "heldout": {"prompts": args.heldout, **survival(target, drafter, heldout, args.max_new_tokens)},
              "seen": {"cache_sequences": [i for i, _ in seen], **survival(target, drafter, seen, args.max_new_tokens)}}
    print(json.dumps(result, indent=1))
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
