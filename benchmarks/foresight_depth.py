"""How much of the target does it take to foresee the token after the anchor?

Foresight hits are decided mostly at the block's first row: when the drafter's first token is
rejected (k* = 0), the realised outcome is (0, a*) with a* the target's token after the anchor, so
a hit needs a predictor of that token. This script measures the best a subset of the target's own
layers can do at that row when it is given everything that is known before verification: the
anchor token and the target's exact keys/values of the verified context at every kept layer. Only
the skipped layers are approximated (by skipping them). With all layers this is exact (checked).

    python benchmarks/foresight_depth.py --target smollm2-135m --prompts gsm8k --limit 4 --offset 300 \
        --max-new-tokens 128 --records runs/foresight_eval_rounds.jsonl \
        --output benchmarks/results/foresight_depth_smollm2.json

Sequences are the target's own greedy continuations of held-out prompts; every position of the
continuation is scored as an anchor. With --records (rounds recorded by foresight_eval.py), the
trained adapter + decoder's first-row agreement and the drafter's first-slot acceptance are
reported from the same kind of rounds for comparison.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_jetspec import load_target
from hf_jetspec.tools.bench import build_items
from hf_jetspec.tools.environment import describe_environment
from hf_jetspec.data import load_eval_prompts
from hf_jetspec.drafter.layers import foreign_layer_forward


def spread_layers(num_layers: int, keep: int) -> list[int]:
    """``keep`` layer indices spread evenly over ``range(num_layers)``, always with the first and last."""
    if keep >= num_layers:
        return list(range(num_layers))
    if keep == 1:
        return [num_layers - 1]
    return sorted({round(i * (num_layers - 1) / (keep - 1)) for i in range(keep)})


def ends_layers(num_layers: int, keep: int) -> list[int]:
    """The first ``keep // 2`` and last ``keep - keep // 2`` layers (the middle is skipped)."""
    head = keep // 2
    return list(range(head)) + list(range(num_layers - (keep - head), num_layers))


def anchor_mask(length: int) -> torch.Tensor:
    """Row t attends to the exact context keys j < t and to its own (approximated) key only."""
    context = torch.tril(torch.ones(length, length, dtype=torch.bool), -1)
    own = torch.eye(length, dtype=torch.bool)
    return torch.cat([context, own], 1)[None, None]


@torch.no_grad()
def subset_agreement(target, sequences, keep: list[int], top: int = 4) -> dict:
    """Top-1 / top-``top`` agreement with the target's greedy token at every continuation position."""
    model, cfg = target.model, target.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    top1 = topk = total = 0
    for start, seq in sequences:
        out = target(seq, use_cache=True)
        greedy = out.logits[0].argmax(-1)
        length = seq.shape[1]
        x = model.embed_tokens(seq)
        cos, sin = model.rotary_emb(x, torch.arange(length)[None])
        mask = anchor_mask(length)
        for layer in keep:
            cached = out.past_key_values.layers[layer]
            x = foreign_layer_forward(model.layers[layer], x, cos, sin, mask, (cached.keys, cached.values), heads, kv_heads, head_dim)
        logits = target.lm_head(model.norm(x))[0]
        rows = slice(start - 1, length - 1)
        want = greedy[rows]
        top1 += int((logits[rows].argmax(-1) == want).sum())
        topk += int((logits[rows].topk(top, dim=-1).indices == want[:, None]).any(-1).sum())
        total += want.numel()
    return {"layers": keep, "num_layers": len(keep), "top1": top1 / total, f"top{top}": topk / total, "positions": total}


def recorded_first_row(path: str) -> dict:
    """From recorded foresight rounds: decoder first-row top-1/top-4 vs the target's token, and k* = 0 share."""
    rounds = top1 = top4 = first_rejected = 0
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("realized") is None:
                continue
            k, a = r["realized"]
            want = a if k == 0 else r["draft"][0]
            cands = r["decoder_row_tokens"][0]
            rounds += 1
            first_rejected += int(k == 0)
            top1 += int(cands[0] == want)
            top4 += int(want in cands[:4])
    return {"rounds": rounds, "k0_share": first_rejected / rounds, "adapter_decoder_top1": top1 / rounds,
            "adapter_decoder_top4": top4 / rounds, "drafter_first_slot_accept": 1 - first_rejected / rounds}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prompts", default="gsm8k")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--offset", type=int, default=300)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--keep", default=None, help="comma-separated layer counts (default: a sweep from 4 to all)")
    ap.add_argument("--records", default=None, help="rounds JSONL from foresight_eval.py for the adapter comparison")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()

    torch.manual_seed(0)
    target, tokenizer = load_target(args.target)
    target.eval()
    num_layers = target.config.num_hidden_layers
    items = build_items(tokenizer, target, load_eval_prompts(args.prompts, limit=args.limit, offset=args.offset), args.max_new_tokens)
    sequences = []
    with torch.no_grad():
        for _, ids in items:
            out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.max_new_tokens)
            sequences.append((ids.shape[1], out))
    counts = [int(c) for c in args.keep.split(",")] if args.keep else sorted({4, 8, num_layers // 3, num_layers // 2, 2 * num_layers // 3,
                                                                               5 * num_layers // 6, num_layers - 2, num_layers - 1, num_layers})
    rows = []
    for count in counts:
        for layout, pick in (("spread", spread_layers), ("ends", ends_layers)):
            row = {"layout": layout, **subset_agreement(target, sequences, pick(num_layers, count))}
            rows.append(row)
            print(f"{layout:6s} {count:3d}/{num_layers} layers  top1 {row['top1']:.3f}  top4 {row['top4']:.3f}", flush=True)
    result = {"target": args.target, "num_layers": num_layers, "prompts": args.prompts, "limit": args.limit, "offset": args.offset,
              "max_new_tokens": args.max_new_tokens, "subsets": rows, "environment": describe_environment(torch.device("cpu"))}
    if args.records:
        result["recorded"] = recorded_first_row(args.records)
        print(json.dumps(result["recorded"]))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
