"""Train a JetSpec++ drafter for an embedded target on the ShareGPT corpus.

    python examples/train_drafter.py --target smollm2-135m --corpus sharegpt --labels corpus \
        --inputs jacobi --max-steps 600 --output-dir runs/smollm2-corpus

Runs on the CPU as is, and on GPUs / several machines with `accelerate launch` (add --bf16).
Checkpoints land in --output-dir every --save-steps; rerunning the same command resumes from the
latest one. The final drafter is written to --output-dir/final as a Hub-ready folder.
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers.trainer_utils import get_last_checkpoint

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.data import frequent_response_tokens
from hf_jetspec.training import JetSpecTrainer, JetSpecTrainingArguments
from hf_jetspec.training.corpus import CorpusCollator, load_training_corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--corpus", default="sharegpt", help="'sharegpt' or a local JSONL of {'messages': [...]} chats")
    ap.add_argument("--labels", default="corpus", choices=["corpus", "erase", "alr", "alr+ira"])
    ap.add_argument("--inputs", default="jacobi", choices=["jacobi", "noised", "mask"], help="'mask' = noised blocks with mask inputs")
    ap.add_argument("--attention", default="causal", choices=["causal", "bidirectional"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--init-layers-from-target", action="store_true")
    ap.add_argument("--init-from", default=None, help="start from a trained drafter folder (e.g. an earlier run's final/)")
    ap.add_argument("--draft-vocab-from-sharegpt", type=int, default=None, metavar="N",
                    help="train with the draft head restricted to the N most frequent tokens of ShareGPT responses (cuts the head's cost)")
    ap.add_argument("--slot-decay", type=float, default=7.0, help="slot weights exp(-(k-1)/decay); 0 for flat")
    ap.add_argument("--num-sequences", type=int, default=4000)
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--blocks-per-sequence", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-steps", type=int, default=600)
    ap.add_argument("--save-steps", type=int, default=50)
    ap.add_argument("--save-total-limit", type=int, default=None, help="keep only the latest N checkpoints (default: keep all, for the learning curve)")
    ap.add_argument("--divergence", default="forward_kl")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", required=True)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    target, tokenizer = load_target(args.target)
    corpus = load_training_corpus(tokenizer, args.corpus, args.num_sequences, args.seq_len, args.seed)
    print(f"{len(corpus)} training sequences, {sum(len(c['input_ids']) for c in corpus)} tokens")

    overrides = {"num_hidden_layers": args.layers, "attention": args.attention}
    if args.inputs == "mask":
        overrides["block_inputs"] = "mask"
    if args.init_from:
        drafter = JetSpecDrafter.from_pretrained(args.init_from, dtype=torch.float32)
        drafter.attach_target(target)
    else:
        drafter = JetSpecDrafter.for_target(target, init_layers_from_target=args.init_layers_from_target, **overrides)
    if args.draft_vocab_from_sharegpt:
        drafter.restrict_draft_vocab(frequent_response_tokens(tokenizer, args.draft_vocab_from_sharegpt))

    targs = JetSpecTrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=min(50, args.max_steps // 10),
        weight_decay=0.0,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        logging_steps=10,
        report_to=[],
        bf16=args.bf16,
        dataloader_num_workers=0,
        seed=args.seed,
        labels=args.labels,
        block_inputs="noised" if args.inputs in ("noised", "mask") else "jacobi",
        blocks_per_sequence=args.blocks_per_sequence,
        divergence=args.divergence,
        slot_decay=args.slot_decay or None,
    )
    trainer = JetSpecTrainer(
        model=drafter,
        args=targs,
        target=target,
        train_dataset=corpus,
        data_collator=CorpusCollator(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
    )
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)
    final = os.path.join(args.output_dir, "final")
    drafter.save_pretrained(final)
    print(f"saved {final}")


if __name__ == "__main__":
    main()
