"""int8 weight storage: matrices kept as int8 with one scale per output channel, dequantised at load.

A drafter folder saved with ``save_pretrained(..., weight_storage="int8")`` holds, for every
floating-point matrix with at least ``min_numel`` entries, ``name`` as int8 and ``name + SCALE_SUFFIX``
as float32 scales [rows], with ``w[r, c] ~= q[r, c] * scale[r]`` and ``scale[r] = max_c |w[r, c]| / 127``
(symmetric, round to nearest): the error of an entry is at most half its row's scale. Vectors (norm
weights, biases) and small matrices stay as they are. Only the stored file changes; the loaded drafter
is an ordinary floating-point model, and verification keeps generation exact whatever its weights.
"""

from __future__ import annotations

import torch

SCALE_SUFFIX = ".int8_scale"
INT8_STORAGE = "int8"


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q int8 [R, C], scale float32 [R])`` of a 2-D tensor; all-zero rows get scale 1."""
    if weight.dim() != 2:
        raise ValueError(f"per-channel int8 needs a matrix, got shape {tuple(weight.shape)}")
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.float() * scale.float()[:, None]).to(dtype)


def pack_int8(state: dict[str, torch.Tensor], min_numel: int = 4096) -> dict[str, torch.Tensor]:
    """The tensors to store: large floating-point matrices as int8 plus their scales, the rest as given."""
    out = {}
    for name, t in state.items():
        if name.endswith(SCALE_SUFFIX):
            raise ValueError(f"tensor name {name!r} ends with the reserved suffix {SCALE_SUFFIX!r}")
        if t.is_floating_point() and t.dim() == 2 and t.numel() >= min_numel:
            out[name], out[name + SCALE_SUFFIX] = quantize_rows(t)
        else:
            out[name] = t
    return out


def unpack_int8(stored: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Inverse of :func:`pack_int8`: int8 matrices with a stored scale come back as ``dtype``."""
    out = {}
    for name, t in stored.items():
        if name.endswith(SCALE_SUFFIX):
            if name[: -len(SCALE_SUFFIX)] not in stored:
                raise ValueError(f"scale {name!r} has no int8 matrix beside it")
            continue
        scale = stored.get(name + SCALE_SUFFIX)
        if scale is not None:
            if t.dtype != torch.int8 or scale.shape != t.shape[:1]:
                raise ValueError(f"{name!r}: expected an int8 matrix with {t.shape[0]} row scales, got {t.dtype} and {tuple(scale.shape)}")
            out[name] = dequantize_rows(t, scale, dtype)
        else:
            out[name] = t.to(dtype) if t.is_floating_point() else t
    return out
