"""Training blocks: anchors, clean-prefix schedule, noise inputs and slot weights (pure functions).

A training block mirrors an inference round. Its anchor is a sequence token at position a; the
drafter reads ``gamma`` inputs ``[x_a, z_1 .. z_{gamma-1}]`` at positions ``a .. a+gamma-1`` and
output i is trained towards the target's distribution for position ``a+i+1``. Under Jacobi forcing
the first m inputs after the anchor are the true tokens (a clean prefix, the shape of a partially
converged Jacobi iterate) and the rest are noise tokens drawn from the sequence's own context
before the anchor (seed 000, "Training").
"""

from __future__ import annotations

import torch


def clean_prefix_schedule(num_blocks: int, gamma: int, offset: int = 0) -> torch.Tensor:
    """Clean-prefix lengths of the blocks of a sequence: ``m_b = (offset + b) mod gamma``.

    A fixed schedule that cycles through every length 0 .. gamma-1 (0 = fully noised block, the
    J0 shape; gamma-1 = every input clean), so the drafter learns to repair any clean-prefix block.
    ``offset`` rotates the schedule between sequences so every length is seen at every block slot.
    (The seed's Appendix E rule is not in the text; this is the documented choice.)
    """
    return (torch.arange(num_blocks) + offset) % gamma


def slot_weights(gamma: int, decay: float | None) -> torch.Tensor:
    """Decay envelope ``w_k = exp(-(k-1)/decay)`` for slots k = 1..gamma (all ones if ``decay`` is None)."""
    k = torch.arange(1, gamma + 1, dtype=torch.float32)
    if decay is None:
        return torch.ones(gamma)
    return torch.exp(-(k - 1) / decay)


def sample_draft_lengths(batch: int, num_blocks: int, gamma: int, share: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draft lengths [B, num_blocks]: ``gamma`` (the whole block) for most blocks, and for a ``share``
    of them a shorter length drawn uniformly from ``1 .. gamma - 1`` (a server drafting that many)."""
    full = torch.full((batch, num_blocks), gamma, dtype=torch.long)
    if share <= 0 or gamma < 2:
        return full
    short = torch.rand(batch, num_blocks, generator=generator) < share
    k = torch.randint(1, gamma, (batch, num_blocks), generator=generator)
    return torch.where(short, k, full)


def sample_anchor_positions(
    starts: torch.Tensor, ends: torch.Tensor, num_blocks: int, gamma: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Anchor positions [B, num_blocks], uniform in ``[start, end - gamma - 1]`` per sequence.

    ``starts`` [B]: first allowed anchor (e.g. the first response token); ``ends`` [B]: sequence
    lengths. Every block then has ``gamma`` labelled positions inside the sequence. Sequences too
    short for a block get anchors clamped into range (their blocks are masked by the caller).
    """
    lo = starts.to(torch.float64)
    hi = torch.clamp(ends - gamma - 1, min=0).to(torch.float64)
    hi = torch.maximum(hi, lo)
    u = torch.rand(starts.shape[0], num_blocks, generator=generator, dtype=torch.float64)
    return torch.floor(lo[:, None] + u * (hi - lo + 1)[:, None]).clamp(max=hi[:, None]).long()


def build_block_inputs(
    sequences: torch.Tensor,
    anchors: torch.Tensor,
    clean_lengths: torch.Tensor,
    gamma: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block inputs [B, nb, gamma] and their noise mask, the true tokens read from the sequence.

    Index 0 is the anchor token; indices 1..m hold the true tokens; later indices hold noise drawn
    uniformly from the sequence's tokens before the anchor. ``clean_lengths`` is [nb] or [B, nb].
    """
    bsz, nb = anchors.shape
    idx = (anchors[..., None] + torch.arange(gamma)).clamp(max=sequences.shape[1] - 1)
    true = torch.gather(sequences[:, None, :].expand(bsz, nb, -1), 2, idx)
    return noisy_block_inputs(true, sequences, anchors, clean_lengths, generator)


def noisy_block_inputs(
    true_tokens: torch.Tensor,
    sequences: torch.Tensor,
    noise_limits: torch.Tensor,
    clean_lengths: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the anchor and the first m true tokens of each block; replace the rest by noise.

    ``true_tokens`` [B, nb, gamma] (e.g. corpus tokens, or a target rollout under ALR); noise
    tokens are drawn uniformly from ``sequences[b, :noise_limits[b, j]]`` (the context before the
    block; at least position 0). Returns ``(inputs, noise_mask)``.
    """
    bsz, nb, gamma = true_tokens.shape
    m = clean_lengths if clean_lengths.dim() == 2 else clean_lengths[None].expand(bsz, nb)
    noise_mask = torch.arange(gamma)[None, None, :] > m[..., None]
    span = torch.clamp(noise_limits, min=1).to(torch.float64)
    u = torch.rand(bsz, nb, gamma, generator=generator, dtype=torch.float64)
    noise_idx = torch.floor(u * span[..., None]).long().clamp(max=sequences.shape[1] - 1)
    noise = torch.gather(sequences[:, None, :].expand(bsz, nb, -1), 2, noise_idx)
    return torch.where(noise_mask, noise, true_tokens), noise_mask


def leading_matches(pred: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Number of leading positions where ``pred == ref`` along the last dim (accepted length proxy)."""
    return (torch.cumprod((pred == ref).to(torch.int64), dim=-1)).sum(-1)

