"""Moving accepted rows of a key/value cache down in place, for dynamic and static caches alike.

After a verification round only the accepted rows of the verified block stay; they move to the first
free positions, and a dynamic cache is cut to a view while a static cache keeps its capacity.
"""

from __future__ import annotations

import torch


def move_rows_down(layers, start: int, rows: list[int]) -> None:
    """In every cache layer, move the rows at ``start + rows`` (increasing offsets) to ``start ..
    start + len(rows) - 1``, in place; only those after the first gap are copied."""
    m = len(rows)
    first_gap = next((j for j, r in enumerate(rows) if r != j), m)  # rows[:first_gap] are already in place
    if first_gap == m:
        return
    index = None
    dest = slice(start + first_gap, start + m)
    for layer in layers:
        if index is None or index.device != layer.keys.device:
            index = torch.tensor(rows[first_gap:], dtype=torch.long, device=layer.keys.device) + start
        layer.keys[:, :, dest] = layer.keys.index_select(2, index)
        layer.values[:, :, dest] = layer.values.index_select(2, index)


def keep_cache_rows(cache, start: int, rows: list[int]) -> None:
    """Keep, of the cache rows from ``start`` on, only ``rows`` (increasing offsets from ``start``), in order.

    The kept rows move down in place (:func:`move_rows_down`) and the layer is cut to a view, so a
    round costs the accepted rows, not the whole cache."""
    move_rows_down(cache.layers, start, rows)
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, : start + len(rows)]
        layer.values = layer.values[:, :, : start + len(rows)]
