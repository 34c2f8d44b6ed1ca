"""Fused draft head: logits tiles, their argmax and the log-normaliser, without materialising the logits.

A drafting round needs, per block row, the argmax draft token and the top-1 probability (the round
policy's acceptance feature), i.e. ``argmax``, ``max`` and ``logsumexp`` of ``hidden @ head.T``.
The torch path (:func:`head_summary_torch`) computes the logits and reduces them; the Triton
kernel computes the logits tile by tile in registers and writes only per-tile partials (max,
argmax, sum of exponentials), combined on the host side in a few small ops. The torch path is the
reference and the fallback: the kernel is used only on CUDA, and only where
:func:`select_head_kernel` measured it faster for the shape at hand. Its tests run in Triton's
interpreter on CPU (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .log_normaliser import log_normaliser

try:  # Triton is optional: without it (or without CUDA) everything runs the torch path
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the installation
    triton = None
    tl = None


@dataclass
class HeadSummary:
    """Per row: the argmax index into the head's rows, the max logit and the log-normaliser (float32)."""

    ids: torch.Tensor
    max_logit: torch.Tensor
    log_norm: torch.Tensor

    @property
    def top1_prob(self) -> torch.Tensor:
        return torch.exp(self.max_logit - self.log_norm)


def triton_available() -> bool:
    return triton is not None


def summarise_logits(logits: torch.Tensor) -> HeadSummary:
    """:class:`HeadSummary` of logits [..., V], flattened to rows."""
    flat = logits.reshape(-1, logits.shape[-1])
    top, ids = flat.max(-1)
    return HeadSummary(ids, top.float(), log_normaliser(flat))


def head_summary_torch(hidden: torch.Tensor, weight: torch.Tensor) -> HeadSummary:
    """Reference: logits in the weights' dtype, then argmax, max and logsumexp (float32 accumulation)."""
    return summarise_logits(torch.nn.functional.linear(hidden.to(weight.dtype), weight))


if triton is not None:

    @triton.jit
    def _head_partials_kernel(h_ptr, w_ptr, max_ptr, arg_ptr, sum_ptr, R, V, H,
                              stride_hr, stride_wv, n_tiles,
                              BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
        tile = tl.program_id(0)
        rows = tl.arange(0, BLOCK_R)
        cols = tile * BLOCK_V + tl.arange(0, BLOCK_V)
        acc = tl.zeros((BLOCK_R, BLOCK_V), dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            hs = h0 + tl.arange(0, BLOCK_H)
            a = tl.load(h_ptr + rows[:, None] * stride_hr + hs[None, :], mask=(rows[:, None] < R) & (hs[None, :] < H), other=0.0)
            b = tl.load(w_ptr + cols[None, :] * stride_wv + hs[:, None], mask=(cols[None, :] < V) & (hs[:, None] < H), other=0.0)
            acc += tl.dot(a, b, input_precision="ieee")
        acc = tl.where(cols[None, :] < V, acc, float("-inf"))
        m = tl.max(acc, axis=1)
        idx = tl.argmax(acc, axis=1) + tile * BLOCK_V
        s = tl.sum(tl.exp(acc - m[:, None]), axis=1)
        out = rows * n_tiles + tile
        tl.store(max_ptr + out, m, mask=rows < R)
        tl.store(arg_ptr + out, idx, mask=rows < R)
        tl.store(sum_ptr + out, s, mask=rows < R)


def head_summary_triton(hidden: torch.Tensor, weight: torch.Tensor, block_v: int = 128, block_h: int = 64) -> HeadSummary:
    """The fused kernel (CUDA, or Triton's interpreter on CPU tensors). ``hidden`` [R, H] with R <= 128."""
    if triton is None:
        raise RuntimeError("Triton is not installed")
    hidden = hidden.to(weight.dtype).contiguous()
    weight = weight.contiguous()
    rows, size = hidden.shape
    vocab = weight.shape[0]
    if rows > 128:
        raise ValueError(f"the fused head takes at most 128 rows at a time, got {rows}")
    block_r = max(16, triton.next_power_of_2(rows))
    n_tiles = triton.cdiv(vocab, block_v)
    maxes = torch.empty(rows, n_tiles, dtype=torch.float32, device=hidden.device)
    args = torch.empty(rows, n_tiles, dtype=torch.int64, device=hidden.device)
    sums = torch.empty(rows, n_tiles, dtype=torch.float32, device=hidden.device)
    _head_partials_kernel[(n_tiles,)](hidden, weight, maxes, args, sums, rows, vocab, size, hidden.stride(0), weight.stride(0), n_tiles,
                                      BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_H=block_h)
    return combine_partials(maxes, args, sums)


def combine_partials(maxes: torch.Tensor, args: torch.Tensor, sums: torch.Tensor) -> HeadSummary:
    """Per-tile (max, argmax, sum of exp(logit - max)) [R, T] -> the row summary (the first maximal tile wins ties)."""
    top, tile = maxes.max(-1)
    ids = args.gather(-1, tile[:, None]).squeeze(-1)
    log_norm = top + torch.log((sums * torch.exp(maxes - top[:, None])).sum(-1))
    return HeadSummary(ids, top, log_norm)


_CHOICES: dict[tuple, bool] = {}


def select_head_kernel(hidden: torch.Tensor, weight: torch.Tensor, repeats: int = 20) -> bool:
    """Whether the fused kernel is the faster path for this shape on this device: never on CPU, never
    without Triton; on CUDA timed once per (rows, vocab, width, dtype) against the torch path."""
    if hidden.device.type != "cuda" or triton is None:
        return False
    key = (hidden.shape[0], weight.shape[0], weight.shape[1], weight.dtype, hidden.device)
    if key not in _CHOICES:
        def timed(fn):
            fn(hidden, weight)
            torch.cuda.synchronize(hidden.device)
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn(hidden, weight)
            torch.cuda.synchronize(hidden.device)
            return time.perf_counter() - t0

        try:
            _CHOICES[key] = timed(head_summary_triton) < timed(head_summary_torch)
        except Exception:  # a kernel that fails to build or run is simply not chosen
            _CHOICES[key] = False
    return _CHOICES[key]


def head_summary(hidden: torch.Tensor, weight: torch.Tensor) -> HeadSummary:
    """:class:`HeadSummary` of ``hidden @ weight.T`` by the faster measured path (the torch one on CPU)."""
    if select_head_kernel(hidden, weight):
        return head_summary_triton(hidden, weight)
    return head_summary_torch(hidden, weight)
