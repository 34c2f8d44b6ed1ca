"""Drafter training step time and loss in fp32 against bf16 (target in bf16, drafter fp32 under bf16 autocast).

    python benchmarks/train_dtype.py --steps 30 --output benchmarks/results/train_dtype_smollm2.json

Both runs start from the same drafter weights, see the same batches in the same order (same seed),
and are timed step by step (the first 3 steps are warm-up). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.tools.targets import companion_drafter_path
from hf_jetspec.training import JetSpecTrainer, JetSpecTrainingArguments
from hf_jetspec.training.corpus import CorpusCollator, load_training_corpus


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times: list[float] = []
        self._t0 = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._t0)


def run(dtype: str, args, corpus, pad_id) -> dict:
    target, _ = load_target(args.target, dtype=dtype)
    drafter = JetSpecDrafter.from_pretrained(args.drafter or str(companion_drafter_path(args.target)), dtype=torch.float32)
    drafter.attach_target(target, follow_dtype=False)
    timer = StepTimer()
    targs = JetSpecTrainingArguments(
        output_dir=f"{args.workdir}/{dtype}", per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
        max_steps=args.steps, logging_steps=1, save_steps=10**9, report_to=[], use_cpu=True, seed=args.seed,
        bf16=dtype == "bfloat16", dataloader_num_workers=0, lr_scheduler_type="constant",
    )
    trainer = JetSpecTrainer(model=drafter, args=targs, target=target, train_dataset=corpus, data_collator=CorpusCollator(pad_id),
                             callbacks=[timer])
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    steady = timer.times[3:] or timer.times
    return {"dtype": dtype, "step_s_median": sorted(steady)[len(steady) // 2], "step_s": timer.times, "loss": losses}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--num-sequences", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="runs/train_dtype")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    _, tokenizer = load_target(args.target, dtype="float32")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    corpus = load_training_corpus(tokenizer, "sharegpt", args.num_sequences, args.seq_len, args.seed)
    runs = [run(d, args, corpus, pad_id) for d in ("float32", "bfloat16")]
    fp32, bf16 = runs
    n = min(len(fp32["loss"]), len(bf16["loss"]))
    tail = max(1, n // 3)
    result = {
        "config": vars(args),
        "step_speedup_bf16": fp32["step_s_median"] / bf16["step_s_median"],
        "mean_loss_last_third": {"float32": sum(fp32["loss"][n - tail : n]) / tail, "bfloat16": sum(bf16["loss"][n - tail : n]) / tail},
        "runs": runs,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"median step: fp32 {fp32['step_s_median']:.2f} s, bf16 {bf16['step_s_median']:.2f} s "
          f"({result['step_speedup_bf16']:.2f}x); mean loss over the last third: {result['mean_loss_last_third']}")


if __name__ == "__main__":
    main()
