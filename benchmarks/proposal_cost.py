"""What shaping and drawing a sampled block's proposal costs: the general path against the draft-vocabulary path.

    python benchmarks/proposal_cost.py --output benchmarks/results/proposal_cost.json

One block of 15 rows of bf16 draft logits over a restricted draft vocabulary of 8,192 ids (the
shipped SmolLM2 drafter's) in a 49,152-id target vocabulary, T = 0.7 and top-p 0.9, sharpness 2:
- general: logits placed in the target's vocabulary, transformers' own processors over all of it,
  ``torch.multinomial`` per row (what a sampled round first did);
- draft vocabulary: :func:`hf_jetspec.generation.sampled_drafting.make_proposal` (the warpers on the draft
  vocabulary, top-p's nucleus looked for among the top 256) and :meth:`Proposal.sample` (one
  uniform per row against the cumulative distribution), plus the dense logits handed to transformers;
- with a repetition penalty, which reads token ids and so takes the general path.
Milliseconds per block, median of repeated calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def median_ms(fn, repeats: int = 50) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times), 3)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=15)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopPLogitsWarper

    from hf_jetspec.tools.environment import describe_environment
    from hf_jetspec.generation.sampled_drafting import full_vocab_logits, make_proposal

    torch.manual_seed(0)
    logits = torch.randn(args.rows, args.draft_vocab).to(torch.bfloat16) * 3
    vocab = torch.randperm(args.vocab)[: args.draft_vocab]
    ids = torch.randint(0, args.vocab, (1, 300))
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)])
    with_penalty = LogitsProcessorList([*warpers, RepetitionPenaltyLogitsProcessor(1.1)])

    def general():
        q = warpers(ids.expand(args.rows, -1), full_vocab_logits(logits * 2.0, vocab, args.vocab))
        return torch.multinomial(torch.softmax(q, -1), 1)

    def draft_vocab(processors):
        def run():
            q = make_proposal(logits, vocab, args.vocab, ids, processors, 2.0)
            return q.sample(), q.dense_logits()
        return run

    rows = {
        "general path (transformers' warpers over the target vocabulary, torch.multinomial)": median_ms(general),
        "draft-vocabulary path (make_proposal + Proposal.sample + dense logits)": median_ms(draft_vocab(warpers)),
        "with a repetition penalty (general path through make_proposal)": median_ms(draft_vocab(with_penalty)),
    }
    for name, ms in rows.items():
        print(f"{ms:8.3f} ms  {name}")
    result = {"command": "python benchmarks/proposal_cost.py " + " ".join(argv or __import__("sys").argv[1:]),
              "rows": args.rows, "draft_vocab": args.draft_vocab, "vocab": args.vocab, "ms_per_block": rows,
              "environment": describe_environment(torch.device("cpu"))}
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
