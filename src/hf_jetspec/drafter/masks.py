"""Boolean attention masks of blocks against a context (True = may attend).

Two layouts: the training view packs many blocks of one sequence against its whole context
(:func:`context_visibility`, :func:`block_attention_mask`); the inference view runs a batch of
blocks against a cached context plus optional extra rows (:func:`context_block_mask`,
:func:`prefix_block_mask`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def inner_block_mask(length: int, causal: bool, device=None) -> torch.Tensor:
    """[L, L]: position i of a block sees positions j <= i (``causal``) or the whole block."""
    if not causal:
        return torch.ones(length, length, dtype=torch.bool, device=device)
    i = torch.arange(length, device=device)
    return i[None, :] <= i[:, None]


def context_visibility(anchor_positions: torch.Tensor, context_len: int) -> torch.Tensor:
    """Default context visibility [B, nb, C]: block ``b`` sees the sequence positions before its anchor."""
    ctx = torch.arange(context_len, device=anchor_positions.device)
    return ctx[None, None, :] < anchor_positions[:, :, None]


def truncated_block_mask(block_len: int, causal: bool, rows: torch.Tensor) -> torch.Tensor:
    """[B, nb, L, L]: :func:`inner_block_mask` for blocks of which only the first ``rows[b, n]`` rows
    exist (a block drafted shorter than it was packed): no row sees a row past its block's end,
    except itself, so that every row's softmax has a key (the rows past the end carry no loss)."""
    device = rows.device
    i = torch.arange(block_len, device=device)
    inside = i[None, None, None, :] < rows[..., None, None]  # key j exists
    return inner_block_mask(block_len, causal, device) & (inside | (i[:, None] == i[None, :]))


def block_attention_mask(ctx_visible: torch.Tensor, block_len: int, causal: bool, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean attention mask of packed blocks against a shared context.

    ``ctx_visible`` [B, nb, C] says which context rows each block sees (see
    :func:`context_visibility`); inside itself a block sees the positions up to its own
    (``causal``) or the whole block (bidirectional). Blocks never see each other. ``rows`` [B, nb]
    truncates blocks (:func:`truncated_block_mask`).
    Returns [B, 1, nb * block_len, C + nb * block_len].
    """
    bsz, nb, context_len = ctx_visible.shape
    device = ctx_visible.device
    ctx = ctx_visible[:, :, None, :].expand(bsz, nb, block_len, context_len)
    if rows is None:
        inner = inner_block_mask(block_len, causal, device)[None, None].expand(bsz, nb, block_len, block_len)
    else:
        inner = truncated_block_mask(block_len, causal, rows.to(device))
    same_block = torch.eye(nb, dtype=torch.bool, device=device)
    blk = same_block[None, :, None, :, None] & inner[:, :, :, None, :]  # [B, nb, L, nb, L]
    blk = blk.reshape(bsz, nb, block_len, nb * block_len)
    mask = torch.cat([ctx, blk], dim=-1)
    return mask.reshape(bsz, 1, nb * block_len, context_len + nb * block_len)


@dataclass
class PackedBlocks:
    """The training view's mask in structured form: ``nb`` blocks of ``block_len`` rows packed along
    the sequence, block ``b`` seeing the context rows ``ctx_visible[:, b]`` [B, nb, C] and inside
    itself the rows up to its own (``causal``) or the whole block; blocks never see each other.

    :func:`~hf_jetspec.drafter.layers.packed_block_attention` attends under it without the
    ``[nb * L, C + nb * L]`` dense mask, whose block-to-block part is almost all False;
    :meth:`dense` is that mask (:func:`block_attention_mask`). ``rows`` [B, nb], where given, says
    how many of each block's rows exist (:func:`truncated_block_mask`): the training view of blocks
    drafted shorter than ``block_len``.
    """

    ctx_visible: torch.Tensor
    block_len: int
    causal: bool
    rows: torch.Tensor | None = None

    def dense(self) -> torch.Tensor:
        return block_attention_mask(self.ctx_visible, self.block_len, self.causal, self.rows)

    def inner(self, device) -> torch.Tensor:
        """The in-block mask: [L, L], or [B, nb, L, L] for truncated blocks."""
        if self.rows is None:
            return inner_block_mask(self.block_len, self.causal, device)
        return truncated_block_mask(self.block_len, self.causal, self.rows.to(device))


def context_block_mask(batch_size: int, length: int, context_len: int, extra_visible: torch.Tensor | None, causal: bool, device) -> torch.Tensor:
    """Boolean mask [B, 1, L, C + E + L]: the whole cached context, the visible extra rows, the block itself.

    ``extra_visible`` is [B, E] (the same rows for every position of a block) or None.
    """
    parts = [torch.ones(batch_size, length, context_len, dtype=torch.bool, device=device)]
    if extra_visible is not None:
        parts.append(extra_visible.to(device)[:, None, :].expand(batch_size, length, -1))
    parts.append(inner_block_mask(length, causal, device)[None].expand(batch_size, length, length))
    return torch.cat(parts, dim=-1)[:, None]


def prefix_block_mask(length: int, capacity: int) -> torch.Tensor:
    """[L, capacity + L] table whose last ``C + L`` columns are the causal mask of a block of L rows
    after C context rows, for every C <= capacity: entry (i, t) is ``t <= capacity + i``.

    ``table[:, capacity - C:]`` is then a view: row i sees all C context rows and block rows 0..i.
    """
    i = torch.arange(length)[:, None]
    t = torch.arange(capacity + length)[None, :]
    return t <= capacity + i


def sliding_window_mask(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """[B, 1, Q, K]: a query at position ``p`` sees a key at position ``t`` iff ``|p - t| < window``.

    ``query_positions`` is [B, Q], ``key_positions`` [B, K] (or [K], shared by the batch). AND it
    with a block mask to give a drafter sliding-window attention (DFlash checkpoints)."""
    if key_positions.dim() == 1:
        key_positions = key_positions[None].expand(query_positions.shape[0], -1)
    gap = query_positions[:, :, None] - key_positions[:, None, :]
    return (gap.abs() < window)[:, None]
