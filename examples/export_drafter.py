"""Export a trained drafter as a Hub-ready folder: fp16/bf16 (or int8-stored) safetensors, drafting options, model card.

    python examples/export_drafter.py --checkpoint runs/smollm2-corpus-jacobi/final \
        --output hub_cards/jetspec-smollm2-135m --bench benchmarks/results/smollm2_gsm8k.json \
        --command "python examples/train_drafter.py ..."

``--weight-storage int8`` stores the large matrices as int8 with one scale per output channel
(dequantised at load to the stored dtype), about half the size of fp16; ``int4`` keeps a scale per
64 columns and halves that again.

The card records the training data, recipe and command, and the acceptance length measured by
`hf-jetspec bench` (read from the given bench JSON files).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_jetspec import JetSpecDrafter

STORAGE_NOTES = {
    "int8": "int8 (per-channel scales, dequantised to {dtype} at load)",
    "int4": "int4 (a scale per 64 columns, dequantised to {dtype} at load)",
}

CARD = """---
library_name: hf_jetspec
base_model: {base_model}
license: apache-2.0
tags:
- speculative-decoding
- jetspec
- drafter
datasets:
- {dataset}
---

# {name}

A JetSpec++ causal parallel block drafter for **{base_model}**, for lossless speculative decoding
with hf_jetspec. It reads the target's hidden states at
layers {layers}, drafts a whole block in one forward pass, and refines it with Jacobi passes. The
target verifies every block, so the output is exactly the target's own (token for token under
greedy decoding, the same distribution under sampling), whatever the drafter predicts.

```python
from hf_jetspec import JetSpecDrafter, load_target

target, tokenizer = load_target("{target_name}")
drafter = JetSpecDrafter.from_pretrained("{repo_id}")
out = target.generate(input_ids, assistant_model=drafter, max_new_tokens=256, do_sample=False)
```

The drafter shares the target's embeddings and LM head: they are not in this checkpoint
({size_mb:.1f} MB of {storage} weights, {params:.1f}M parameters).

## Architecture

| field | value |
| --- | --- |
| drafter layers | {num_layers} (hidden {hidden}, {heads} heads, {kv_heads} KV heads) |
| attention inside the block | {attention} |
| block inputs | {block_inputs} |
| read target layers | {layers} |
| training block size | {block_size} (anchor + {slots} slots) |
| draft vocabulary | {draft_vocab} |
| default drafting options | {drafting} |

## Training

{training}

Reproduce with:

```bash
{command}
{export_command}
```

## Measured acceptance

{measured}

Measured with `hf-jetspec bench` (greedy, prompts not used in training); see `benchmarks/README.md`
of the repository for the full tables, commands and hardware.
"""


def measured_table(paths: list[str]) -> str:
    if not paths:
        return "Not measured yet."
    rows = ["| prompts | items | new tokens | budget | J | tau | speedup vs AR | exact vs AR |", "|---|---|---|---|---|---|---|---|"]
    for p in paths:
        r = json.loads(Path(p).read_text())
        m = r["methods"]["jetspec"]
        c = r["config"]
        dc = m.get("drafting_config", {})
        rows.append(
            f"| {c['prompts']} | {c['num_items']} | {c['max_new_tokens']} | {dc.get('budget')} | {dc.get('num_jacobi_passes')} | "
            f"{m['tau']:.2f} | {m['speedup_vs_ar']:.2f}x | {m['exact_match_vs_ar']} |"
        )
    return "\n".join(rows)


def sharegpt_top_tokens(target_name: str, n: int) -> list[int]:
    from transformers import AutoTokenizer

    from hf_jetspec.data import frequent_response_tokens
    from hf_jetspec.tools.targets import converted_folder, resolve_embedded

    spec = resolve_embedded(target_name)
    tok = AutoTokenizer.from_pretrained(str(converted_folder(spec)) if spec else target_name)
    return frequent_response_tokens(tok, n)


def widen(drafter, args) -> None:
    """Widen the draft vocabulary to ``--widen-draft-vocab`` ids: the cache's response tokens by
    frequency first, then ShareGPT's (read only if the cache runs out); print the cache's coverage."""
    from hf_jetspec.drafter.draft_vocab import widen_by_counts
    from hf_jetspec.training.feature_cache import FeatureCacheDataset, cached_answer_counts

    counts = None
    if args.vocab_cache:
        counts = cached_answer_counts(FeatureCacheDataset(args.vocab_cache, layer_ids=drafter.config.target_layer_ids))
    print(widen_by_counts(drafter, args.widen_draft_vocab, counts,
                          lambda: sharegpt_top_tokens(args.target_name, args.widen_draft_vocab)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--target-name", default="smollm2-135m")
    ap.add_argument("--repo-id", default=None, help="Hub id used in the card's snippet (default: the folder name)")
    ap.add_argument("--training", default="", help="markdown paragraph describing data and recipe")
    ap.add_argument("--command", default="", help="the training command")
    ap.add_argument("--bench", nargs="*", default=[], help="bench JSON files with a jetspec entry")
    ap.add_argument("--budget", type=int, default=None)
    ap.add_argument("--jacobi-passes", type=int, default=None)
    ap.add_argument("--tree-top-k", type=int, default=None)
    ap.add_argument("--tree-jacobi-passes", type=int, default=None, help="Jacobi passes in tree rounds (default: --jacobi-passes)")
    ap.add_argument("--draft-vocab-from-sharegpt", type=int, default=None, metavar="N",
                    help="restrict drafting to the N most frequent tokens of the first 3000 ShareGPT responses")
    ap.add_argument("--widen-draft-vocab", type=int, default=None, metavar="N",
                    help="keep the checkpoint's draft vocabulary and add the most frequent response tokens of --vocab-cache "
                         "(then of ShareGPT responses) until it holds N ids")
    ap.add_argument("--vocab-cache", default=None, help="a feature cache (e.g. a regeneration's) whose responses rank --widen-draft-vocab's tokens")
    ap.add_argument("--draft-vocab-note", default=None,
                    help="how the checkpoint's own draft vocabulary was chosen (for the card)")
    ap.add_argument("--dataset", default="anon8231489123/ShareGPT_Vicuna_unfiltered", help="the card's dataset tag")
    ap.add_argument("--weight-storage", default=None, choices=["int8", "int4"],
                    help="store the large matrices as int8 (per-channel scales) or int4 (a scale per 64 columns)")
    args = ap.parse_args()

    drafter = JetSpecDrafter.from_pretrained(args.checkpoint, dtype=torch.float32)
    changes = {k: v for k, v in {"budget": args.budget, "num_jacobi_passes": args.jacobi_passes, "tree_top_k": args.tree_top_k,
                                  "tree_jacobi_passes": args.tree_jacobi_passes}.items() if v is not None}
    drafter.drafting_config = drafter.drafting_config.replace(**changes)
    if args.draft_vocab_from_sharegpt:
        drafter.restrict_draft_vocab(sharegpt_top_tokens(args.target_name, args.draft_vocab_from_sharegpt))
    if args.widen_draft_vocab:
        widen(drafter, args)
    drafter = drafter.to(getattr(torch, args.dtype))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    drafter.save_pretrained(out, weight_storage=args.weight_storage)
    cfg = drafter.config
    size = (out / "model.safetensors").stat().st_size / 2**20
    card = CARD.format(
        name=out.name,
        base_model=cfg.target_name_or_path,
        target_name=args.target_name,
        repo_id=args.repo_id or out.name,
        layers=cfg.target_layer_ids,
        size_mb=size,
        storage=STORAGE_NOTES[args.weight_storage].format(dtype=args.dtype) if args.weight_storage else args.dtype,
        dataset=args.dataset,
        params=sum(p.numel() for p in drafter.parameters()) / 1e6,
        num_layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        attention=cfg.attention,
        block_inputs=cfg.block_inputs,
        block_size=cfg.block_size,
        slots=cfg.block_size - 1,
        drafting=drafter.drafting_config,
        draft_vocab="full" if cfg.draft_vocab_size is None else f"{cfg.draft_vocab_size} tokens: " + (
            args.draft_vocab_note or "the most frequent tokens of ShareGPT responses"),
        training=args.training or "(not described)",
        command=args.command or "(not recorded)",
        measured=measured_table(args.bench),
        export_command=" ".join(
            ["python examples/export_drafter.py --checkpoint <run>/final", f"--output hub_cards/{out.name}", f"--dtype {args.dtype}"]
            + ([f"--budget {args.budget}"] if args.budget is not None else [])
            + ([f"--jacobi-passes {args.jacobi_passes}"] if args.jacobi_passes is not None else [])
            + ([f"--tree-top-k {args.tree_top_k}"] if args.tree_top_k is not None else [])
            + ([f"--tree-jacobi-passes {args.tree_jacobi_passes}"] if args.tree_jacobi_passes is not None else [])
            + ([f"--draft-vocab-from-sharegpt {args.draft_vocab_from_sharegpt}"] if args.draft_vocab_from_sharegpt else [])
            + ([f"--widen-draft-vocab {args.widen_draft_vocab}"] if args.widen_draft_vocab else [])
            + ([f"--vocab-cache {args.vocab_cache}"] if args.vocab_cache else [])
            + ([f"--weight-storage {args.weight_storage}"] if args.weight_storage else [])
            + ([f"--target-name {args.target_name}"] if args.target_name != "smollm2-135m" else [])
        ),
    )
    (out / "README.md").write_text(card)
    print(f"wrote {out} ({size:.1f} MB)")


if __name__ == "__main__":
    main()
