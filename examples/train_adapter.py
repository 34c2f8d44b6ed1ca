"""Train a foresight adapter for a drafter's read layers on the ShareGPT corpus.

    python examples/train_adapter.py --target smollm2-135m --drafter hub_cards/jetspec-smollm2-135m \
        --max-steps 200 --output-dir runs/smollm2-adapter

The adapter predicts the target's states at the layers the drafter reads, so it depends on the
drafter's ``target_layer_ids`` only (not on its weights). Runs on CPU as is and on GPUs with
`accelerate launch` (add --bf16); rerunning resumes from the latest checkpoint; the final adapter
is written to --output-dir/final as a Hub-ready folder.
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers.trainer_utils import get_last_checkpoint

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.foresight import ForesightAdapter
from hf_jetspec.training.adapter_trainer import ForesightAdapterTrainer, ForesightTrainingArguments
from hf_jetspec.training.corpus import CorpusCollator, load_training_corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", required=True, help="drafter folder whose read layers the adapter predicts")
    ap.add_argument("--corpus", default="sharegpt")
    ap.add_argument("--layers-per-module", type=int, default=1)
    ap.add_argument("--source-layers", default=None,
                    help="target layers copied into each module, modules separated by ';' (e.g. '1;8;14;21;25,26,27'); overrides --layers-per-module")
    ap.add_argument("--num-sequences", type=int, default=2000)
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--blocks-per-sequence", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--save-steps", type=int, default=50)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float32"],
                    help="the frozen target's dtype (auto: bf16 where the CPU/GPU has native bf16); the recorded recipes used float32")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = JetSpecDrafter.from_pretrained(args.drafter, dtype=torch.float32)
    drafter.attach_target(target, follow_dtype=False)
    corpus = load_training_corpus(tokenizer, args.corpus, args.num_sequences, args.seq_len, args.seed)
    print(f"{len(corpus)} training sequences, {sum(len(c['input_ids']) for c in corpus)} tokens")
    overrides = {}
    if args.source_layers:
        overrides["source_layers"] = [[int(x) for x in part.split(",")] for part in args.source_layers.split(";")]
    adapter = ForesightAdapter.for_drafter(drafter, layers_per_module=args.layers_per_module, **overrides)

    targs = ForesightTrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=min(20, args.max_steps // 10),
        weight_decay=0.0,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        logging_steps=10,
        report_to=[],
        bf16=args.bf16,
        use_cpu=not torch.cuda.is_available(),  # Trainer accepts bf16 on a CPU only when told it is one
        dataloader_num_workers=0,
        seed=args.seed,
        blocks_per_sequence=args.blocks_per_sequence,
    )
    trainer = ForesightAdapterTrainer(
        model=adapter,
        args=targs,
        target=target,
        train_dataset=corpus,
        data_collator=CorpusCollator(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
    )
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)
    final = os.path.join(args.output_dir, "final")
    adapter.save_pretrained(final)
    print(f"saved {final}")


if __name__ == "__main__":
    main()
