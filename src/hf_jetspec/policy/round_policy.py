"""The round policy: each round, what to verify and whether drafting is worth its cost.

Candidates of a round are a plain step (``L = 0``), the n-gram proposal (free) and the drafter's
block (costs a drafter pass per Jacobi pass). Each comes with per-position acceptance estimates;
:func:`best_candidate` verifies the candidate and length with the most expected committed tokens
per second. Whether to run the drafter at all is decided before its cost is paid
(:class:`DraftGate`): from the running value of recent drafted rounds against the best free
candidate of this round, with probes at growing intervals so a closed gate can open again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .verify_length import VerifyChoice, choose_verify_length


@dataclass(frozen=True)
class Candidate:
    """A proposal for this round: its source, tokens and conditional acceptance estimates."""

    source: str
    tokens: Sequence[int]
    accept_probs: Sequence[float]


@dataclass(frozen=True)
class RoundChoice:
    source: str  # "plain", "ngram" or "drafter"
    tokens: list[int]
    choice: VerifyChoice


def best_candidate(candidates: Sequence[Candidate], verify_costs: Sequence[float]) -> RoundChoice:
    """The candidate and verify length with the highest expected committed tokens per second.

    Drafting costs are sunk by now, so only verification is priced. A plain step is always an
    option; ties keep the earlier option (plain first).
    """
    best = RoundChoice("plain", [], VerifyChoice(0, 1.0, float(verify_costs[0])))
    for cand in candidates:
        choice = choose_verify_length(cand.accept_probs[: len(cand.tokens)], verify_costs)
        if choice.length > 0 and choice.rate > best.choice.rate * (1 + 1e-9):
            best = RoundChoice(cand.source, [int(t) for t in cand.tokens[: choice.length]], choice)
    return best


class DraftGate:
    """Decides before drafting whether the drafter is worth its cost this round.

    ``observe(value, free_rate)`` records a drafted round: ``value`` is the expected committed tokens
    per second of the drafter's best choice with the drafting cost included, ``free_rate`` the best
    rate available without drafting. The gate keeps a running average of their ratio (``advantage``:
    dimensionless, so a cost model that is still settling moves both sides alike) and
    ``should_draft()`` opens when that average is above 1, or when a probe is due: after ``probe``
    rounds without drafting, where ``probe`` doubles (up to ``max_probe``) after each probe that did not pay and resets when one did.
    :meth:`limit_probe_cost` raises ``max_probe`` where a drafter pass is dear against a plain step, so
    that probing a drafter that does not pay costs at most a set share of the time.
    """

    def __init__(self, ema: float = 0.5, min_probe: int = 2, max_probe: int = 32):
        self.ema = ema
        self.min_probe = min_probe
        self.max_probe = max_probe
        self.advantage: float | None = None  # running average of value / free_rate over drafted rounds
        self.probe = min_probe
        self.since_draft = 0

    def limit_probe_cost(self, draft_s: float, step_s: float, share: float = 0.02, floor: int = 32) -> None:
        """Probe at most every ``max_probe`` rounds, with ``max_probe`` the smallest interval at which a
        drafter pass (``draft_s``) costs at most ``share`` of the plain steps between probes
        (``step_s`` each), and never below ``floor``."""
        if step_s > 0 and share > 0:
            self.max_probe = max(floor, math.ceil(draft_s / (share * step_s)))

    def reset(self) -> None:
        """Forget the running advantage (the drafter changed): the next round drafts and judges it afresh."""
        self.advantage = None
        self.probe = self.min_probe
        self.since_draft = 0

    def should_draft(self) -> bool:
        if self.advantage is None or self.advantage > 1.0:
            return True
        return self.since_draft + 1 >= self.probe

    def skipped(self) -> None:
        self.since_draft += 1

    def observe(self, value: float, free_rate: float) -> None:
        probing = self.advantage is not None and self.advantage <= 1.0
        ratio = value / free_rate if free_rate > 0 else float("inf")
        self.advantage = ratio if self.advantage is None else (1 - self.ema) * self.advantage + self.ema * ratio
        if value > free_rate:
            self.probe = self.min_probe
        elif probing:
            self.probe = min(2 * self.probe, self.max_probe)
        self.since_draft = 0
