"""Train a JetSpec++ drafter for an embedded target on the ShareGPT corpus.

    python examples/train_drafter.py --target smollm2-135m --corpus sharegpt --labels corpus \
        --inputs jacobi --max-steps 600 --output-dir runs/smollm2-corpus

Runs on the CPU as is, and on GPUs / several machines with `accelerate launch` (add --bf16).
Checkpoints land in --output-dir every --save-steps; rerunning the same command resumes from the
latest one. The final drafter is written to --output-dir/final as a Hub-ready folder.

With --answers DIR (an answer corpus, examples/regenerate.py --answers) the drafter trains on the
target's own answers, committed as token ids; the target's features are computed from them in
every step, so nothing large is written to disk.

With --feature-cache DIR (built by examples/cache_features.py) the target's states and top-k
distributions are read from disk instead of computed in every step (corpus / erase labels), so
several epochs over one corpus cost the target forward once. --lora-rank R trains low-rank updates
of the drafter's layers (peft), merged into the saved drafter.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from transformers.trainer_utils import get_last_checkpoint

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.data import frequent_response_tokens
from hf_jetspec.training import FeatureCacheCollator, FeatureCacheDataset, JetSpecTrainer, JetSpecTrainingArguments
from hf_jetspec.drafter.draft_vocab import widen_by_counts
from hf_jetspec.training.feature_cache import cached_answer_counts, frequent_cached_tokens
from hf_jetspec.training.corpus import CorpusCollator, load_training_corpus
from hf_jetspec.training.lora import lora_drafter, merged_drafter


def check_resumable(checkpoint: str, drafter) -> None:
    """Refuse, by name, to resume a checkpoint whose drafter has another shape than the one this
    command built (e.g. a changed ``--widen-draft-vocab`` or ``--layers`` with the same ``--output-dir``)."""
    import json

    path = os.path.join(checkpoint, "config.json")
    if not os.path.isfile(path):  # a LoRA checkpoint holds only its adapter
        return
    with open(path) as f:
        saved = json.load(f)
    mine = drafter.config.to_dict()
    keys = ("draft_vocab_size", "num_hidden_layers", "hidden_size", "intermediate_size", "target_layer_ids", "block_size")
    changed = [f"{k} {saved.get(k)} -> {mine.get(k)}" for k in keys if saved.get(k) != mine.get(k)]
    if changed:
        raise SystemExit(f"{checkpoint} holds a drafter of another shape ({', '.join(changed)}): "
                         "resume with the options it was started with, or choose a new --output-dir")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--corpus", default="sharegpt", help="'sharegpt' or a local JSONL of {'messages': [...]} chats")
    ap.add_argument("--labels", default="corpus", choices=["corpus", "erase", "alr", "alr+ira"])
    ap.add_argument("--inputs", default="jacobi", choices=["jacobi", "noised", "mask"], help="'mask' = noised blocks with mask inputs")
    ap.add_argument("--attention", default="causal", choices=["causal", "bidirectional"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--read-layers", default=None, help="comma list of target layers the drafter reads (default: evenly spread)")
    ap.add_argument("--intermediate-size", type=int, default=None, help="the drafter layers' MLP width (default 4 x hidden)")
    ap.add_argument("--draft-vocab-from-cache", type=int, default=None, metavar="N",
                    help="with --feature-cache: restrict the draft head to the N most frequent response tokens of the cache")
    ap.add_argument("--dflash-layout", type=int, default=None, metavar="MASK_TOKEN_ID",
                    help="the DFlash / MuseGlimmerAssistant layer layout (per-head q/k norms, context keys without the "
                         "input norm, noise = the target's embedding of MASK_TOKEN_ID), so the drafter converts to "
                         "transformers' DFlash format; implies --inputs mask")
    ap.add_argument("--init-layers-from-target", action="store_true")
    ap.add_argument("--grow-layers", type=int, default=0,
                    help="with --init-from: append N layers whose residual outputs start at zero (the drafter starts as it was)")
    ap.add_argument("--init-from", default=None, help="start from a trained drafter folder (e.g. an earlier run's final/)")
    ap.add_argument("--draft-vocab-from-sharegpt", type=int, default=None, metavar="N",
                    help="train with the draft head restricted to the N most frequent tokens of ShareGPT responses (cuts the head's cost)")
    ap.add_argument("--widen-draft-vocab", type=int, default=None, metavar="N",
                    help="with --init-from a restricted drafter: keep its draft vocabulary and add the most frequent response "
                         "tokens of --feature-cache (then of ShareGPT responses) until it holds N ids")
    ap.add_argument("--slot-decay", type=float, default=7.0, help="slot weights exp(-(k-1)/decay); 0 for flat")
    ap.add_argument("--truncated-blocks", type=float, default=0.0, metavar="SHARE",
                    help="bidirectional drafters: train this share of blocks drafted at a shorter length, as a server asked for "
                         "fewer draft tokens (vLLM's num_speculative_tokens) builds them")
    ap.add_argument("--num-sequences", type=int, default=4000)
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--blocks-per-sequence", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-steps", type=int, default=600)
    ap.add_argument("--save-steps", type=int, default=50)
    ap.add_argument("--save-total-limit", type=int, default=None, help="keep only the latest N checkpoints (default: keep all, for the learning curve)")
    ap.add_argument("--divergence", default="forward_kl")
    ap.add_argument("--answers", default=None,
                    help="train on an answer corpus (examples/regenerate.py --answers): the target's own answers as token ids, "
                         "the target's features computed in every step (no cache on disk)")
    ap.add_argument("--answers-limit", type=int, default=None, help="with --answers: the corpus's first N answers only")
    ap.add_argument("--answers-prompt-cache", default="runs/answer-prompts", help="with --answers: where the rebuilt prompts are kept")
    ap.add_argument("--feature-cache", default=None, help="train on an offline feature cache (examples/cache_features.py) instead of --corpus")
    ap.add_argument("--cache-sequences", type=int, default=None,
                    help="with --feature-cache: train on its first N sequences only (a cache that grew since trains as it was)")
    ap.add_argument("--num-epochs", type=float, default=None, help="epochs over the training set (the cache, the answers or the corpus; overrides --max-steps)")
    ap.add_argument("--lora-rank", type=int, default=None, help="train LoRA updates of this rank on the drafter layers (merged at the end)")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float32"],
                    help="the frozen target's dtype (auto: bf16 where the CPU/GPU has native bf16); the recorded recipes used float32")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    overrides = {"num_hidden_layers": args.layers, "attention": args.attention}
    if args.read_layers:
        overrides["target_layer_ids"] = [int(x) for x in args.read_layers.split(",")]
    if args.intermediate_size:
        overrides["intermediate_size"] = args.intermediate_size
    if args.dflash_layout is not None:
        args.inputs = "mask"
        overrides.update(qk_norm=True, context_input_norm=False, mask_token_id=args.dflash_layout, row_predicts="self")
    if args.inputs == "mask":
        overrides["block_inputs"] = "mask"
    if args.init_from:
        drafter = JetSpecDrafter.from_pretrained(args.init_from, dtype=torch.float32)
        drafter.attach_target(target, follow_dtype=False)
        if args.grow_layers:
            drafter.grow_layers(args.grow_layers, target=target if args.init_layers_from_target else None)
            print(f"grown to {drafter.config.num_hidden_layers} layers")
    elif args.grow_layers:
        raise SystemExit("--grow-layers needs --init-from")
    else:
        drafter = JetSpecDrafter.for_target(target, init_layers_from_target=args.init_layers_from_target, **overrides)
    if args.answers and args.feature_cache:
        raise SystemExit("--answers and --feature-cache are two sources of training data: give one")
    if args.answers:
        from hf_jetspec.training.answer_corpus import AnswerCorpusDataset

        corpus = AnswerCorpusDataset(args.answers, tokenizer, prompt_cache=args.answers_prompt_cache, limit=args.answers_limit)
        collator = CorpusCollator(pad_id)
        print(f"{len(corpus)} answers of {corpus.manifest.target} ({sum(len(r.answer_ids) for r in corpus.rows)} answer tokens), "
              "target features computed in every step")
    elif args.feature_cache:
        corpus = FeatureCacheDataset(args.feature_cache, layer_ids=drafter.config.target_layer_ids, max_sequences=args.cache_sequences)
        collator = FeatureCacheCollator(pad_id)
        tokens = f"{corpus.info.num_tokens} tokens" if args.cache_sequences is None else f"the first {len(corpus)} of {corpus.info.num_sequences}"
        print(f"{len(corpus)} cached training sequences ({tokens}), top-{corpus.info.top_k} target distributions")
    else:
        corpus, collator = load_training_corpus(tokenizer, args.corpus, args.num_sequences, args.seq_len, args.seed), CorpusCollator(pad_id)
        print(f"{len(corpus)} training sequences, {sum(len(c['input_ids']) for c in corpus)} tokens")
    if args.draft_vocab_from_sharegpt:
        drafter.restrict_draft_vocab(frequent_response_tokens(tokenizer, args.draft_vocab_from_sharegpt))
    elif args.draft_vocab_from_cache:
        if not args.feature_cache:
            raise SystemExit("--draft-vocab-from-cache needs --feature-cache")
        drafter.restrict_draft_vocab(frequent_cached_tokens(corpus, args.draft_vocab_from_cache))
    if args.widen_draft_vocab:
        counts = cached_answer_counts(corpus) if args.feature_cache else None
        print(widen_by_counts(drafter, args.widen_draft_vocab, counts,
                              lambda: frequent_response_tokens(tokenizer, args.widen_draft_vocab)))
    model = lora_drafter(drafter, rank=args.lora_rank) if args.lora_rank else drafter
    max_steps = args.max_steps
    if args.num_epochs is not None:
        max_steps = int(args.num_epochs * len(corpus) / args.batch_size)

    targs = JetSpecTrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=min(50, max_steps // 10),
        weight_decay=0.0,
        max_steps=max_steps,
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        logging_steps=10,
        report_to=[],
        bf16=args.bf16,
        use_cpu=not torch.cuda.is_available(),  # Trainer accepts bf16 on a CPU only when told it is one
        dataloader_num_workers=0,
        seed=args.seed,
        labels=args.labels,
        block_inputs="noised" if args.inputs in ("noised", "mask") else "jacobi",
        blocks_per_sequence=args.blocks_per_sequence,
        divergence=args.divergence,
        slot_decay=args.slot_decay or None,
        truncated_blocks=args.truncated_blocks,
    )
    trainer = JetSpecTrainer(model=model, args=targs, target=target, train_dataset=corpus, data_collator=collator)
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    if last is not None:
        check_resumable(last, drafter)
    metrics = trainer.train(resume_from_checkpoint=last).metrics
    with open(os.path.join(args.output_dir, "train_metrics.json"), "w") as f:  # cpu_hours: every stint of the run, all threads
        json.dump(metrics, f, indent=1)
    final = os.path.join(args.output_dir, "final")
    merged_drafter(model).save_pretrained(final)
    print(f"saved {final}")


if __name__ == "__main__":
    main()
