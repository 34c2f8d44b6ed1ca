"""Running calibration of tree-node scores: how often a path with a given score is really accepted.

A best-first tree ranks its nodes by a score meant as the probability that the node's whole path is
accepted (the product of its tokens' acceptance estimates). For the drafter's top-1 chain those
estimates are fitted offline (:mod:`~hf_jetspec.policy.acceptance`); for alternative tokens, and for
deeper nodes under them, they are extrapolations (the later positions were predicted after the
top-1 prefix, not after the alternative). Every verified node is a labelled sample, so the policy
keeps a reliability table: scores are binned, and a bin's estimate is

    (accepted + w * score) / (verified + w)

the observed acceptance rate of the bin, shrunk towards the raw score with ``w`` pseudo-counts.
The ranking (and so the tree) stays the raw scores'; only the expected committed tokens that
choose the node count and price the drafter's pass use the calibrated values.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

SCORE_EDGES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # upper edges of all bins but the last


def score_bin(score: float) -> int:
    """Bin of a score in ``[0, 1]``: ``0`` for scores up to 0.02, ``len(SCORE_EDGES)`` above 0.9."""
    return bisect.bisect_left(SCORE_EDGES, float(score))


class ScoreCalibration:
    """Observed acceptance of verified tree nodes per score bin, per source (``"drafter"``, ...)."""

    def __init__(self, prior_weight: float = 4.0):
        if prior_weight <= 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight}")
        self.prior_weight = float(prior_weight)
        self._counts: dict[tuple[str, int], list[float]] = {}  # (source, bin) -> [accepted, verified]

    def clear(self) -> None:
        self._counts.clear()

    def __call__(self, source: str, scores: Sequence[float]) -> list[float]:
        """Calibrated path probabilities of ``scores``."""
        w = self.prior_weight
        out = []
        for s in scores:
            acc, n = self._counts.get((source, score_bin(s)), (0.0, 0.0))
            out.append((acc + w * float(s)) / (n + w))
        return out

    def observe(self, source: str, scores: Sequence[float], accepted: Sequence[bool]) -> None:
        """Verified nodes of ``source`` with these scores; ``accepted[i]``: node ``i``'s path was accepted."""
        for s, a in zip(scores, accepted):
            counts = self._counts.setdefault((source, score_bin(s)), [0.0, 0.0])
            counts[0] += float(bool(a))
            counts[1] += 1.0

    def table(self) -> dict[str, list[tuple[int, float, float]]]:
        """Per source, ``(bin, accepted, verified)`` rows (for reports)."""
        out: dict[str, list] = {}
        for (source, b), (acc, n) in sorted(self._counts.items()):
            out.setdefault(source, []).append((b, acc, n))
        return out
