"""A drafter from nothing in N minutes: regenerate with the target, train, evaluate, save.

    python examples/pipeline.py --target smollm2-135m --minutes 30 --device cuda --output runs/pipeline-smollm2
    python examples/pipeline.py --target smollm2-135m --minutes 2 --output runs/pipeline-tiny   # a CPU try-out

The budget is wall-clock minutes, split from measured rates: the first batch of the target's answers
to training prompts (ShareGPT first turns and the code corpus's requests, evaluation overlap
excluded; the feature cache comes out of the same forwards) prices an answer, two training steps
price a step, and the plan buys as many answers as the budget allows at --max-epochs passes over
them for a 2-layer drafter initialised from the target's layers, after reserving the learning
curve: drafter-alone tau (J1, budget 16, full blocks, policy off) of the checkpoints on held-out
MT-Bench turns. One progress bar shows seconds against the budget with the phase and its counts.
The output folder gets ``drafter/`` (Hub-ready), ``learning_curve.json``, ``pipeline.json`` (with
the plan and its rates) and the cache.
The library call is :func:`hf_jetspec.training.pipeline.run_pipeline`.
"""

from __future__ import annotations

import argparse

from hf_jetspec import load_target
from hf_jetspec.tools.bench import build_items
from hf_jetspec.data import load_eval_prompts
from hf_jetspec.training.pipeline import PipelineConfig, run_pipeline
from hf_jetspec.training.regenerate import RegenerationConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: the loader's choice)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--max-epochs", type=float, default=4.0, help="passes over the answers while there is time to regenerate")
    ap.add_argument("--regen-batch-size", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--draft-vocab", type=int, default=8192, help="0 keeps the full head")
    ap.add_argument("--curve-points", type=int, default=4)
    ap.add_argument("--eval-prompts", type=int, default=6, help="held-out MT-Bench questions (offset 20) for the curve")
    ap.add_argument("--eval-new-tokens", type=int, default=64)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    kwargs = {"device": args.device} if args.device else {}
    target, tokenizer = load_target(args.target, dtype=args.dtype, **kwargs)
    config = PipelineConfig(
        minutes=args.minutes, max_epochs=args.max_epochs,
        regeneration=RegenerationConfig(num_prompts=100_000, max_new_tokens=args.max_new_tokens, batch_size=args.regen_batch_size),
        draft_vocab=args.draft_vocab or None, batch_size=args.batch_size, lr=args.lr, curve_points=args.curve_points,
        eval_new_tokens=args.eval_new_tokens, bf16=str(target.dtype) == "torch.bfloat16",
    )
    items = build_items(tokenizer, target, load_eval_prompts("mt-bench", limit=args.eval_prompts, offset=20), args.eval_new_tokens)
    result = run_pipeline(target, tokenizer, args.output, config, items, args.target)
    print(f"{result.regenerated_sequences} regenerated sequences ({result.generated_tokens} tokens, {result.regenerate_tokens_per_s} tok/s), "
          f"{result.train_steps} training steps in {result.train_seconds} s, final tau {result.final_tau}; drafter in {result.drafter_folder}")


if __name__ == "__main__":
    main()
