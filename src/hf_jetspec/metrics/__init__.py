"""``evaluate`` modules shipped with the package, loadable offline (no Hub fetch).

    >>> from hf_jetspec.metrics import load
    >>> load("acceptance_length").compute(committed_tokens=[10, 5], rounds=[4, 1])["tau"]
    3.0

``evaluate.load(hf_jetspec.metrics.path("speedup"))`` works the same way.
"""

from __future__ import annotations

from pathlib import Path

METRICS = ("acceptance_length", "speedup", "exact_match")


def path(name: str) -> str:
    """Local folder of a metric module, for ``evaluate.load(path)``."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; available: {METRICS}")
    return str(Path(__file__).resolve().parent / name)


def load(name: str):
    import evaluate

    return evaluate.load(path(name))
