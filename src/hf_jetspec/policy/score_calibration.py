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

Chain rounds use the same tables under sources of their own, one per block position bucket, and
calibrate the *conditional* estimates: position ``j``'s acceptance given that positions ``1..j-1``
were accepted, observed only in rounds where they were (:meth:`ScoreCalibration.observe_chain`).
A position that verification has not reached yet takes as its prior the raw estimate scaled by the
correction found at the position before it (:func:`chain_conditionals`): a drafter whose first
positions are never accepted has its later, never-observed positions pulled down with them, so its
expected committed tokens fall towards zero within a few rounds, whatever its offline calibration
(or the lack of one) says, and the policy stops verifying it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

SCORE_EDGES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # upper edges of all bins but the last


def score_bin(score: float) -> int:
    """Bin of a score in ``[0, 1]``: ``0`` for scores up to 0.02, ``len(SCORE_EDGES)`` above 0.9."""
    return bisect.bisect_left(SCORE_EDGES, float(score))


POSITION_EDGES = (1, 2, 3, 4, 6, 8, 12)  # upper edges of the block-position buckets of chain calibration


def position_bucket(position: int) -> int:
    """Bucket of a 1-based block position: 0-6 for positions 1, 2, 3, 4, 5-6, 7-8, 9-12; 7 beyond."""
    return bisect.bisect_left(POSITION_EDGES, int(position))


def chain_conditionals(raw: Sequence[float], counts: Sequence[tuple[float, float]], prior_weight: float) -> list[float]:
    """Calibrated conditional estimates of a drafted block's positions 1, 2, ...

    ``raw[j]``: the drafter's conditional estimate of position ``j + 1``; ``counts[j]``: (accepted,
    verified) conditional observations of its (position bucket, score bin). Position ``j``'s estimate
    is ``(accepted + w * prior) / (verified + w)``, clipped to ``[0, 1]``, with ``prior`` the raw
    estimate times the previous position's correction (calibrated over raw; 1 at position 1).
    """
    w = float(prior_weight)
    out, correction = [], 1.0
    for r, (acc, n) in zip(raw, counts):
        r = min(max(float(r), 0.0), 1.0)
        c = min(max((acc + w * r * correction) / (n + w), 0.0), 1.0)
        out.append(c)
        correction = c / r if r > 0 else correction
    return out


class ScoreCalibration:
    """Observed acceptance of verified tree nodes per score bin, per source (``"drafter"``, ...)."""

    def __init__(self, prior_weight: float = 4.0):
        if prior_weight <= 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight}")
        self.prior_weight = float(prior_weight)
        self._counts: dict[tuple[str, int], list[float]] = {}  # (source, bin) -> [accepted, verified]

    def clear(self) -> None:
        self._counts.clear()

    def forget(self, prefix: str, keep: float) -> None:
        """Scale the counts of every source starting with ``prefix`` by ``keep`` (0: forget them), so
        that new observations outweigh old ones (e.g. after the drafter's weights changed)."""
        if not 0 <= keep <= 1:
            raise ValueError(f"keep must be in [0, 1], got {keep}")
        for key in [k for k in self._counts if k[0].startswith(prefix)]:
            if keep == 0:
                del self._counts[key]
            else:
                self._counts[key] = [c * keep for c in self._counts[key]]

    def __call__(self, source: str, scores: Sequence[float]) -> list[float]:
        """Calibrated path probabilities of ``scores``."""
        w = self.prior_weight
        out = []
        for s in scores:
            acc, n = self._counts.get((source, score_bin(s)), (0.0, 0.0))
            out.append((acc + w * float(s)) / (n + w))
        return out

    def chain(self, source: str, raw: Sequence[float]) -> list[float]:
        """Calibrated conditional estimates of a chain block (:func:`chain_conditionals`)."""
        keys = [(f"{source}@{position_bucket(j)}", score_bin(r)) for j, r in enumerate(raw, start=1)]
        return chain_conditionals(raw, [tuple(self._counts.get(k, (0.0, 0.0))) for k in keys], self.prior_weight)

    def observe_chain(self, source: str, raw: Sequence[float], accepted: int) -> None:
        """A verified chain block with raw conditionals ``raw`` (the verified positions only), of which
        the first ``accepted`` were accepted: positions ``1..accepted`` are observed accepted and the
        next one, if verified, rejected; the positions after it were not reached and say nothing."""
        for j, r in enumerate(raw[: accepted + 1], start=1):
            self.observe(f"{source}@{position_bucket(j)}", [r], [j <= accepted])

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
