"""How many draws the sampling-law tests need: the chi-square p-value of each deliberately wrong
verifier of the test suite, after 400 to 2,000 draws.

The law tests (``tests/test_sampling_exactness.py``, ``tests/test_tree_decoding.py``) compare the
first tokens of many sampled ``generate`` calls with the target's exact law, enumerated; a correct
sampler passes at p > 1e-3 and each fault must fail at p < 1e-3. Fewer draws make the suite faster
and the faults harder to see; this measures how much harder::

    python benchmarks/law_test_power.py --output benchmarks/results/law_test_power.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_sampling_exactness as tse  # noqa: E402
import test_tree_decoding as ttd  # noqa: E402
from transformers.generation.logits_process import TemperatureLogitsWarper  # noqa: E402

import hf_jetspec.generation.candidate_generator as cg  # noqa: E402
import hf_jetspec.generation.sampled_drafting as sd  # noqa: E402
import hf_jetspec.generation.tree as tree_mod  # noqa: E402
import hf_jetspec.generation.tree_decoding as td  # noqa: E402
import transformers.generation.utils as gen_utils  # noqa: E402

PREFIXES = (400, 600, 800, 1000, 1500, 2000)


def draws(target, drafter, n: int) -> list[tuple[int, ...]]:
    """The first tokens of ``n`` sampled calls, seeded as the tests seed them."""
    torch.manual_seed(1234)
    out = []
    for _ in range(n):
        ids = target.generate(tse.PROMPT, attention_mask=torch.ones_like(tse.PROMPT), assistant_model=drafter, do_sample=True,
                              max_new_tokens=tse.NEW, min_new_tokens=tse.NEW, temperature=1.0, top_k=0)
        out.append(tuple(ids[0, tse.PROMPT.shape[1]:].tolist()))
    return out


def pvalue(law, keys) -> float:
    counts = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    saved, tse.SAMPLES = tse.SAMPLES, len(keys)
    try:
        return tse.chi2_pvalue(law, counts)
    finally:
        tse.SAMPLES = saved


def faults():
    """(name, module, attribute, replacement, tree drafter?, sampled drafts?) of each test's fault."""
    return [
        ("min(1, q/p) acceptance", gen_utils, "_speculative_sampling", tse.wrong_speculative_sampling(ratio="q/p"), False, True),
        ("correction drawn from p", gen_utils, "_speculative_sampling", tse.wrong_speculative_sampling(residual=False), False, True),
        ("drafter softmax as q of argmax drafts", cg, "JetSpecCandidateGenerator", tse.SoftmaxAsProposal, False, False),
        ("chain verifier without the residual", sd, "speculative_verify", tse.verify_without_residual, False, False),
        ("tree verifier accepts an undrawn sibling", td, "accept_sampled", ttd.accept_an_undrawn_sibling, True, False),
        ("multi-draft verifier without the residual", tree_mod, "_residual", lambda p, token, q: p, True, True),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    target = tse.small_target()
    law = tse.exact_joint(target, [TemperatureLogitsWarper(1.0)])
    rows = []
    for name, module, attribute, replacement, tree, sampled in faults():
        original = getattr(module, attribute)
        setattr(module, attribute, replacement)
        try:
            drafter = ttd._tree_drafter(target) if tree else tse.sharp_drafter(target)
            drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=sampled)
            start = time.perf_counter()
            keys = draws(target, drafter, max(PREFIXES))
            seconds = time.perf_counter() - start
        finally:
            setattr(module, attribute, original)
        row = {"fault": name, "pvalue_after": {str(n): pvalue(law, keys[:n]) for n in PREFIXES}, "seconds_per_draw": seconds / len(keys)}
        rows.append(row)
        print(name, {n: f"{p:.1e}" for n, p in row["pvalue_after"].items()}, flush=True)
    result = {"command": "python benchmarks/law_test_power.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "threshold": 1e-3, "rows": rows,
              "weakest_pvalue_after": {str(n): max(r["pvalue_after"][str(n)] for r in rows) for n in PREFIXES}}
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
