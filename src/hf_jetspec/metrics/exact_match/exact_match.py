"""Token-exact match of generated sequences against reference generations (e.g. plain greedy)."""

import datasets
import evaluate

_DESCRIPTION = """
Fraction of generations whose token ids equal the reference generation's token for token (same
length, same ids). Lossless speculative decoding under greedy decoding must score 1.0 against the
target's own greedy output.
"""

_KWARGS = """
Args:
    predictions (list[list[int]]): generated token ids.
    references (list[list[int]]): reference token ids.
Returns:
    exact_match (float), mismatches (list[int]): indices of differing generations.
Example:
    >>> m = evaluate.load("hf_jetspec/metrics/exact_match")
    >>> m.compute(predictions=[[1, 2], [3]], references=[[1, 2], [4]])["exact_match"]
    0.5
"""


class TokenExactMatch(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("int64")), "references": datasets.Sequence(datasets.Value("int64"))}
            ),
        )

    def _compute(self, predictions, references):
        mismatches = [i for i, (p, r) in enumerate(zip(predictions, references)) if list(p) != list(r)]
        return {"exact_match": 1.0 - len(mismatches) / len(predictions) if predictions else None, "mismatches": mismatches}
