"""The log-normaliser of logit rows in float32, a few rows at a time."""

from __future__ import annotations

import torch


def log_normaliser(logits: torch.Tensor, rows_per_chunk: int = 4) -> torch.Tensor:
    """``logsumexp`` over the last dim in float32, for logits of any float dtype.

    Rows are upcast a few at a time, so no float32 copy of the whole table is ever held (a decoder
    table is [gamma + 1, V]); on CPU this is both faster and more accurate than exponentiating in
    bf16 (measured in ``docs/reports/2026-11-30-drafting-engine-ms-per-round.md``)."""
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.dtype == torch.float32:
        out = torch.logsumexp(flat, -1)
    else:
        out = torch.cat([torch.logsumexp(chunk.float(), -1) for chunk in flat.split(rows_per_chunk)])
    return out.reshape(logits.shape[:-1])
