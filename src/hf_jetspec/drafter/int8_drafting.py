"""int8 drafting: the drafter's layer matrices and draft head multiplied in int8 on the CPU.

Weights are quantised per output channel, exactly as :mod:`hf_jetspec.drafter.weight_storage` stores them
(``w[r, c] ~= q[r, c] * s_w[r]``), so a folder saved with int8 storage drafts from its own stored
integers. Activations are quantised per row at every call (dynamic quantisation: ``x[i, c] ~= a[i, c]
* s_x[i]``, ``s_x[i] = max_c |x[i, c]| / 127``), the product ``a @ q.T`` runs in int8 with int32
accumulation (``torch._int_mm``), and the result is ``acc[i, r] * s_x[i] * s_w[r]``.

Only drafting changes: verification compares the drafts with the target's own tokens, so the output
is still the target's. The context projection (``fc``) stays in floating point: it reads the
target's raw hidden states, whose few very large features would leave the others almost no levels
under per-row quantisation. Eagerly the activation quantisation around each product costs about
what the int8 product saves; compiled (``DraftingConfig(compile=True)``) it fuses into the
neighbouring work (``benchmarks/round_cost.py`` with an ``@compile+int8`` tree).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from .weight_storage import quantize_rows

_PACKED = "_int8_packed"


def quantize_activation_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a int8 [R, C], scale float32 [R, 1])`` with ``x ~= a * scale`` per row (all-zero rows: scale 1e-8/127)."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp_min(1e-8) / 127.0
    return torch.round(xf / scale).to(torch.int8), scale


def int8_linear(x: torch.Tensor, q_t: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` [..., R] with ``w ~= q_t.T * w_scale[:, None]`` (``q_t`` int8 [C, R], ``w_scale`` float32 [R]),
    the product in int8 after quantising each row of ``x`` [..., C]; returned in ``x``'s dtype."""
    shape = x.shape
    a, x_scale = quantize_activation_rows(x.reshape(-1, shape[-1]))
    acc = torch._int_mm(a, q_t)
    return (acc.float() * x_scale * w_scale).to(x.dtype).reshape(*shape[:-1], q_t.shape[1])


def pack_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_t int8 [C, R], scale float32 [R])`` of a weight [R, C] for :func:`int8_linear`."""
    q, scale = quantize_rows(weight)
    return q.t().contiguous(), scale


def _int8_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    q_t, scale = self.__dict__[_PACKED]
    y = int8_linear(x, q_t, scale)
    return y if self.bias is None else y + self.bias


def quantize_linear(linear: nn.Linear) -> None:
    """Make ``linear`` multiply in int8 from a snapshot of its current weight. Its parameters and
    state dict are untouched (saving still writes the floating weights); :func:`restore_linear` undoes it."""
    linear.__dict__[_PACKED] = pack_weight(linear.weight)
    linear.forward = types.MethodType(_int8_forward, linear)


def restore_linear(linear: nn.Linear) -> None:
    """Undo :func:`quantize_linear` (no-op on a linear that multiplies in floating point)."""
    if linear.__dict__.pop(_PACKED, None) is not None:
        del linear.forward


def is_quantized(linear: nn.Module) -> bool:
    return _PACKED in linear.__dict__


def check_int8_device(device: torch.device) -> None:
    """int8 drafting runs where it was built and measured: on the CPU."""
    if torch.device(device).type != "cpu":
        raise ValueError(
            f"int8 drafting runs on the CPU only (the drafter is on {device}); set drafting_config.int8=False there"
        )


class Int8Head:
    """The int8 copy of the draft head (``packed``), refreshed eagerly (``set_int8_drafting``,
    ``attach_target``) whenever the drafter's head tensor is replaced, never inside a drafting pass:
    a compiled pass then reads the same tensors every round."""

    def __init__(self):
        self.source: torch.Tensor | None = None
        self.packed: tuple[torch.Tensor, torch.Tensor] | None = None

    def refresh(self, head: torch.Tensor) -> None:
        if self.source is not head:
            self.source, self.packed = head, pack_weight(head)
