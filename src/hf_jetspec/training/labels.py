"""Label and weight rules of seed 003 (erase, ALR, IRA) as pure functions."""

from __future__ import annotations

import torch


def survival_gate(corpus_token_probs: torch.Tensor) -> torch.Tensor:
    """Erase baseline gate ``g_k = prod_{1<=j<k} p_T(x_{a+j} | x_{<a+j})`` for slots k = 1..K.

    ``corpus_token_probs[..., j-1]`` is the target's probability of the corpus token at slot j.
    The gate is 1 at slot 1 and decreases along the block.
    """
    ones = torch.ones_like(corpus_token_probs[..., :1])
    return torch.cumprod(torch.cat([ones, corpus_token_probs[..., :-1]], dim=-1), dim=-1)


def ira_offsets(count: int, num_slots: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """In-rollout anchor offsets ``j ~ U{2, ..., K-1}`` for ``count`` secondary blocks (K slots)."""
    if num_slots < 3:
        raise ValueError("in-rollout anchors need blocks of at least 3 slots (offsets 2..K-1)")
    return torch.randint(2, num_slots, (count,), generator=generator)


def inherited_slots(offsets: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Label index and validity of the slots of in-rollout blocks.

    Slot k (1..K) of a block anchored at rollout offset j inherits the primary block's label at
    slot ``j + k``; it is supervised only while ``j + k <= K``. Returns ``(index, valid)`` with the
    0-based primary slot index ``j + k - 1`` (clamped) and the validity mask, both [..., K].
    """
    k = torch.arange(1, num_slots + 1)
    idx = offsets[..., None] + k
    valid = idx <= num_slots
    return (idx - 1).clamp(max=num_slots - 1), valid
