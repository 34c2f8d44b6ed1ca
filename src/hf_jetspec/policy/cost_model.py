"""The round's price list: what a verification forward of ``n`` tokens and a drafter pass cost.

Measured once per target, device and dtype by a short warm-up (:func:`profile_forward_cost`), then
kept current by the rounds themselves: every verification round reports its wall time, and the
difference to the warm-up profile (the assisted loop's own overhead, a longer context, a busier
machine) is tracked as an additive running estimate.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence

import torch


def interpolate_monotone(sizes: Sequence[int], seconds: Sequence[float], n: int) -> float:
    """Piecewise-linear interpolation of a cost profile, made non-decreasing; linear extrapolation past the end."""
    if not sizes:
        raise ValueError("empty cost profile")
    pts = sorted(zip(sizes, seconds))
    xs = [p[0] for p in pts]
    ys = []
    for _, y in pts:  # a larger forward never costs less than a smaller one
        ys.append(max(y, ys[-1]) if ys else y)
    if n <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if n <= x1:
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
    if len(xs) == 1:
        return ys[0]
    slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
    return ys[-1] + slope * (n - xs[-1])


class CostModel:
    """Verification and drafting costs for the round policy.

    ``verify_cost(n)`` is, for a forward size ``n`` seen in at least ``min_observations`` rounds,
    the running average of those rounds' times. Between two such sizes it is interpolated linearly;
    beyond them it follows the warm-up profile's shape, scaled to the nearest observed size
    (``observed(m) * profile(n) / profile(m)``). Before any size is observed it is the profile's
    forward time plus the running overhead (the rounds' average excess over the profile).

    The rounds, not the profile, decide: the warm-up profile is taken over a short context, and at
    a long one the costs grow by a factor that depends on the device and dtype (bf16 attention on
    CPU reads a long cache faster for two query rows than for one, so verifying one draft token
    can cost less than a plain step). So the curve is not forced to be non-decreasing where rounds
    say otherwise. ``draft_cost(passes)`` is the running time of one drafter pass times ``passes``.
    Running estimates are exponential moving averages with weight ``ema`` on the newest observation.
    """

    def __init__(self, sizes: Sequence[int], seconds: Sequence[float], draft_pass_s: float = 0.0, ema: float = 0.1,
                 min_observations: int = 3):
        if len(sizes) != len(seconds) or not sizes:
            raise ValueError("a cost profile needs matching, non-empty sizes and seconds")
        self.sizes = [int(s) for s in sizes]
        self.seconds = [float(s) for s in seconds]
        self.ema = float(ema)
        self.min_observations = min_observations
        self.overhead_s = 0.0
        self.draft_pass_s = float(draft_pass_s)
        self.observed_rounds = 0
        self.observed_drafts = 0
        self._by_size: dict[int, tuple[float, int]] = {}  # n -> (running seconds, count)
        self._profile: dict[int, float] = {}  # n -> the profile's (interpolated) forward time

    def forward_cost(self, n_tokens: int) -> float:
        """The warm-up profile's forward time of ``n_tokens`` (interpolated once per size, then kept)."""
        cost = self._profile.get(n_tokens)
        if cost is None:
            cost = self._profile[n_tokens] = interpolate_monotone(self.sizes, self.seconds, n_tokens)
        return cost

    def observed_sizes(self) -> dict[int, float]:
        """Running seconds of every forward size seen in at least ``min_observations`` rounds."""
        return {n: t for n, (t, count) in sorted(self._by_size.items()) if count >= self.min_observations}

    def verify_cost(self, n_tokens: int, observed: dict[int, float] | None = None) -> float:
        """Seconds of a verification round over ``n_tokens`` positions (anchor included)."""
        seen = self.observed_sizes() if observed is None else observed
        if n_tokens in seen:
            return max(seen[n_tokens], 1e-6)
        if not seen:
            return max(self.forward_cost(n_tokens) + self.overhead_s, 1e-6)
        below = max((m for m in seen if m < n_tokens), default=None)
        above = min((m for m in seen if m > n_tokens), default=None)
        if below is not None and above is not None:
            cost = seen[below] + (seen[above] - seen[below]) * (n_tokens - below) / (above - below)
        else:
            anchor = below if below is not None else above
            cost = seen[anchor] * self.forward_cost(n_tokens) / max(self.forward_cost(anchor), 1e-9)
        return max(cost, 1e-6)

    def verify_costs(self, max_drafts: int) -> list[float]:
        """``[c(0), ..., c(max_drafts)]``: verifying ``L`` drafts is a forward of ``L + 1`` tokens."""
        seen = self.observed_sizes()
        return [self.verify_cost(length + 1, seen) for length in range(max_drafts + 1)]

    def draft_cost(self, passes: int) -> float:
        return self.draft_pass_s * passes

    def observe_verify(self, n_tokens: int, seconds: float) -> None:
        residual = seconds - self.forward_cost(n_tokens)
        self.overhead_s = residual if self.observed_rounds == 0 else (1 - self.ema) * self.overhead_s + self.ema * residual
        self.observed_rounds += 1
        mean, count = self._by_size.get(n_tokens, (seconds, 0))
        self._by_size[n_tokens] = (seconds if count == 0 else (1 - self.ema) * mean + self.ema * seconds, count + 1)

    def observe_draft(self, passes: int, seconds: float) -> None:
        if passes <= 0:
            return
        per_pass = seconds / passes
        self.draft_pass_s = per_pass if self.observed_drafts == 0 else (1 - self.ema) * self.draft_pass_s + self.ema * per_pass
        self.observed_drafts += 1

    def summary(self, max_drafts: int) -> dict:
        return {
            "verify_ms": [round(1000 * c, 3) for c in self.verify_costs(max_drafts)],
            "overhead_ms": round(1000 * self.overhead_s, 3),
            "draft_pass_ms": round(1000 * self.draft_pass_s, 3),
            "profile_sizes": list(self.sizes),
            "profile_ms": [round(1000 * s, 3) for s in self.seconds],
        }


@torch.no_grad()
def profile_forward_cost(target, sizes: Sequence[int], context: int = 64, repeats: int = 5, rows: int = 1) -> list[float]:
    """Median seconds of a target forward of ``n`` tokens over a ``context``-token KV cache, per size
    (``rows`` sequences at once: a batch's forward of ``rows x n`` tokens)."""
    from transformers import DynamicCache

    vocab = target.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (rows, context), generator=gen).to(target.device)
    cache = DynamicCache(config=target.config)
    target(input_ids=prefix, cache=cache, use_cache=True)

    def step(n):
        extra = cache.get_seq_length() - context
        if extra > 0:
            cache.crop(-extra)
        block = torch.randint(0, vocab, (rows, int(n)), generator=gen).to(target.device)
        positions = torch.arange(context, context + int(n), device=target.device)[None].expand(rows, -1)
        t0 = time.perf_counter()
        target(input_ids=block, cache=cache, use_cache=True, position_ids=positions)
        if target.device.type == "cuda":
            torch.cuda.synchronize(target.device)
        return time.perf_counter() - t0

    for n in sizes:  # warm every shape once
        step(n)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):  # sizes interleaved, so a burst of machine noise hits one sample of each, not all of one
        for n in sizes:
            times[n].append(step(n))
    return [sorted(times[n])[len(times[n]) // 2] for n in sizes]


_PROFILES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def batch_cost_profile_for(target, max_tokens: int, rows: int) -> tuple[list[int], list[float]]:
    """:func:`cost_profile_for` for a batch of ``rows`` sequences: what a forward of ``rows x n``
    tokens costs here (measured once per target, device, dtype and row count), the prices a batched
    round's width is chosen from. One row is the one-row profile itself."""
    if rows <= 1:
        return cost_profile_for(target, max_tokens)
    sizes = sorted({n for n in (1, 2, 4, 8, 12, 16, 24, 32) if n <= max_tokens} | {max_tokens})
    key = (str(target.device), str(target.dtype), int(rows))
    known = _PROFILES.setdefault(target, {})
    entry = known.get(key)
    if entry is None or max(entry[0]) < max_tokens:
        entry = (sizes, profile_forward_cost(target, sizes, rows=rows, repeats=3))
        known[key] = entry
    return entry


def cost_profile_for(target, max_tokens: int) -> tuple[list[int], list[float]]:
    """The warm-up profile of ``target`` up to ``max_tokens`` positions, measured once per target, device and dtype."""
    sizes = sorted({n for n in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64) if n <= max_tokens} | {max_tokens})
    key = (str(target.device), str(target.dtype))
    known = _PROFILES.setdefault(target, {})
    entry = known.get(key)
    if entry is None or max(entry[0]) < max_tokens:
        entry = (sizes, profile_forward_cost(target, sizes))
        known[key] = entry
    return entry
