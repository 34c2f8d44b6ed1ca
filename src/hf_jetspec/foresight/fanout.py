"""SSD's geometric fan-out, the fixed-allocation baseline of outcome selection (seed 000, Appendix F.2).

Under Assumption 2 the accepted length follows the geometric law ``P_alpha(k) = alpha^k (1 - alpha)``
(k < gamma), ``P_alpha(gamma) = alpha^gamma``, and F anchors at length k capture the hit mass
``P_alpha(k) (1 - F^-rho)``. Equal marginal gains give ``F_k ~ P_alpha(k)^(1 / (1 + rho))``, scaled
to the cache size B over the active lengths.
"""

from __future__ import annotations

import math

import torch


def geometric_length_law(alpha: float, gamma: int) -> torch.Tensor:
    k = torch.arange(gamma + 1, dtype=torch.float64)
    law = alpha**k * (1 - alpha)
    law[-1] = alpha**gamma
    return law


def geometric_fanout(alpha: float, rho: float, gamma: int, cache_size: float, lengths: list[int] | None = None) -> torch.Tensor:
    """Continuous anchor counts ``F_k`` (k = 0..gamma) of the series over ``lengths`` (default: all)."""
    law = geometric_length_law(alpha, gamma)
    active = torch.zeros(gamma + 1, dtype=torch.bool)
    active[list(range(gamma + 1)) if lengths is None else lengths] = True
    f = torch.where(active, law ** (1.0 / (1.0 + rho)), torch.zeros_like(law))
    return cache_size * f / f.sum()


def surrogate_hit_mass(law: torch.Tensor, counts: torch.Tensor, rho: float) -> float:
    """``sum_k P(k) (1 - F_k^-rho)`` over lengths with ``F_k >= 1`` (zero mass elsewhere)."""
    active = counts >= 1
    gain = torch.where(active, 1 - counts.clamp(min=1) ** (-rho), torch.zeros_like(counts))
    return float((law * gain).sum())


def largest_remainder(counts: torch.Tensor, total: int) -> list[int]:
    """Integers summing to ``total`` closest to ``counts`` (largest-remainder rounding; ties to smaller k)."""
    scaled = counts * (total / float(counts.sum()))
    base = torch.floor(scaled).long()
    rest = total - int(base.sum())
    frac = scaled - base
    order = sorted(range(len(frac)), key=lambda i: (-float(frac[i]), i))
    for i in order[:rest]:
        base[i] += 1
    return [int(v) for v in base]


def fit_acceptance_rate(realized_k: list[int], gamma: int) -> float:
    """MLE of alpha under the truncated geometric law: accepted tokens / (accepted + rejections)."""
    acc = sum(realized_k)
    rej = sum(1 for k in realized_k if k < gamma)
    return acc / (acc + rej) if acc + rej else 0.0


def fit_fanout_exponent(anchor_ranks: list[int | None], max_anchors: int = 32) -> float:
    """Least-squares rho of ``P(rank <= F) ~ 1 - F^-rho`` for F = 2..max_anchors.

    ``anchor_ranks``: 1-based rank of the realised anchor among the ranked candidates of its round
    (None when it was not ranked at all).
    """
    n = len(anchor_ranks)
    if n == 0:
        return 1.0
    fs = list(range(2, max_anchors + 1))
    emp = [sum(1 for r in anchor_ranks if r is not None and r <= f) / n for f in fs]
    best, best_err = 1.0, math.inf
    for rho in torch.exp(torch.linspace(math.log(0.01), math.log(10.0), 400)).tolist():
        err = sum((e - (1 - f ** (-rho))) ** 2 for e, f in zip(emp, fs))
        if err < best_err:
            best, best_err = rho, err
    return best
