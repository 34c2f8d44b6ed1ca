"""Speedup of a decoding method over a baseline, from tokens and wall-clock seconds measured side by side."""

import datasets
import evaluate

_DESCRIPTION = """
Throughput ratio of a method over a baseline measured on the same prompts in the same run:
(sum(tokens) / sum(seconds)) of the method divided by that of the baseline. Ratios, not absolute
speeds, are what transfer between noisy machines.
"""

_KWARGS = """
Args:
    tokens (list[int]): new tokens per prompt for the method.
    seconds (list[float]): wall-clock seconds per prompt for the method.
    baseline_tokens (list[int]), baseline_seconds (list[float]): the same for the baseline.
Returns:
    speedup, tokens_per_s, baseline_tokens_per_s.
Example:
    >>> m = evaluate.load("hf_jetspec/metrics/speedup")
    >>> m.compute(tokens=[100], seconds=[2.0], baseline_tokens=[100], baseline_seconds=[4.0])["speedup"]
    2.0
"""


class Speedup(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features({"tokens": datasets.Value("int64"), "seconds": datasets.Value("float64")}),
        )

    def _compute(self, tokens, seconds, baseline_tokens, baseline_seconds):
        tps = sum(tokens) / sum(seconds)
        base = sum(baseline_tokens) / sum(baseline_seconds)
        return {"speedup": tps / base, "tokens_per_s": tps, "baseline_tokens_per_s": base}
