"""Write a training-free layer-skip foresight adapter folder for a drafter.

    python examples/make_layer_skip_adapter.py --target smollm2-135m --keep 0-9,20-27 \
        --output hub_cards/jetspec-smollm2-135m-foresight-layerskip

The folder holds ``layer_skip_adapter.json`` only (the layers are the target's own, by reference);
fit its selection rule next with ``hf-jetspec calibrate --adapter <folder>``. Which layers to keep
is a cost/accuracy choice measured by ``benchmarks/foresight_depth.py``.
"""

from __future__ import annotations

import argparse

from hf_jetspec import load_target
from hf_jetspec.foresight import LayerSkipAdapter
from hf_jetspec.tools.targets import load_drafter_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=None, help="drafter folder (default: the one shipped for the target)")
    ap.add_argument("--keep", required=True, help="target layers to run, e.g. '0-9,20-27' (at most the drafter's deepest read layer)")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    target, _ = load_target(args.target)
    drafter, what = load_drafter_for(target, args.target, args.drafter)
    drafter.attach_target(target)
    adapter = LayerSkipAdapter.for_drafter(drafter, args.keep)
    adapter.save_pretrained(args.output)
    print(f"wrote {args.output}: {len(adapter.config.keep_layers)} of the target's layers for {what}")


if __name__ == "__main__":
    main()
