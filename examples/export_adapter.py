"""Export a trained foresight adapter as a Hub-ready fp16 folder with its model card.

    python examples/export_adapter.py --checkpoint runs/smollm2-adapter/final \
        --output hub_cards/jetspec-smollm2-135m-foresight --eval benchmarks/results/foresight_smollm2_gsm8k.json

A ``foresight_calibration.json`` already in --output (from `hf-jetspec calibrate`) is kept.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_jetspec.foresight import ForesightAdapter

CARD = """---
library_name: transformers
tags:
- hf-jetspec
- speculative-decoding
- foresight-drafting
base_model: {base_model}
---

# {name}

Foresight adapter of JetSpec++ for `{base_model}` (embedded name `{target_name}`): it predicts, in
one parallel pass, the target's hidden states at layers {layers} for the block under verification,
so that the next block can be drafted before verification returns. It serves the drafter
[`jetspec-smollm2-135m`](../jetspec-smollm2-135m) (same read layers). The decoder that scores the
verification outcomes is the target's own layers above layer {deepest} (frozen, used by reference),
so only the adapter is stored here ({size_mb:.1f} MB, {dtype}).

## Use

```python
from hf_jetspec import JetSpecAssistant, load_target

target, tok = load_target("{target_name}")
assistant = JetSpecAssistant.from_pretrained("hub_cards/jetspec-smollm2-135m")  # the drafter and its calibrations
assistant.attach_foresight("hub_cards/{name}")          # adapter + foresight_calibration.json
assistant.drafting_config = assistant.drafting_config.replace(foresight=True, cache_size=4)
out = target.generate(**tok("Hello", return_tensors="pt"), assistant_model=assistant, do_sample=False)
print(assistant.generation_stats.hit_rate)
```

The output is the target's own, whatever the adapter predicts: every committed token still goes
through exact-match verification.

## Architecture

| | |
|---|---|
| modules | one per read layer {layers} |
| layers per module (copied from the target) | {sources} |
| block | anchor + {gamma} draft positions |
| parameters | {params:.1f} M |

## Training

{training}

Command: `{command}`

## Measured

{measured}

A trained adapter this small is cheap but approximate. For the measured trade-off between adapter
depth and foresight, see `benchmarks/foresight_depth.py` and the training-free `LayerSkipAdapter`
(the target's own layers with exact context) in docs/foresight.md.
"""


def measured(path: str | None) -> str:
    if not path:
        return "(not measured)"
    r = json.loads(Path(path).read_text())
    q = r["adapter_quality"]
    m = r["methods"]
    c = r["config"]
    lines = [
        f"Held-out {c['prompts']} prompts ({c['limit']} x {c['max_new_tokens']} new tokens, greedy, budget {c['budget']}, "
        f"cache size {c['cache_size']}), {r['environment'].get('cpu', 'CPU')}:",
        "",
        f"- gap recovered between copying the last verified state and the true states: {q['gap_recovered']:.3f}",
        f"- decoder top-1 agreement with the target's greedy token: {q['decoder_top1_agreement_predicted_states']:.3f} on predicted states "
        f"({q['decoder_top1_agreement_true_states']:.3f} on true states)",
        f"- live hit rate at B = {c['cache_size']}: {m['foresight-J1-off']['hit_rate']:.3f}",
        f"- tau J1-R0 {m['J1-R0']['tau']:.2f}, J1-R1 {m['J1-R1']['tau']:.2f}, J2-R2 {m['J2-R2']['tau']:.2f}",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--target-name", default="smollm2-135m")
    ap.add_argument("--training", default="")
    ap.add_argument("--command", default="")
    ap.add_argument("--eval", default=None, help="JSON of benchmarks/foresight_eval.py")
    args = ap.parse_args()

    adapter = ForesightAdapter.from_pretrained(args.checkpoint, dtype=torch.float32).to(getattr(torch, args.dtype))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    adapter.save_pretrained(out)
    cfg = adapter.config
    size = (out / "model.safetensors").stat().st_size / 2**20
    (out / "README.md").write_text(CARD.format(
        name=out.name, base_model=cfg.target_name_or_path, target_name=args.target_name, layers=cfg.target_layer_ids,
        deepest=max(cfg.target_layer_ids), size_mb=size, dtype=args.dtype, sources=cfg.source_layers,
        gamma=cfg.block_size - 1, params=sum(p.numel() for p in adapter.parameters()) / 1e6,
        training=args.training or "(not described)", command=args.command or "(not recorded)", measured=measured(args.eval),
    ))
    print(f"wrote {out} ({size:.1f} MB)")


if __name__ == "__main__":
    main()
