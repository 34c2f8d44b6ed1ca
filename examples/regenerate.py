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

With --answers the run keeps the answers' token ids alone, as the committed, Hub-ready corpus that
``examples/train_drafter.py --answers DIR`` trains on (the target's features are recomputed in the
training loop): brotli parquet shards of --shard-sequences rows with a manifest and a dataset card.
It always resumes after the shards already in --output, and --git-commit commits each shard (with
the manifest and card) as it is written, so a campaign survives its machine:

    python examples/regenerate.py --answers --target smollm2-135m --sources sharegpt,code,sharegpt-turns \
        --num-prompts 30000 --max-prompt-tokens 256 --max-new-tokens 256 --batch-size 32 --sampled-share 0.2 \
        --temperature 0.7 --shard-sequences 512 --dtype bfloat16 --output hub_cards/jetspec-smollm2-135m-answers --git-commit
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time

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
    ap.add_argument("--answers", action="store_true", help="keep the answers' token ids alone, as a committed parquet corpus (no features)")
    ap.add_argument("--git-commit", action="store_true", help="with --answers: commit each shard, its manifest and card as written")
    ap.add_argument("--prompt-cache", default="runs/answer-prompts", help="with --answers: where the prompt selection is kept")
    ap.add_argument("--hours", type=float, default=None, help="stop starting batches after this many hours (the shards stay whole)")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    if args.git_commit and not args.answers:
        ap.error("--git-commit commits answer shards: add --answers")
    if args.answers:
        return answers(args)

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


def git_commit(folder: str):
    """Commit a shard with the corpus's manifest and card, and nothing else that is staged (retried
    while another git command holds the index)."""
    from hf_jetspec.training.answer_corpus import CARD, MANIFEST

    def commit(path: str) -> None:
        files = [path, os.path.join(folder, MANIFEST), os.path.join(folder, CARD)]
        message = f"Answer corpus: {os.path.basename(path)}"
        for _ in range(30):
            added = subprocess.run(["git", "add", "--", *files], capture_output=True)
            if added.returncode == 0 and subprocess.run(["git", "commit", "-q", "-m", message, "--", *files],
                                                        capture_output=True).returncode == 0:
                return
            time.sleep(5)
        print(f"warning: could not commit {path}; commit it by hand", file=sys.stderr)

    return commit


def answers(args) -> None:
    from hf_jetspec.tools.targets import resolve_embedded
    from hf_jetspec.training.answer_corpus import regenerate_answers, revision_string

    kwargs = {"device": args.device} if args.device else {}
    target, tokenizer = load_target(args.target, dtype=args.dtype, **kwargs)
    embedded = resolve_embedded(args.target)
    revision = revision_string(embedded.hub_id, embedded.gguf_name) if embedded else str(getattr(target, "name_or_path", args.target))
    config = RegenerationConfig(
        sources=tuple(s.strip() for s in args.sources.split(",")), num_prompts=args.num_prompts, max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, sampled_share=args.sampled_share, temperature=args.temperature,
        seed=args.seed, shard_sequences=args.shard_sequences,
    )
    env = describe_environment(target.device)
    machine = {k: env[k] for k in ("cpu", "threads", "native_bf16", "torch", "transformers", "date") if k in env}
    command = "python examples/regenerate.py " + " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "--resume")
    deadline = time.perf_counter() + args.hours * 3600 if args.hours else None
    manifest = regenerate_answers(target, tokenizer, args.output, config, embedded.name if embedded else args.target, revision,
                                  prompt_cache=args.prompt_cache, deadline=deadline, machine=machine, command=command,
                                  on_shard=git_commit(args.output) if args.git_commit else None)
    print(f"{manifest.rows} answers ({manifest.greedy} greedy, {manifest.sampled} sampled), {manifest.answer_tokens} answer tokens, "
          f"{manifest.bytes / 1e6:.2f} MB, {manifest.cpu_seconds / 3600:.2f} CPU-hours, in {args.output}")


if __name__ == "__main__":
    main()
