"""Preallocated key/value caches of the models that keep a verified context (drafter, adapters, decoder).

Keys and values of the verified context are written by index into per-layer buffers that grow by
doubling, so a round never concatenates the context again. A forward over one block writes the
block's own keys/values into the free rows right after the context (:meth:`DrafterCache.block_keys`)
and attends over one contiguous view; those rows are scratch (the context length does not move),
so the next pass or round simply overwrites them. Only verified positions ever become context:
the cache never holds rejected tokens, and :meth:`DrafterCache.crop` exists for callers that
rewind generation.
"""

from __future__ import annotations

import torch

from .masks import context_block_mask, prefix_block_mask, sliding_window_mask

MIN_CAPACITY = 256


class DrafterCache:
    """Per-layer keys/values [1, kv_heads, capacity, head_dim] of the verified context before the anchor."""

    def __init__(self, num_layers: int, capacity: int = MIN_CAPACITY):
        self.num_layers = num_layers
        self.capacity = max(1, int(capacity))
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers
        self._lengths = [0] * num_layers
        self._masks: dict[int, tuple[int, torch.Tensor]] = {}

    def __len__(self) -> int:
        return self._lengths[0] if self.num_layers else 0

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Views of the cached keys/values of layer ``i`` (None while empty)."""
        n = self._lengths[i]
        if n == 0:
            return None
        return self._keys[i][:, :, :n], self._values[i][:, :, :n]

    @property
    def buffers(self) -> tuple[list, list]:
        """The whole per-layer key and value buffers (capacity rows each; None before the first append)."""
        return self._keys, self._values

    def _reserve(self, i: int, rows: int, like: torch.Tensor) -> None:
        """Make room for ``rows`` rows in layer ``i`` (allocate, or grow by doubling and copy once)."""
        buf = self._keys[i]
        if buf is not None and buf.shape[2] >= rows and buf.dtype == like.dtype and buf.device == like.device:
            return
        capacity = max(self.capacity, MIN_CAPACITY)
        while capacity < rows:
            capacity *= 2
        self.capacity = capacity
        shape = (1, like.shape[1], capacity, like.shape[3])
        keys = torch.zeros(shape, dtype=like.dtype, device=like.device)
        values = torch.zeros(shape, dtype=like.dtype, device=like.device)
        n = self._lengths[i]
        if n:
            keys[:, :, :n] = self._keys[i][:, :, :n]
            values[:, :, :n] = self._values[i][:, :, :n]
        self._keys[i], self._values[i] = keys, values

    def append(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add the keys/values [1, kv_heads, T, D] of T verified positions to layer ``i``."""
        self.block_keys(i, k, v)
        self._lengths[i] += k.shape[2]

    def block_keys(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values of layer ``i``'s context followed by one block's rows ``k``/``v`` [1, kv, L, D].

        The block rows go into the scratch rows after the context (not counted in ``len``), so the
        result is one contiguous view with nothing concatenated."""
        n, t = self._lengths[i], k.shape[2]
        self._reserve(i, n + t, k)
        self._keys[i][:, :, n : n + t] = k
        self._values[i][:, :, n : n + t] = v
        return self._keys[i][:, :, : n + t], self._values[i][:, :, : n + t]

    def block_mask(self, length: int, causal: bool, device) -> torch.Tensor | None:
        """[1, 1, L, len + L] mask of one block after the whole context (None when nothing is masked);
        a view of a table built once per block length and capacity."""
        if not causal:
            return None
        built = self._masks.get(length)
        if built is None or built[0] < len(self) or not _same_device(built[1].device, torch.device(device)):
            capacity = max(self.capacity, len(self))
            built = (capacity, prefix_block_mask(length, capacity).to(device))
            self._masks[length] = built
        return built[1][None, None, :, built[0] - len(self) :]

    def keep_last(self, rows: int) -> None:
        """Keep only the newest ``rows`` rows of every layer, moved to the front of its buffer.

        Keys carry the rotary phase of their own sequence positions, so attention over what is kept
        is unchanged; the rows simply no longer sit at their position's index."""
        if rows < 0:
            raise ValueError(f"cannot keep {rows} rows")
        for i, n in enumerate(self._lengths):
            if n <= rows:
                continue
            if rows:
                self._keys[i][:, :, :rows] = self._keys[i][:, :, n - rows : n].clone()
                self._values[i][:, :, :rows] = self._values[i][:, :, n - rows : n].clone()
            self._lengths[i] = rows

    def crop(self, length: int) -> None:
        if length < 0 or length > len(self):
            raise ValueError(f"cannot crop a cache of length {len(self)} to {length}")
        self._lengths = [min(n, length) for n in self._lengths]


def gather_pending(pending: list, window: int | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Verified rows a drafter cache has not taken yet, as one batch: ``pending`` holds, oldest
    first, ``(per-layer states [1, T, H], positions [T])``; returns the per-layer states and the
    positions of all of them, or of the newest ``window`` rows only (older rows are not copied)."""
    if not pending:
        raise ValueError("nothing pending")
    if window is not None:
        kept, rows = [], 0
        for states, positions in reversed(pending):
            if rows >= window:
                break
            take = min(positions.numel(), window - rows)
            kept.append(([st[:, -take:] for st in states], positions[-take:]))
            rows += take
        pending = kept[::-1]
    if len(pending) == 1:
        return list(pending[0][0]), pending[0][1]
    layers = [torch.cat([states[i] for states, _ in pending], dim=1) for i in range(len(pending[0][0]))]
    return layers, torch.cat([positions for _, positions in pending])


def trim_pending(pending: list, window: int | None) -> None:
    """Drop, in place, the oldest pending entries that ``window`` would never read (entries are kept whole)."""
    if window is None:
        return
    rows = 0
    for j in range(len(pending) - 1, -1, -1):
        rows += pending[j][1].numel()
        if rows >= window:
            del pending[:j]
            return


class BlockAttention:
    """What the layers of one forward over ``B`` blocks of ``L`` rows attend to: a cache's context,
    optional extra rows (``extra = (per-layer keys/values [1, kv, E, D], visibility [B, E])``), and
    each block itself.

    One block without extra rows (every plain drafting pass) takes the fast path: the block's keys
    are written into the cache's scratch rows and the mask is a view of a prebuilt table. Batches
    and extra rows concatenate per layer.

    With a ``window`` (sliding-window drafters), ``positions`` [B, L] are the blocks' sequence
    positions; context row ``t`` is position ``t`` and extra rows follow the context. Keys further
    than the window are masked once some block reaches past it.
    """

    def __init__(self, cache: DrafterCache, batch_size: int, length: int, extra, causal: bool, device,
                 window: int | None = None, positions: torch.Tensor | None = None):
        self.cache = cache
        self.extra = extra
        self.batch_size = batch_size
        self.fast = extra is None and batch_size == 1 and cache.num_layers > 0
        if self.fast:
            self.mask = cache.block_mask(length, causal, device)
        else:
            self.mask = context_block_mask(batch_size, length, len(cache), None if extra is None else extra[1], causal, device)
        if window is not None and positions is not None and int(positions.max()) >= window:
            rows = len(cache) + (0 if extra is None else extra[1].shape[1])
            keys = torch.cat([torch.arange(rows)[None].expand(batch_size, -1), positions], dim=1)
            near = sliding_window_mask(positions, keys, window).to(device)
            self.mask = near if self.mask is None else self.mask & near

    def keys(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values layer ``i`` attends over, given the block's own ``k``/``v`` [B, kv, L, D]."""
        if self.fast:
            return self.cache.block_keys(i, k, v)
        parts = [] if self.cache.layer(i) is None else [self.cache.layer(i)]
        if self.extra is not None:
            parts.append(self.extra[0][i])
        if not parts:
            return k, v
        b = self.batch_size
        return (
            torch.cat([p.expand(b, -1, -1, -1).to(k.dtype) for p, _ in parts] + [k], dim=2),
            torch.cat([q.expand(b, -1, -1, -1).to(v.dtype) for _, q in parts] + [v], dim=2),
        )


def _same_device(have: torch.device, want: torch.device) -> bool:
    """``cuda:0`` matches ``cuda`` (no index given) and ``cuda:0``."""
    return have.type == want.type and (want.index is None or have.index == want.index)
