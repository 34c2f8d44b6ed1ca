"""Data scaling of drafters: what more target-written answers buy, as a fitted line on a log axis.

A drafter's acceptance length grows with its training data in the seeds and in published
block-drafter results roughly as a straight line in the logarithm of the data, over the ranges
measured. :func:`fit_log_linear` fits ``tau = a + b * log10(answers)`` to measured points by least
squares; :func:`answers_for_tau` and :func:`tau_at` read the line forwards and backwards. These
are extrapolations on paper: they assume the same recipe (epochs, drafter size, sources) and no
saturation, which the points themselves cannot show beyond their own range (tau is also bounded
by the block size). :func:`regeneration_cpu_hours` prices the first ``n`` answers of a
regeneration from its manifest; :func:`manifest_record` is the manifest as committed beside them.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LogLinearFit:
    """``tau = intercept + slope * log10(answers)``; ``slope`` is the gain per tenfold data."""

    intercept: float
    slope: float
    points: int

    @property
    def per_doubling(self) -> float:
        return self.slope * math.log10(2.0)


def fit_log_linear(answers: list[float], tau: list[float]) -> LogLinearFit:
    """Least-squares line through ``(log10 answers, tau)``; needs two or more distinct data sizes."""
    if len(answers) != len(tau):
        raise ValueError(f"{len(answers)} data sizes but {len(tau)} tau values")
    if any(a <= 0 for a in answers):
        raise ValueError("data sizes must be positive")
    xs = [math.log10(a) for a in answers]
    if len(set(xs)) < 2:
        raise ValueError("a line needs points at two or more data sizes")
    mx, my = sum(xs) / len(xs), sum(tau) / len(tau)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, tau)) / sum((x - mx) ** 2 for x in xs)
    return LogLinearFit(my - slope * mx, slope, len(xs))


def tau_at(fit: LogLinearFit, answers: float) -> float:
    return fit.intercept + fit.slope * math.log10(answers)


def answers_for_tau(fit: LogLinearFit, tau: float) -> float:
    """Answers at which the line reaches ``tau`` (inf where it never rises to it)."""
    if fit.slope <= 0:
        return math.inf
    return 10.0 ** ((tau - fit.intercept) / fit.slope)


def regeneration_cpu_hours(manifest: dict, answers: int) -> float:
    """CPU-hours the first ``answers`` of a regeneration cost (all threads, every stint): read off the
    manifest's ``cpu_seconds_at`` record (CPU seconds when the cache held N sequences), linear between
    the two records around ``answers`` (from 0 CPU seconds at 0 answers); a manifest without records
    prorates its total by answers."""
    done = int(manifest["num_sequences"])
    if not 0 < answers <= done:
        raise ValueError(f"the regeneration holds {done} answers, not {answers}")
    marks = sorted((int(n), float(c)) for n, c in (manifest.get("cpu_seconds_at") or {}).items())
    marks = [(0, 0.0)] + [(n, c) for n, c in marks if n > 0] + [(done, float(manifest.get("cpu_seconds", 0.0)))]
    for (n0, c0), (n1, c1) in zip(marks, marks[1:]):
        if n0 < answers <= n1:
            return (c0 + (c1 - c0) * (answers - n0) / (n1 - n0)) / 3600.0
    return float(manifest.get("cpu_seconds", 0.0)) / 3600.0 * answers / done


MANIFEST_FIELDS = ("target", "dtype", "config", "layer_ids", "sources", "num_sequences", "greedy", "sampled",
                   "generated_tokens", "cpu_seconds", "stints")


def manifest_record(manifest: dict) -> dict:
    """A regeneration manifest as committed beside the results trained on it: every field but the
    per-prompt hashes and CPU-second marks, which are replaced by ``prompts``, the number of prompts
    selected, and ``prompts_sha256``, one SHA-256 over the per-prompt hashes in order (hex, joined by
    newlines). A rebuild from the same command must give the same hash, so the few hundred bytes
    stand for the 2 MB list."""
    hashes = list(manifest.get("prompts_sha256") or [])
    return {k: manifest.get(k) for k in MANIFEST_FIELDS} | {
        "prompts": len(hashes), "prompts_sha256": hashlib.sha256("\n".join(hashes).encode()).hexdigest()}
