"""The speculation cache: blocks pre-drafted for outcomes (k, a) of the round under verification."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CachedBlock:
    """A block drafted for outcome (k, a): its anchor ``a`` and draft ``tokens`` after it."""

    k: int
    anchor: int
    tokens: torch.Tensor
    logits: torch.Tensor | None = None


class SpeculationCache:
    """Blocks keyed by outcome ``(k, a)``; filled for one round, looked up once, then cleared."""

    def __init__(self):
        self._blocks: dict[tuple[int, int], CachedBlock] = {}
        self.lookups = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._blocks

    def keys(self) -> list[tuple[int, int]]:
        return list(self._blocks)

    def put(self, block: CachedBlock) -> None:
        self._blocks[(int(block.k), int(block.anchor))] = block

    def lookup(self, k: int, anchor: int) -> CachedBlock | None:
        """The block for the realised outcome, or None (a miss). Counts the lookup."""
        self.lookups += 1
        block = self._blocks.get((int(k), int(anchor)))
        if block is not None:
            self.hits += 1
        return block

    def clear(self) -> None:
        self._blocks.clear()

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.lookups if self.lookups else None
