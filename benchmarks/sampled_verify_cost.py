"""What verifying a sampled chain round costs, by verifier, at the block lengths rounds use.

    python benchmarks/sampled_verify_cost.py --vocab 49152 --output benchmarks/results/sampled_verify_cost_smollm2.json

Three ways to verify L point-mass drafts (argmax or n-gram tokens) against the target's processed
logits [L + 1, V] under sampling, each timed warm (median of repeats, milliseconds):

- ``exact_match``: transformers' path without candidate logits: a softmax over every row, one
  ``torch.multinomial`` draw per row, keep the drafts while they equal the draws;
- ``point_mass_transformers``: point-mass candidate logits through transformers' ``_speculative_sampling``;
- ``point_mass_ours``: point-mass candidate logits through :func:`hf_jetspec.generation.sampled_drafting.speculative_verify`
  told they are point masses (what JetSpec chain rounds do: the seam recognises the generator's own
  tensor), so ``q`` is built but not read.

All three follow the same law; the logits processors that run before them are the same in each and
are not timed. Two more columns time the target's processors (temperature 0.7, top-k 50, top-p 0.9,
transformers' sampling defaults with the benchmarks' temperature and top-p) together with
``point_mass_ours``:

- ``processed_every_row``: the processors on each of the L + 1 rows, as transformers' chain loop
  applies them, then the verifier;
- ``processed_lazily``: the verifier applying them itself, row by row through the row it draws from
  (what JetSpec chain rounds do under sampling, ``seam._DeferredProcessors``). The logits are random with half the vocabulary cut to ``-inf`` (the shape after top-p),
and each draft's logit is raised by ``--draft-boost``: by default every draft is accepted, the
slowest case for ``point_mass_ours``, which stops normalising rows at the first rejection.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import transformers.generation.utils as generation_utils

from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from hf_jetspec.generation.sampled_drafting import point_mass_logits, speculative_verify


def timed(fn, iters: int, repeats: int) -> float:
    for _ in range(3):
        fn()
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        runs.append((time.perf_counter() - t) / iters * 1000)
    return round(statistics.median(runs), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152, help="the target's vocabulary (SmolLM2 49,152; Qwen2.5 151,936)")
    ap.add_argument("--lengths", default="1,3,7,15")
    ap.add_argument("--draft-boost", type=float, default=30.0,
                    help="added to each draft's logit: 30 makes every draft certain, so all L rows are verified "
                         "(the slowest case for a verifier that stops at the first rejection)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    # the original function, also when hf_jetspec's seam has wrapped it
    tf_verify = getattr(generation_utils._speculative_sampling, "__wrapped__", generation_utils._speculative_sampling)
    torch.manual_seed(0)
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        logits = torch.randn(1, length + 1, args.vocab) * 4 / 0.7
        logits[..., args.vocab // 2:] = float("-inf")
        drafts = logits[0, :length].argmax(-1)
        logits[0, torch.arange(length), drafts] += args.draft_boost  # the drafts carry most of the mass
        candidates = torch.cat([torch.zeros(1, 8, dtype=torch.long), drafts[None]], dim=1)

        def exact_match():
            drawn = torch.multinomial(logits.softmax(-1)[0], 1).squeeze(1)
            n = int(((drafts != drawn[:-1]).cumsum(-1) < 1).sum())
            return drawn[: n + 1]

        row = {"L": length,
               "exact_match": timed(exact_match, args.iters, args.repeats),
               "point_mass_transformers": timed(lambda: tf_verify(candidates, point_mass_logits(drafts, args.vocab), length, logits),
                                                args.iters, args.repeats),
               "point_mass_ours": timed(lambda: speculative_verify(drafts, point_mass_logits(drafts, args.vocab)[0], logits[0],
                                                                   point_masses=True), args.iters, args.repeats)}
        processors = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(50), TopPLogitsWarper(0.9)])
        raw = logits * 0.7  # processed again by the temperature
        start = candidates.shape[1] - length

        def processed_every_row():
            block = raw.clone()
            for i in range(length + 1):
                block[:, i, :] = processors(candidates[:, :start + i], block[:, i, :])
            return speculative_verify(drafts, point_mass_logits(drafts, args.vocab)[0], block[0], point_masses=True)

        def processed_lazily():
            block = raw.clone()

            def process_row(i):
                block[:, i, :] = processors(candidates[:, :start + i], block[:, i, :])

            return speculative_verify(drafts, point_mass_logits(drafts, args.vocab)[0], block[0], point_masses=True,
                                      process_row=process_row)

        row["processed_every_row"] = timed(processed_every_row, args.iters, args.repeats)
        row["processed_lazily"] = timed(processed_lazily, args.iters, args.repeats)
        rows.append(row)
        print(json.dumps(row))
    with open(args.output, "w") as f:
        json.dump({"vocab": args.vocab, "draft_boost": args.draft_boost, "rows": rows, "unit": "ms", "torch": torch.__version__, "threads": torch.get_num_threads(),
                   "machine": platform.processor() or platform.machine()}, f, indent=1)


if __name__ == "__main__":
    main()
