"""Acceptance length (tau): mean tokens committed per verification round, bonus included."""

import datasets
import evaluate

from hf_jetspec.generation.stats import accept_length_histogram

_DESCRIPTION = """
Mean number of tokens committed per verification round of speculative decoding (tau), bonus
token included. Inputs are, per generation, the number of committed tokens and the number of
verification rounds; tau pools them: sum(committed) / sum(rounds). Also returns the histogram of
accepted draft tokens per round when `accepted_lengths` are given.
"""

_KWARGS = """
Args:
    committed_tokens (list[int]): tokens committed by each generation.
    rounds (list[int]): verification rounds of each generation.
    accepted_lengths (list[list[int]], optional): accepted draft tokens of every round.
Returns:
    tau (float | None), rounds (int), committed_tokens (int), accept_length_hist (list[int]).
Example:
    >>> m = evaluate.load("hf_jetspec/metrics/acceptance_length")
    >>> m.compute(committed_tokens=[10, 5], rounds=[4, 1])["tau"]
    3.0
"""


class AcceptanceLength(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features({"committed_tokens": datasets.Value("int64"), "rounds": datasets.Value("int64")}),
        )

    def _compute(self, committed_tokens, rounds, accepted_lengths=None):
        total_rounds = int(sum(rounds))
        total = int(sum(committed_tokens))
        hist = accept_length_histogram([k for per_gen in accepted_lengths or [] for k in per_gen])
        return {
            "tau": total / total_rounds if total_rounds else None,
            "rounds": total_rounds,
            "committed_tokens": total,
            "accept_length_hist": hist,
        }
