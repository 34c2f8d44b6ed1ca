"""What 8-bit state storage costs a drafter: teacher-forced chain tau on exact against float8 states.

    python benchmarks/state_storage.py --drafter hub_cards/jetspec-smollm2-135m --output benchmarks/results/state_storage_smollm2.json

A feature cache of 30,000 regenerated answers holds about 8M tokens; at five bf16 read layers of
SmolLM2-135M (5.8 KB a token with the top-64 labels) that is about 50 GB, most of a 64 GB disk.
Storing the states as float8_e4m3fn with one scale per layer and token
(:func:`hf_jetspec.training.feature_cache.quantize_states`) halves them. This measures what the
rounding changes: the target answers held-out prompts greedily (states recorded by the same
forwards, as in regeneration), then the shipped drafter's teacher-forced chain tau
(:func:`hf_jetspec.training.online.chain_tau`, J0 on noise plus one Jacobi pass, the same anchors
for both) is taken once on the exact states and once on their float8 round trip. The drafter was
trained on exact states, so this bounds what the storage takes from what it reads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default="hub_cards/jetspec-smollm2-135m")
    ap.add_argument("--prompts", default="gsm8k:120,humaneval:120,mt-bench:20")
    ap.add_argument("--limit", type=int, default=10, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=16, help="anchors per answer")
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)

    from hf_jetspec import JetSpecDrafter
    from hf_jetspec.data import chat_input_ids, load_eval_prompts
    from hf_jetspec.tools.environment import describe_environment
    from hf_jetspec.tools.targets import load_target
    from hf_jetspec.training.feature_cache import dequantize_states, quantize_states
    from hf_jetspec.training.online import chain_tau
    from hf_jetspec.training.regenerate import generate_with_features

    target, tokenizer = load_target(args.target, dtype="bfloat16")
    drafter = JetSpecDrafter.from_pretrained(args.drafter)
    drafter.attach_target(target)  # shares its embeddings and head, in its dtype
    layer_ids = list(drafter.config.target_layer_ids)
    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
    rows = []
    for spec in args.prompts.split(","):
        name, _, offset = spec.partition(":")
        prompts = load_eval_prompts(name, limit=args.limit, offset=int(offset or 0))
        ids = [chat_input_ids(tokenizer, [{"role": "user", "content": p.turns[0]}])[0].tolist() for p in prompts]
        items = generate_with_features(target, ids, [False] * len(ids), layer_ids, args.max_new_tokens, 1, 1.0, eos_ids,
                                       tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0, torch.bfloat16)
        rounded, err = [], []
        for item in items:
            q, scale = quantize_states(item["states"], len(layer_ids))
            back = dequantize_states(q, scale)
            x = item["states"].float()
            err.append(float(((back.float() - x).norm() / x.norm())))
            rounded.append({**item, "states": back})
        exact = chain_tau(drafter, items, args.blocks, drafter.config.block_size - 1, 1, torch.Generator().manual_seed(0))
        fp8 = chain_tau(drafter, rounded, args.blocks, drafter.config.block_size - 1, 1, torch.Generator().manual_seed(0))
        rows.append({"prompts": spec, "items": len(items), "answer_tokens": sum(int(i["input_ids"].numel()) - len(p) for i, p in zip(items, ids)),
                     "tau_bf16_states": round(exact, 4), "tau_fp8_states": round(fp8, 4), "difference": round(fp8 - exact, 4),
                     "relative_state_error": round(sum(err) / len(err), 5)})
        print(rows[-1], flush=True)
    width = len(layer_ids) * target.config.hidden_size
    result = {
        "command": "python benchmarks/state_storage.py " + " ".join(argv or __import__("sys").argv[1:]),
        "target": args.target, "drafter": args.drafter, "max_new_tokens": args.max_new_tokens, "anchors_per_answer": args.blocks,
        "bytes_per_token_states": {"bfloat16": 2 * width, "float8_e4m3fn": width + 4 * len(layer_ids)},
        "rows": rows, "environment": describe_environment(target.device),
    }
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
