"""Exact final law of the CTMC by enumeration, for tiny time-independent denoisers.

When the denoiser ignores t and the cutoff is never reached, the final sequence depends only on
the order of the marks: from a state with m masked positions the next mark is (position, token)
with probability ``(1/m) * p(token | position, state)``. Summing over all unmasking orders (a
recursion over partial states, memoised) gives the law of the completed sequence.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from .marks import mark_law


def exact_final_law(denoiser, length: int, mask_id: int) -> dict[tuple[int, ...], float]:
    """``{final sequence: probability}`` for a time-independent denoiser (enumerates all states)."""

    @lru_cache(maxsize=None)
    def law_from(state: tuple[int, ...]) -> dict[tuple[int, ...], float]:
        tokens = torch.tensor([state])
        masked = tokens == mask_id
        if not bool(masked.any()):
            return {state: 1.0}
        probs = mark_law(denoiser(tokens, torch.ones(1)).double(), masked)[0]
        result: dict[tuple[int, ...], float] = {}
        for pos, tok in (probs > 0).nonzero().tolist():
            w = float(probs[pos, tok])
            nxt = list(state)
            nxt[pos] = tok
            for final, p in law_from(tuple(nxt)).items():
                result[final] = result.get(final, 0.0) + w * p
        return result

    return law_from(tuple([mask_id] * length))
