"""Build an offline feature cache for drafter training: one target forward over the corpus.

    python examples/cache_features.py --target smollm2-135m --drafter hub_cards/jetspec-smollm2-135m \
        --num-sequences 2000 --seq-len 384 --top-k 64 --output runs/features-smollm2-2000

Stores the target's states at the drafter's read layers (float16) and its top-k next-token
log-probabilities (plus the corpus token's own) for every position; train on it with
``examples/train_drafter.py --feature-cache DIR`` (corpus / erase labels), as many epochs as wanted.
The corpus selection (--corpus, --num-sequences, --seq-len, --seed) is the training script's.
The index is rewritten after every shard; --resume continues an interrupted cache (the same
corpus options), and with --source-order a larger --num-sequences grows it.
"""

from __future__ import annotations

import argparse

import torch

from hf_jetspec import load_target
from hf_jetspec.training import build_feature_cache
from hf_jetspec.training.feature_cache import read_layer_ids
from hf_jetspec.training.corpus import load_training_corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=None, help="drafter folder whose read layers to store (default: the default read layers)")
    ap.add_argument("--corpus", default="sharegpt")
    ap.add_argument("--num-sequences", type=int, default=2000)
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-sequences", type=int, default=0, help="skip this many qualifying chats first (fresh data after an earlier cache)")
    ap.add_argument("--top-k", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--shard-sequences", type=int, default=256, help="sequences per shard (the index is rewritten after each)")
    ap.add_argument("--resume", action="store_true", help="continue the cache in --output (same corpus options; with --source-order, more sequences)")
    ap.add_argument("--source-order", action="store_true",
                    help="keep the corpus in file order instead of shuffling it with --seed (training shuffles anyway), so that "
                         "a larger --num-sequences extends the same list: how a cache grows over several --resume runs")
    ap.add_argument("--layers", default=None, help="comma list of target layers to store (default: the drafter's, or the default read layers)")
    ap.add_argument("--states-dtype", default="float16", choices=["float16", "bfloat16", "float8_e4m3fn"],
                    help="bfloat16 keeps a bf16 target's large activations; float8_e4m3fn halves the disk (scaled per layer)")
    ap.add_argument("--output", required=True)
    ap.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float32"],
                    help="the frozen target's dtype (auto: bf16 where the CPU/GPU has native bf16); the recorded recipes used float32")
    args = ap.parse_args()

    target, tokenizer = load_target(args.target, dtype=args.dtype)
    layer_ids = read_layer_ids(target, args.layers, args.drafter)
    corpus = load_training_corpus(tokenizer, args.corpus, args.num_sequences, args.seq_len, args.seed, skip=args.skip_sequences,
                                  shuffle=not args.source_order)
    order = "source" if args.source_order else f"shuffled:{args.seed}"
    with torch.no_grad():
        info = build_feature_cache(target, corpus, layer_ids, args.output, top_k=args.top_k, batch_size=args.batch_size,
                                   shard_sequences=args.shard_sequences, resume=args.resume, states_dtype=getattr(torch, args.states_dtype),
                                   corpus_order=order)
    print(f"cached {info.num_sequences} sequences ({info.num_tokens} tokens, layers {layer_ids}, top-{info.top_k}) in {args.output}")


if __name__ == "__main__":
    main()
