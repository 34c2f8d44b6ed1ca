"""The drafter's own key/value cache over the verified context."""

from __future__ import annotations

import torch


class DrafterCache:
    """Per-layer keys/values of the drafter for the verified context before the anchor.

    Only verified positions ever enter this cache (block positions are recomputed every pass), so
    it never holds rejected tokens; :meth:`crop` exists for callers that rewind generation.
    """

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def __len__(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.keys[i] is None:
            return None
        return self.keys[i], self.values[i]

    def append(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.keys[i] is None:
            self.keys[i], self.values[i] = k, v
        else:
            self.keys[i] = torch.cat([self.keys[i], k], dim=2)
            self.values[i] = torch.cat([self.values[i], v], dim=2)

    def crop(self, length: int) -> None:
        if length < 0 or length > len(self):
            raise ValueError(f"cannot crop a cache of length {len(self)} to {length}")
        for i in range(len(self.keys)):
            if self.keys[i] is not None:
                self.keys[i] = self.keys[i][:, :, :length]
                self.values[i] = self.values[i][:, :, :length]


def batched_prefix(cache: DrafterCache, layer_index: int, extra, batch_size: int):
    """Prefix keys/values of one layer for a batch of blocks: the cached context, then ``extra`` rows.

    ``extra`` is ``(per-layer [(keys, values)] of E rows, visibility [B, E])`` or None; every block
    gets the same rows (which of them it may see is decided by :func:`context_block_mask`).
    """
    keys = [] if cache.layer(layer_index) is None else [cache.layer(layer_index)]
    if extra is not None:
        keys.append(extra[0][layer_index])
    if not keys:
        return None
    return (
        torch.cat([k.expand(batch_size, -1, -1, -1) for k, _ in keys], dim=2),
        torch.cat([v.expand(batch_size, -1, -1, -1) for _, v in keys], dim=2),
    )


def context_block_mask(batch_size: int, length: int, context_len: int, extra_visible: torch.Tensor | None, causal: bool, device) -> torch.Tensor:
    """Boolean mask [B, 1, L, C + E + L]: the whole cached context, the visible extra rows, the block itself.

    ``extra_visible`` is [B, E] (the same rows for every position of a block) or None.
    """
    parts = [torch.ones(batch_size, length, context_len, dtype=torch.bool, device=device)]
    if extra_visible is not None:
        parts.append(extra_visible.to(device)[:, None, :].expand(batch_size, length, -1))
    i = torch.arange(length, device=device)
    inner = (i[None, :] <= i[:, None]) if causal else torch.ones(length, length, dtype=torch.bool, device=device)
    parts.append(inner[None].expand(batch_size, length, length))
    return torch.cat(parts, dim=-1)[:, None]
