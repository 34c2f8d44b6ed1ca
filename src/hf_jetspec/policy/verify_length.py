"""Verify-length selection: how many draft tokens a round should verify (a pure function).

A round that verifies ``L`` draft tokens commits ``1 + A`` tokens, where ``A`` is the number of
draft tokens accepted (the bonus token is always committed). With ``p_i`` the probability that draft
token ``i`` is accepted given that tokens ``1 .. i-1`` were, the expectation is

    E(L) = 1 + sum_{i=1..L} prod_{j<=i} p_j                    (E(0) = 1: a plain target step)

and the round costs ``c(L) = v(L + 1) + d`` (a verification forward of ``L + 1`` tokens, plus the
drafting cost ``d`` when ``L > 0`` and the draft is not yet paid for). The policy verifies the
``L`` that maximises committed tokens per second, ``E(L) / c(L)``. ``L = 0`` is always an option, so
when no draft is worth its cost the round is plain decoding.

A tree of ``n`` nodes is priced the same way (:func:`choose_tree_size`): a forward of ``n + 1``
tokens, and ``E(n) = 1 + sum_i P(node i's path is accepted)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def expected_committed(accept_probs: Sequence[float]) -> list[float]:
    """``[E(0), E(1), ..., E(n)]`` for conditional acceptance probabilities ``p_1 .. p_n``."""
    out = [1.0]
    prefix = 1.0
    for p in accept_probs:
        prefix *= min(max(float(p), 0.0), 1.0)
        out.append(out[-1] + prefix)
    return out


@dataclass(frozen=True)
class VerifyChoice:
    """The chosen verify length, its expected committed tokens, its cost (s) and their ratio."""

    length: int
    expected_tokens: float
    cost_s: float

    @property
    def rate(self) -> float:
        return self.expected_tokens / self.cost_s


def choose_verify_length(accept_probs: Sequence[float], verify_costs: Sequence[float], draft_cost: float = 0.0,
                         min_length: int = 0) -> VerifyChoice:
    """The ``L`` in ``min_length .. min(len(accept_probs), len(verify_costs) - 1)`` maximising ``E(L) / c(L)``.

    ``verify_costs[L]`` is the time of a verification forward of ``L + 1`` tokens (so
    ``verify_costs[0]`` is a plain step); ``draft_cost`` is added to every ``L > 0``. Ties go to
    the shorter ``L``. ``min_length=1`` prices the drafted options alone (what a draft gate weighs).
    """
    return best_rate(expected_committed(accept_probs), verify_costs, draft_cost, min_length)


def expected_committed_tree(path_probs: Sequence[float]) -> list[float]:
    """``[E(0), ..., E(n)]`` for a tree verified up to its first ``n`` nodes, where ``path_probs[i]``
    is the probability that node ``i``'s whole path is accepted: each accepted node commits a token,
    so ``E(n) = 1 + sum_{i<n} path_probs[i]`` (the bonus token is always committed)."""
    out = [1.0]
    for p in path_probs:
        out.append(out[-1] + min(max(float(p), 0.0), 1.0))
    return out


def choose_tree_size(path_probs: Sequence[float], verify_costs: Sequence[float], draft_cost: float = 0.0,
                     min_length: int = 0) -> VerifyChoice:
    """The node count ``n >= min_length`` (a prefix of a best-first tree) with the most expected
    committed tokens per second; ``verify_costs[n]`` prices a forward of ``n + 1`` tokens, as for chains."""
    return best_rate(expected_committed_tree(path_probs), verify_costs, draft_cost, min_length)


def best_rate(expected: Sequence[float], verify_costs: Sequence[float], draft_cost: float = 0.0, min_length: int = 0) -> VerifyChoice:
    """The ``L >= min_length`` maximising ``expected[L] / (verify_costs[L] + draft_cost [L > 0])``;
    ties to the shorter. Where no ``L >= min_length`` exists, ``L = 0``."""
    if not verify_costs:
        raise ValueError("verify_costs needs at least the cost of a plain step (L = 0)")
    best = VerifyChoice(0, 1.0, float(verify_costs[0]))
    top = min(len(expected), len(verify_costs))
    if 0 < min_length < top:
        best = VerifyChoice(min_length, expected[min_length], float(verify_costs[min_length]) + draft_cost)
    for length in range(max(1, min_length), top):
        choice = VerifyChoice(length, expected[length], float(verify_costs[length]) + draft_cost)
        if choice.rate > best.rate * (1 + 1e-9):
            best = choice
    return best


def choose_batch_width(expected: Sequence[Sequence[float]], verify_costs: Sequence[float]) -> VerifyChoice:
    """A batch round's common cap ``L``: every row verifies ``min(L, n_b)`` of its proposal, in one
    forward of ``L + 1`` tokens a row, priced ``verify_costs[L]`` for the whole batch. ``expected[b]``
    is row ``b``'s ``[E(0), .., E(n_b)]`` (:func:`expected_committed`). Returns the ``L`` with the most
    expected committed tokens across the rows per second (``expected_tokens`` summed over rows);
    ties to the shorter, ``L = 0`` a plain step for every row.

    >>> choose_batch_width([[1, 1.9, 2.7], [1, 1.2]], [1.0, 1.1, 1.3]).length
    2
    >>> choose_batch_width([[1, 1.9, 2.7], [1, 1.2]], [1.0, 1.1, 2.0]).length
    1
    """
    if not expected:
        return best_rate([1.0], verify_costs)
    top = max(len(e) - 1 for e in expected)
    # per row on average (a plain step commits 1 a row, as best_rate prices L = 0): the same argmax as the sum
    means = [sum(e[min(L, len(e) - 1)] for e in expected) / len(expected) for L in range(min(top, len(verify_costs) - 1) + 1)]
    return best_rate(means, verify_costs)
