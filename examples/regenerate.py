"""Regenerate training data with the target itself: its own answers to training prompts, cached as they are generated.

    python examples/regenerate.py --target smollm2-135m --drafter hub_cards/jetspec-smollm2-135m \
        --num-prompts 2000 --max-new-tokens 256 --batch-size 32 --output runs/regen-smollm2

Prompts are ShareGPT first user turns and the offline code corpus's requests, taken in turn, with
every prompt that shares a long line with an evaluation prompt left out. The target answers in
batches (greedy; --sampled-share S answers that share by sampling at --temperature), and the same
forwards write the feature cache that ``examples/train_drafter.py --feature-cache DIR`` trains on
(read-layer states, top-k log-probabilities): no second target pass. Shards are written as they
fill; rerun with --resume to continue an interrupted run. ``regeneration.json`` records the target,
dtype, sources and counts, prompt hashes and throughput. --device cuda runs it on a GPU unchanged.
"""

from __future__ import annotations

import argparse

from hf_jetspec import load_target
from hf_jetspec.tools.environment import describe_environment
from hf_jetspec.training.feature_cache import read_layer_ids
from hf_jetspec.training.regenerate import ALL_SOURCES, SOURCES, RegenerationConfig, regenerate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=None, help="drafter folder whose read layers to store (default: the default read layers)")
    ap.add_argument("--layers", default=None, help="comma list of target layers to store (overrides --drafter)")
    ap.add_argument("--sources", default=",".join(SOURCES), help=f"comma list of {ALL_SOURCES}")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32, help="32 measured fastest for SmolLM2-135M on 2 CPU cores")
    ap.add_argument("--sampled-share", type=float, default=0.0, help="share of prompts answered by sampling (the rest greedily)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=64, help="next-token log-probabilities kept per position")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-sequences", type=int, default=128)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"], help="auto: bf16 where the CPU/GPU has it natively")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: the loader's choice)")
    ap.add_argument("--states-storage", default="auto", choices=["auto", "float16", "bfloat16", "float8_e4m3fn"],
                    help="how read-layer states are stored (auto: the target's 16-bit dtype); float8_e4m3fn halves the disk, scaled per layer")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    kwargs = {"device": args.device} if args.device else {}
    target, tokenizer = load_target(args.target, dtype=args.dtype, **kwargs)
    layer_ids = read_layer_ids(target, args.layers, args.drafter)
    config = RegenerationConfig(
        sources=tuple(s.strip() for s in args.sources.split(",")), num_prompts=args.num_prompts, max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, sampled_share=args.sampled_share, temperature=args.temperature,
        top_k=args.top_k, seed=args.seed, shard_sequences=args.shard_sequences,
        states_dtype=args.states_storage if args.states_storage != "auto" else "bfloat16" if str(target.dtype) == "torch.bfloat16" else "float16",
    )
    env = describe_environment(target.device)
    machine = {k: env[k] for k in ("cpu", "threads", "native_bf16", "torch", "transformers", "date") if k in env}
    manifest = regenerate(target, tokenizer, args.output, layer_ids, config, target_name=args.target, resume=args.resume,
                          machine=machine)
    print(f"{manifest.num_sequences} sequences ({manifest.greedy} greedy, {manifest.sampled} sampled), {manifest.generated_tokens} "
          f"generated tokens at {manifest.tokens_per_s:.1f} tok/s, in {args.output}")


if __name__ == "__main__":
    main()
