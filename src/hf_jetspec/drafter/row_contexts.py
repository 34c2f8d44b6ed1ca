"""The verified contexts of several sequences at once, for a drafter that drafts them in one forward.

A batch of prompts accepts a different number of tokens per row each round, so the rows' contexts
grow at different rates. Each layer keeps one key buffer and one value buffer ``[B, kv_heads,
capacity, head_dim]``; row ``b``'s context fills columns ``0 .. lengths[b] - 1`` (left-aligned,
in position order) and the columns after it are free. A round writes each row's newly verified
keys at its own length (a copy of those rows only), and a drafting forward attends over the
columns up to the longest row with a visibility mask ``[B, C]`` that hides each shorter row's free
columns (:meth:`RowContexts.view`). Keys carry the rotary phase of their own positions, so a row
attends exactly as its one-row cache would. With a ``window``, a row keeps its newest ``window``
columns, moved to the front when the window slides. Rows that finish leave with
:meth:`RowContexts.select`.
"""

from __future__ import annotations

import torch

MIN_CAPACITY = 256


class RowContexts:
    """Per-layer keys/values of the verified contexts of ``rows`` sequences (see the module docstring)."""

    def __init__(self, num_layers: int, rows: int, window: int | None = None):
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.num_layers = num_layers
        self.window = window
        self.lengths = [0] * rows
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def _reserve(self, i: int, columns: int, like: torch.Tensor) -> None:
        buf = self._keys[i]
        if buf is not None and buf.shape[2] >= columns:
            return
        capacity = MIN_CAPACITY if buf is None else buf.shape[2]
        while capacity < columns:
            capacity *= 2
        shape = (self.rows, like.shape[1], capacity, like.shape[3])
        keys = torch.zeros(shape, dtype=like.dtype, device=like.device)
        values = torch.zeros(shape, dtype=like.dtype, device=like.device)
        if buf is not None:
            used = max(self.lengths)
            keys[:, :, :used] = buf[:, :, :used]
            values[:, :, :used] = self._values[i][:, :, :used]
        self._keys[i], self._values[i] = keys, values

    def write(self, layer_kv: list[tuple[torch.Tensor, torch.Tensor]], counts: list[int]) -> None:
        """Append ``counts[b]`` verified positions to each row ``b``: ``layer_kv[i]`` holds layer ``i``'s
        keys/values ``[1, kv, sum(counts), D]`` of all rows' new positions, packed in row order.
        With a window, no row may receive more than ``window`` at once (project only the newest)."""
        if len(counts) != self.rows:
            raise ValueError(f"{len(counts)} counts for {self.rows} rows")
        if self.window is not None and max(counts) > self.window:
            raise ValueError(f"{max(counts)} new positions for a row of a {self.window}-position window")
        starts = []
        for b, count in enumerate(counts):
            if self.window is not None and self.lengths[b] + count > self.window:
                self._slide(b, self.window - count)
            starts.append(self.lengths[b])
        top = max(s + c for s, c in zip(starts, counts))
        for i, (k, v) in enumerate(layer_kv):
            self._reserve(i, top, k)
            offset = 0
            for b, count in enumerate(counts):
                if count:
                    self._keys[i][b, :, starts[b] : starts[b] + count] = k[0, :, offset : offset + count]
                    self._values[i][b, :, starts[b] : starts[b] + count] = v[0, :, offset : offset + count]
                offset += count
        self.lengths = [s + c for s, c in zip(starts, counts)]

    def _slide(self, b: int, keep: int) -> None:
        """Keep row ``b``'s newest ``keep`` columns, moved to the front."""
        n = self.lengths[b]
        if keep > 0:
            for i in range(self.num_layers):
                if self._keys[i] is not None:
                    self._keys[i][b, :, :keep] = self._keys[i][b, :, n - keep : n].clone()
                    self._values[i][b, :, :keep] = self._values[i][b, :, n - keep : n].clone()
        self.lengths[b] = max(keep, 0)

    def select(self, index: list[int]) -> None:
        """Keep the rows ``index`` (in that order): finished rows leave the batch."""
        picked = torch.tensor(index, dtype=torch.long)
        for i in range(self.num_layers):
            if self._keys[i] is not None:
                at = picked.to(self._keys[i].device)
                self._keys[i] = self._keys[i].index_select(0, at)
                self._values[i] = self._values[i].index_select(0, at)
        self.lengths = [self.lengths[j] for j in index]

    def view(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Per-layer keys/values ``[B, kv, C, D]`` of the columns up to the longest row (views, nothing
        copied), and the visibility ``[B, C]``: column ``t`` of row ``b`` holds context iff ``t < lengths[b]``.

        >>> ctx = RowContexts(1, 2)
        >>> ctx.write([(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))], [1, 2])
        >>> ctx.view()[1].tolist()
        [[True, False], [True, True]]
        """
        used = max(self.lengths)
        if used == 0 or self._keys[0] is None:
            raise ValueError("no row has any context yet")
        layers = [(self._keys[i][:, :, :used], self._values[i][:, :, :used]) for i in range(self.num_layers)]
        lengths = torch.tensor(self.lengths)
        visible = torch.arange(used)[None, :] < lengths[:, None]
        return layers, visible.to(layers[0][0].device)
