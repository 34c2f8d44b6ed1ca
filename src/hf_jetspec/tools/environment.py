"""What a measurement ran on: package versions, threads, CPU and dtype capability, date.

Every benchmark result and regeneration manifest records this next to its figures, so a number can
be traced to the machine that produced it.
"""

from __future__ import annotations

import datetime
import os
import platform
from importlib.metadata import version
from pathlib import Path

import torch

from .dtypes import describe_capability


def cpu_name(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    """The CPU's model name with its core count, e.g. ``"AMD EPYC 9R14 (2 cores)"``; the platform's
    processor name where ``cpuinfo`` cannot be read or names no model."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def describe_environment(device: torch.device) -> dict:
    """Versions (hf_jetspec, torch, transformers, Python), the device, torch's thread count, the CPU,
    the device's dtype capability (:func:`~hf_jetspec.tools.dtypes.describe_capability`), the GPU's
    name on CUDA, and the UTC date to the minute."""
    import transformers

    env = {
        "hf_jetspec": version("hf-jetspec"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        **describe_capability(device),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env
