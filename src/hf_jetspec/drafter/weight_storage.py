"""Compact weight storage: int8 with one scale per output channel, or int4 with one scale per group of
columns; dequantised at load.

A drafter folder saved with ``save_pretrained(..., weight_storage="int8")`` holds, for every
floating-point matrix with at least ``min_numel`` entries, ``name`` as int8 and ``name + SCALE_SUFFIX``
as float32 scales [rows], with ``w[r, c] ~= q[r, c] * scale[r]`` and ``scale[r] = max_c |w[r, c]| / 127``
(symmetric, round to nearest): the error of an entry is at most half its row's scale. Vectors (norm
weights, biases) and small matrices stay as they are. Only the stored file changes; the loaded drafter
is an ordinary floating-point model, and verification keeps generation exact whatever its weights.

int4 storage (``weight_storage="int4"``) halves that again: each row is cut into groups of
``group_size`` consecutive columns, each group with its own scale ``max |w| / 7``, entries rounded to
the integers ``-7..7`` and stored two to a byte (``q + 8``: the even column in the low nibble, the odd
one in the high nibble) as ``name`` (uint8 [R, C / 2]) beside ``name + INT4_SCALE_SUFFIX`` (float16
[R, C / group_size]). Matrices whose width is not a multiple of the group size stay int8.
"""

from __future__ import annotations

import torch

SCALE_SUFFIX = ".int8_scale"
INT4_SCALE_SUFFIX = ".int4_scale"
INT8_STORAGE = "int8"
INT4_STORAGE = "int4"
WEIGHT_STORAGES = (INT8_STORAGE, INT4_STORAGE)
INT4_GROUP_SIZE = 64


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


def quantize_groups(weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed uint8 [R, C/2], scale float16 [R, C/group_size])`` of a 2-D tensor, symmetric int4 per group."""
    if weight.dim() != 2:
        raise ValueError(f"group-wise int4 needs a matrix, got shape {tuple(weight.shape)}")
    rows, cols = weight.shape
    if group_size < 2 or group_size % 2 or cols % group_size:
        raise ValueError(f"int4 groups of {group_size} columns need an even group size dividing the width {cols}")
    w = weight.detach().float().reshape(rows, cols // group_size, group_size)
    scale = (w.abs().amax(dim=-1) / 7.0).half().float()  # the scale as stored, so rounding uses it
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (torch.round(w / scale[..., None]).clamp(-7, 7) + 8).to(torch.uint8).reshape(rows, cols)
    return q[:, 0::2] | (q[:, 1::2] << 4), scale.half()


def dequantize_groups(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    rows, groups = scale.shape
    q = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(rows, -1).float() - 8
    return (q.reshape(rows, groups, -1) * scale.float()[..., None]).reshape(rows, -1).to(dtype)


def pack_weights(state: dict[str, torch.Tensor], min_numel: int = 4096, storage: str = INT8_STORAGE,
              group_size: int = INT4_GROUP_SIZE) -> dict[str, torch.Tensor]:
    """The tensors to store: large floating-point matrices as int8 (or, with ``storage="int4"``, int4
    where the width allows) plus their scales, the rest as given."""
    if storage not in WEIGHT_STORAGES:
        raise ValueError(f"weight storage must be one of {WEIGHT_STORAGES}, got {storage!r}")
    out = {}
    for name, t in state.items():
        if name.endswith((SCALE_SUFFIX, INT4_SCALE_SUFFIX)):
            raise ValueError(f"tensor name {name!r} ends with a reserved suffix ({SCALE_SUFFIX!r}, {INT4_SCALE_SUFFIX!r})")
        if t.is_floating_point() and t.dim() == 2 and t.numel() >= min_numel:
            if storage == INT4_STORAGE and t.shape[1] % group_size == 0:
                out[name], out[name + INT4_SCALE_SUFFIX] = quantize_groups(t, group_size)
            else:
                out[name], out[name + SCALE_SUFFIX] = quantize_rows(t)
        else:
            out[name] = t
    return out


def unpack_weights(stored: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Inverse of :func:`pack_weights`: int8 and int4 matrices with their stored scales come back as ``dtype``."""
    out = {}
    for name, t in stored.items():
        if name.endswith(SCALE_SUFFIX):
            if name[: -len(SCALE_SUFFIX)] not in stored:
                raise ValueError(f"scale {name!r} has no int8 matrix beside it")
            continue
        if name.endswith(INT4_SCALE_SUFFIX):
            if name[: -len(INT4_SCALE_SUFFIX)] not in stored:
                raise ValueError(f"scale {name!r} has no int4 matrix beside it")
            continue
        scale4 = stored.get(name + INT4_SCALE_SUFFIX)
        if scale4 is not None:
            groups = scale4.shape[1] if scale4.dim() == 2 else 0
            if t.dtype != torch.uint8 or scale4.dim() != 2 or scale4.shape[0] != t.shape[0] or groups == 0 or (2 * t.shape[1]) % groups:
                raise ValueError(f"{name!r}: expected a packed uint8 int4 matrix with {t.shape[0]} rows of group scales, "
                                 f"got {t.dtype} {tuple(t.shape)} and scales {tuple(scale4.shape)}")
            out[name] = dequantize_groups(t, scale4, dtype)
            continue
        scale = stored.get(name + SCALE_SUFFIX)
        if scale is not None:
            if t.dtype != torch.int8 or scale.shape != t.shape[:1]:
                raise ValueError(f"{name!r}: expected an int8 matrix with {t.shape[0]} row scales, got {t.dtype} and {tuple(scale.shape)}")
            out[name] = dequantize_rows(t, scale, dtype)
        else:
            out[name] = t.to(dtype) if t.is_floating_point() else t
    return out
