"""Offline replay of outcome-selection rules over recorded rounds (seed 000, Appendix B.4, Table 11).

Rounds are recorded once with the target (:func:`~hf_jetspec.foresight.calibrate.record_rounds`);
each rule then picks B outcomes per round from the record alone, and its hit rate is the share of
rounds whose realised outcome it picked. Rules:

* ``served``: calibrated ``P_tilde(k) * P_beta(a | k)`` (Appendix B.1);
* ``uncalibrated``: the decoder's ``P(k, a)`` of Eq. 6;
* ``draft-model``: ``P(k)`` of Eq. 6 from the drafter's probabilities of its own tokens, times the
  served anchor factor ``P_beta(a | k)``;
* ``fanout-draft``: SSD's geometric fan-out (alpha, rho fitted on calibration rounds) filled with the
  drafter's anchors (the decoder's at k = gamma, where the drafter has none);
* ``fanout-decoder``: the same fan-out filled with the decoder's anchors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .calibrate import calibrated_outcome_scores, decoder_anchor_logprobs
from .calibration import ForesightCalibration
from .engine import ForesightRecord
from .fanout import fit_fanout_exponent, geometric_fanout, largest_remainder
from .outcomes import length_probs, rank_outcomes

RULES = ("served", "uncalibrated", "draft-model", "fanout-draft", "fanout-decoder")


@dataclass
class FanoutFit:
    alpha: float
    rho: float


def draft_anchors(record: ForesightRecord, k: int) -> list[int]:
    """The drafter's ranked anchors at length k (its row k, ``d_{k+1}`` removed); none at k = gamma."""
    if k >= len(record.draft):
        return []
    return [t for t in record.draft_row_tokens[k] if t != record.draft[k]]


def fit_fanout(records: list[ForesightRecord], max_anchors: int = 32) -> FanoutFit:
    """alpha (truncated-geometric MLE of the realised k) and rho (ranks of realised anchors among the drafter's)."""
    acc = rej = 0
    ranks = []
    for r in records:
        if r.realized is None:
            continue
        k, a = r.realized
        acc += k
        rej += int(k < len(r.draft))
        anchors = draft_anchors(r, k) if k < len(r.draft) else decoder_anchor_logprobs(r, k)[0]
        ranks.append(anchors.index(a) + 1 if a in anchors else None)
    alpha = acc / (acc + rej) if acc + rej else 0.5
    return FanoutFit(alpha=min(max(alpha, 1e-3), 1 - 1e-3), rho=fit_fanout_exponent(ranks, max_anchors))


def select(record: ForesightRecord, rule: str, cache_size: int, calibration: ForesightCalibration, fanout: FanoutFit | None = None) -> set[tuple[int, int]]:
    gamma = len(record.draft)
    if rule == "served":
        return set(rank_outcomes(calibrated_outcome_scores(calibration, record), cache_size))
    if rule in ("uncalibrated", "draft-model"):
        if rule == "uncalibrated":
            g = torch.cat([torch.ones(1), torch.cumprod(torch.tensor(record.p_hat), 0)]) if gamma else torch.ones(1)
        else:
            pk = length_probs(torch.tensor(record.draft_own_prob)) if gamma else torch.ones(1)
        scored = []
        for k in range(gamma + 1):
            toks, logp = decoder_anchor_logprobs(record, k, calibration.top_candidates)
            if rule == "uncalibrated":
                probs = logp.exp()
                scored.extend((float(g[k] * p), k, t) for t, p in zip(toks, probs.tolist()))
            else:
                probs = torch.softmax(logp / calibration.beta, -1)
                scored.extend((float(pk[k] * p), k, t) for t, p in zip(toks, probs.tolist()))
        return set(rank_outcomes(scored, cache_size))
    if rule in ("fanout-draft", "fanout-decoder"):
        if fanout is None:
            raise ValueError("fan-out rules need a FanoutFit (fit_fanout on calibration rounds)")
        counts = largest_remainder(geometric_fanout(fanout.alpha, fanout.rho, gamma, float(cache_size)), cache_size)
        picked = set()
        for k, f in enumerate(counts):
            if f == 0:
                continue
            anchors = draft_anchors(record, k) if rule == "fanout-draft" and k < gamma else decoder_anchor_logprobs(record, k)[0]
            picked.update((k, a) for a in anchors[:f])
        return picked
    raise ValueError(f"unknown rule {rule!r}; choose from {RULES}")


def replay_hit_rates(records: list[ForesightRecord], calibration: ForesightCalibration, cache_sizes=(1, 2, 4, 8, 16),
                     fanout: FanoutFit | None = None, rules=RULES) -> dict[str, dict[int, float]]:
    """Hit rate of each rule at each cache size over the completed rounds of ``records``."""
    done = [r for r in records if r.realized is not None]
    if not done:
        raise ValueError("no completed rounds to replay")
    out: dict[str, dict[int, float]] = {}
    for rule in rules:
        if rule.startswith("fanout") and fanout is None:
            continue
        out[rule] = {b: sum(tuple(r.realized) in select(r, rule, b, calibration, fanout) for r in done) / len(done) for b in cache_sizes}
    return out
