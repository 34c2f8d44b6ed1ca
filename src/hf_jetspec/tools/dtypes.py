"""Which dtype to run in: names, CPU capability detection and ``"auto"``.

fp32 is the exactness reference. bf16 is the speed configuration where the hardware has native bf16
matrix instructions: CUDA GPUs that report bf16 support, and CPUs with ``avx512_bf16`` or
``amx_bf16``. On other CPUs torch emulates bf16 matrix products and they are slower than fp32, so
``"auto"`` never picks bf16 there.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
CHOICES = ("auto", "bfloat16", "float32", "float16")
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16_flags(cpuinfo: str) -> list[str]:
    """The native bf16 instruction flags named in the text of ``/proc/cpuinfo`` (pure; testable)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return [f for f in NATIVE_BF16_CPU_FLAGS if f in flags]


@functools.lru_cache(maxsize=1)
def cpu_bf16_flags() -> tuple[str, ...]:
    """Native bf16 flags of this machine's CPU ((): none, or the CPU could not be read)."""
    try:
        return tuple(native_bf16_flags(Path("/proc/cpuinfo").read_text()))
    except OSError:
        return ()


def has_native_bf16(device: str | torch.device = "cpu") -> bool:
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        return bool(cpu_bf16_flags())
    return False


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device = "cpu") -> torch.dtype:
    """A ``torch.dtype`` from a name (``auto``, ``bfloat16``/``bf16``, ``float32``/``fp32``, ``float16``/``fp16``).

    ``auto`` (and None) is bf16 where ``device`` has native bf16 matrix instructions, fp32 elsewhere.
    """
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_NAMES.values():
            raise ValueError(f"unsupported dtype {dtype}; use one of {CHOICES}")
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if has_native_bf16(device) else torch.float32
    if not isinstance(dtype, str) or dtype.lower() not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {CHOICES} (or bf16, fp32, fp16)")
    return DTYPE_NAMES[dtype.lower()]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe_capability(device: str | torch.device = "cpu") -> dict:
    """What the bench records about the machine's bf16 support."""
    device = torch.device(device)
    out = {"native_bf16": has_native_bf16(device)}
    if device.type == "cpu":
        out["cpu_bf16_flags"] = list(cpu_bf16_flags())
    return out
