"""What one training step on a regenerated feature cache costs, on three paths side by side in one
run on the same batches:

- ``dense labels, dense mask`` (the trainer's earlier path): the cached top-k labels expanded to
  ``[..., V]`` logits before the loss, and the blocks' attention under a dense ``[nb*L, C + nb*L]`` mask;
- ``top-k labels``: the labels kept as :class:`~hf_jetspec.training.losses.TopKLabels`;
- ``top-k labels, packed attention`` (the trainer now): also the structured attention of
  :func:`~hf_jetspec.drafter.layers.packed_block_attention`.

    python benchmarks/train_step_cost.py --cache runs/regen-smollm2-30k --steps 12 \
        --output benchmarks/results/train_step_cost_smollm2.json

The drafter is the data-scaling recipe's (2 layers, a 1,536-wide MLP from the target's top layers, the
cache's 8,192 most frequent answer tokens as draft vocabulary; batch 4, 32 blocks per sequence, bf16
autocast). Each batch is stepped once per path, in rotating order, from the same weights (gradients
zeroed, no optimizer step), so the losses must agree to rounding; the result gives the median
milliseconds per step (loss, backward) of each path and the largest loss difference from the first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.drafter import modeling_drafter
from hf_jetspec.drafter.masks import block_attention_mask
from hf_jetspec.tools.environment import describe_environment
from hf_jetspec.training import FeatureCacheCollator, FeatureCacheDataset, JetSpecTrainer, JetSpecTrainingArguments
from hf_jetspec.training.feature_cache import frequent_cached_tokens

ROOT = Path(__file__).resolve().parent.parent


class DenseLabelTrainer(JetSpecTrainer):
    """The same trainer with the cached top-k labels expanded to ``[..., V]`` logits before the loss."""

    @staticmethod
    def _cached_labels(drafter, topk_ids, topk_logprobs):
        sparse = JetSpecTrainer._cached_labels(drafter, topk_ids, topk_logprobs)
        size = drafter.config.draft_vocab_size or drafter.config.target_vocab_size
        return lambda pos: sparse(pos).dense(size)


@contextlib.contextmanager
def dense_mask():
    """The drafter's training view under the dense boolean mask (SDPA) instead of packed attention."""
    packed = modeling_drafter.PackedBlocks
    modeling_drafter.PackedBlocks = block_attention_mask
    try:
        yield
    finally:
        modeling_drafter.PackedBlocks = packed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--sequences", type=int, default=512, help="the cache's first N sequences (draft vocabulary and batches)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    torch.manual_seed(0)
    target, _ = load_target(args.target, dtype="bfloat16")
    drafter = JetSpecDrafter.for_target(target, init_layers_from_target=True, num_hidden_layers=2, intermediate_size=1536)
    data = FeatureCacheDataset(args.cache, layer_ids=drafter.config.target_layer_ids, max_sequences=args.sequences)
    drafter.restrict_draft_vocab(frequent_cached_tokens(data, 8192))
    targs = dict(output_dir=str(ROOT / "runs" / "train_step_cost"), per_device_train_batch_size=4, report_to=[], bf16=True,
                 use_cpu=True, dataloader_num_workers=0, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                 blocks_per_sequence=32, block_inputs="jacobi", noise_seed=0)
    paths = {"dense labels, dense mask": (DenseLabelTrainer, dense_mask), "top-k labels": (JetSpecTrainer, dense_mask),
             "top-k labels, packed attention": (JetSpecTrainer, contextlib.nullcontext)}
    built = {}
    for name, (cls, _) in paths.items():
        t = cls(model=drafter, args=JetSpecTrainingArguments(**targs), target=target, train_dataset=data,
                data_collator=FeatureCacheCollator(0))
        t.current_gradient_accumulation_steps = 1
        built[name] = t
    collate = FeatureCacheCollator(0)
    times = {name: [] for name in paths}
    losses = {name: [] for name in paths}
    drafter.train()
    for step in range(args.steps + 1):  # step 0 warms up and is not counted
        batch = collate([data[(4 * step + i) % len(data)] for i in range(4)])
        names = list(paths)
        order = names[step % len(names):] + names[:step % len(names)]
        for name in order:
            t = built[name]
            t._noise = torch.Generator().manual_seed(step)  # the same anchors and noise for every path
            with paths[name][1]():
                t0 = time.perf_counter()
                loss = t.training_step(drafter, batch)
                elapsed = time.perf_counter() - t0
            drafter.zero_grad(set_to_none=True)
            if step:
                times[name].append(elapsed * 1e3)
                losses[name].append(float(loss))
    ms = {name: statistics.median(v) for name, v in times.items()}
    result = {
        "command": "python " + " ".join(sys.argv),
        "environment": describe_environment(torch.device("cpu")),
        "recipe": "2 layers, MLP 1536, draft vocabulary 8192, batch 4, 32 blocks per sequence, block 16, bf16 autocast",
        "steps": args.steps,
        "ms_per_step_median": ms,
        "ms_per_step": times,
        "losses": losses,
        "max_loss_difference": {name: max(abs(a - b) for a, b in zip(losses[names[0]], v)) for name, v in losses.items()},
        "speedup_over_dense": {name: ms[names[0]] / v for name, v in ms.items()},
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("ms_per_step_median", "max_loss_difference", "speedup_over_dense")}, indent=1))


if __name__ == "__main__":
    main()
