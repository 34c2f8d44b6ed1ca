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
