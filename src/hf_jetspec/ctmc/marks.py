"""Marks of the masked-denoiser CTMC and the speculative acceptance rule (seed 002).

A *mark* is a pair (masked position, replacement token). Under the linear masking schedule, with
model time t running down from 1 and m positions still masked, every masked position unmasks at
rate 1/t, divided among tokens by the denoiser's probabilities. So the next event happens at
``t * exp(-E / m)`` (E a unit exponential) whatever the marks are, and the mark is drawn from the
joint law ``(1/m) * p(token | position, state, t)`` over masked positions.

Speculative verification compares a draft mark law D with the target mark law P on the same
state and tick: a draft mark z is accepted with probability ``min(1, P(z) / D(z))``; on rejection
a correction is drawn from the residual ``max(P - D, 0)`` normalised over *all* marks, so the
position may change. Accepted mass plus corrected mass is exactly P.
"""

from __future__ import annotations

import math

import torch


def next_tick(t: float | torch.Tensor, masked_count: int, exponential_draw: float | torch.Tensor):
    """Time of the next event: ``t * exp(-E / m)`` (the waiting time in -log t is Exp(m))."""
    if isinstance(t, torch.Tensor) or isinstance(exponential_draw, torch.Tensor):
        return t * torch.exp(-torch.as_tensor(exponential_draw) / masked_count)
    return t * math.exp(-exponential_draw / masked_count)


def mark_law(probs: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Joint law of the next mark: ``(1/m) * p(token | position)`` at masked positions, 0 elsewhere.

    ``probs`` [..., L, V] are the denoiser's per-position token probabilities, ``masked`` [..., L]
    is boolean. Rows at unmasked positions are ignored. The result sums to 1 over (L, V).
    """
    masked = masked.to(probs.dtype)
    m = masked.sum(-1, keepdim=True)[..., None]
    return probs * masked[..., None] / m


def accepted_mass(target_law: torch.Tensor, draft_law: torch.Tensor) -> torch.Tensor:
    """Unconditional mass that accepted draft marks contribute: ``min(P, D)`` per mark."""
    return torch.minimum(target_law, draft_law)


def rejection_probability(target_law: torch.Tensor, draft_law: torch.Tensor) -> torch.Tensor:
    """Probability that a draft mark is rejected: ``1 - sum min(P, D)``."""
    return 1.0 - accepted_mass(target_law, draft_law).flatten(-2).sum(-1)


def acceptance_probability(target_law: torch.Tensor, draft_law: torch.Tensor, position: int, token: int) -> float:
    """``min(1, P(z) / D(z))`` for the draft mark z = (position, token)."""
    d = float(draft_law[..., position, token])
    if d <= 0:
        raise ValueError("a draft mark must have positive draft probability")
    return min(1.0, float(target_law[..., position, token]) / d)


def residual_law(target_law: torch.Tensor, draft_law: torch.Tensor) -> torch.Tensor:
    """Correction law after a rejection: ``max(P - D, 0)`` normalised over all marks (any position)."""
    residual = torch.clamp(target_law - draft_law, min=0.0)
    total = residual.flatten(-2).sum(-1)[..., None, None]
    # total == 0 only when P == D, where rejection has probability 0; fall back to P for safety
    return torch.where(total > 0, residual / torch.where(total > 0, total, torch.ones_like(total)), target_law)


def sample_mark(law: torch.Tensor, generator: torch.Generator | None = None) -> tuple[int, int]:
    """Draw (position, token) from a joint mark law [L, V]."""
    vocab = law.shape[-1]
    flat = int(torch.multinomial(law.reshape(-1), 1, generator=generator))
    return flat // vocab, flat % vocab
