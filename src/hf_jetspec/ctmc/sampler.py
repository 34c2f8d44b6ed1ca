"""Reference and speculative samplers of the masked-denoiser CTMC (seed 002).

Both samplers share the clock, the cutoff and the completion rule:

* model time starts at 1; with m masked positions the next tick is ``t * exp(-E / m)``;
* an event at tick t draws its mark from ``(1/m) * p(token | position, state, t)``;
* **completion rule**: when the next tick would fall below ``cutoff``, the clock stops and every
  position still masked is filled independently from the target's ``p(. | position, state,
  cutoff)`` in one call.

The speculative sampler lets a cheap draft denoiser propose up to ``draft_length`` marks at the
next saved ticks, evaluates all tentative rows with the target in one batched call, accepts each
mark with ``min(1, P/D)`` and, at the first rejection, commits a correction from the residual over
all marks and discards the rest. The ticks after the corrected event stay saved: the clock law
depends only on the masked count, which every valid mark decrements by one, so the next round
drafts afresh on the corrected state at those same ticks. The output law equals the reference
process (Theorem 1 of the paper), provided the target's batched rows equal its single-row
evaluations (the exactness condition that ``tests/test_ctmc.py`` checks for the MLM adapter).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .marks import acceptance_probability, mark_law, residual_law, sample_mark


@dataclass
class CTMCStats:
    """Work done by a sampler, summed over samples.

    ``target_calls`` counts sequential target evaluations (a batched call counts once),
    ``evaluated_rows`` the states the target evaluated, ``accepted_prefix_hist[k]`` the rounds
    whose first k draft marks were accepted.
    """

    samples: int = 0
    events: int = 0
    rounds: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    evaluated_rows: int = 0
    proposed: int = 0
    accepted: int = 0
    corrections: int = 0
    completions: int = 0
    accepted_prefix_hist: list[int] = field(default_factory=list)

    def record_prefix(self, k: int) -> None:
        while len(self.accepted_prefix_hist) <= k:
            self.accepted_prefix_hist.append(0)
        self.accepted_prefix_hist[k] += 1

    def merge(self, other: "CTMCStats") -> "CTMCStats":
        """Sum of two stats (e.g. over separate runs)."""
        n = max(len(self.accepted_prefix_hist), len(other.accepted_prefix_hist))
        pad = lambda h: h + [0] * (n - len(h))  # noqa: E731
        counts = {f: getattr(self, f) + getattr(other, f) for f in (
            "samples", "events", "rounds", "target_calls", "draft_calls", "evaluated_rows",
            "proposed", "accepted", "corrections", "completions")}
        hist = [a + b for a, b in zip(pad(self.accepted_prefix_hist), pad(other.accepted_prefix_hist))]
        return CTMCStats(**counts, accepted_prefix_hist=hist)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def events_per_call(self) -> float | None:
        return self.events / self.target_calls if self.target_calls else None


def _unit_exponential(generator: torch.Generator | None) -> float:
    return float(torch.empty(1).exponential_(generator=generator))


def _complete(denoiser, state: torch.Tensor, mask_id: int, cutoff: float, generator) -> torch.Tensor:
    """Completion rule: fill every masked position independently from p(. | position, state, cutoff)."""
    masked = state == mask_id
    if not bool(masked.any()):
        return state
    probs = denoiser(state, torch.full((state.shape[0],), cutoff))
    draws = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).reshape(state.shape)
    return torch.where(masked, draws.to(state.dtype), state)


def sample(
    denoiser,
    length: int,
    num_samples: int = 1,
    *,
    mask_id: int,
    cutoff: float = 1e-3,
    generator: torch.Generator | None = None,
    return_stats: bool = False,
):
    """Reference (non-speculative) sampler: one denoiser call per event, all samples in one batch.

    Returns ``LongTensor[num_samples, length]`` (and :class:`CTMCStats` with ``return_stats``).
    """
    if not 0 < cutoff < 1:
        raise ValueError(f"cutoff must be in (0, 1), got {cutoff}")
    stats = CTMCStats(samples=num_samples)
    state = torch.full((num_samples, length), mask_id, dtype=torch.long)
    t = torch.ones(num_samples, dtype=torch.float64)
    running = torch.ones(num_samples, dtype=torch.bool)
    for step in range(length):
        m = length - step
        e = torch.empty(num_samples, dtype=torch.float64).exponential_(generator=generator)
        t_next = t * torch.exp(-e / m)
        stop = running & (t_next < cutoff)
        if bool(stop.any()):
            state[stop] = _complete(denoiser, state[stop], mask_id, cutoff, generator)
            stats.target_calls += 1
            stats.evaluated_rows += int(stop.sum())
            stats.completions += int(stop.sum())
            running &= ~stop
        if not bool(running.any()):
            break
        idx = running.nonzero().squeeze(1)
        t[idx] = t_next[idx]
        probs = denoiser(state[idx], t[idx].float())
        law = mark_law(probs, state[idx] == mask_id)
        flat = torch.multinomial(law.reshape(idx.numel(), -1), 1, generator=generator).squeeze(1)
        vocab = law.shape[-1]
        state[idx, flat // vocab] = flat % vocab
        stats.target_calls += 1
        stats.evaluated_rows += idx.numel()
        stats.events += idx.numel()
    return (state, stats) if return_stats else state


ResidualRule = Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]


def _residual_over_all_marks(target_law, draft_law, position, token):
    return residual_law(target_law, draft_law)


def speculative_sample(
    target,
    draft,
    length: int,
    num_samples: int = 1,
    *,
    mask_id: int,
    draft_length: int = 4,
    cutoff: float = 1e-3,
    generator: torch.Generator | None = None,
    residual_rule: ResidualRule = _residual_over_all_marks,
):
    """Speculative sampler: exact samples of the target's CTMC using a cheaper draft denoiser.

    Returns ``(LongTensor[num_samples, length], CTMCStats)``. ``residual_rule`` exists so tests
    can plug in a deliberately wrong correction and watch the exactness test fail.
    """
    if draft_length < 1:
        raise ValueError(f"draft_length must be >= 1, got {draft_length}")
    if not 0 < cutoff < 1:
        raise ValueError(f"cutoff must be in (0, 1), got {cutoff}")
    stats = CTMCStats(samples=num_samples)
    out = torch.empty(num_samples, length, dtype=torch.long)
    for n in range(num_samples):
        state = torch.full((length,), mask_id, dtype=torch.long)
        ticks: list[float] = []  # saved future ticks of the clock
        last_tick, m = 1.0, length
        while m > 0:
            k = min(draft_length, m)
            while len(ticks) < k:  # extend the clock; tick j uses the masked count m - j
                base = ticks[-1] if ticks else last_tick
                ticks.append(base * math.exp(-_unit_exponential(generator) / (m - len(ticks))))
            k = next((j for j in range(k) if ticks[j] < cutoff), k)
            if k == 0:  # the clock crossed the cutoff: completion rule
                state = _complete(target, state[None], mask_id, cutoff, generator)[0]
                stats.target_calls += 1
                stats.evaluated_rows += 1
                stats.completions += 1
                break
            # draft k marks sequentially at the saved ticks
            rows, draft_laws, marks = [], [], []
            tentative = state.clone()
            for j in range(k):
                rows.append(tentative.clone())
                d = mark_law(draft(tentative[None], torch.tensor([ticks[j]]))[0], tentative == mask_id)
                pos, tok = sample_mark(d, generator)
                draft_laws.append(d)
                marks.append((pos, tok))
                tentative[pos] = tok
            stats.draft_calls += k
            # verify every tentative row in one batched target call
            batch = torch.stack(rows)
            target_laws = mark_law(target(batch, torch.tensor(ticks[:k])), batch == mask_id)
            stats.target_calls += 1
            stats.evaluated_rows += k
            stats.rounds += 1
            stats.proposed += k
            accepted, rejected = 0, False
            for j, (pos, tok) in enumerate(marks):
                u = float(torch.rand(1, generator=generator))
                if u < acceptance_probability(target_laws[j], draft_laws[j], pos, tok):
                    state[pos] = tok
                    accepted += 1
                    continue
                correction = residual_rule(target_laws[j], draft_laws[j], pos, tok)
                cpos, ctok = sample_mark(correction, generator)
                state[cpos] = ctok
                rejected = True
                break
            committed = accepted + int(rejected)
            stats.accepted += accepted
            stats.corrections += int(rejected)
            stats.record_prefix(accepted)
            stats.events += committed
            last_tick = ticks[committed - 1]
            ticks = ticks[committed:]
            m -= committed
        out[n] = state
    return out, stats

