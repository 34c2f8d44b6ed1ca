"""A wall-clock budget split between regeneration, training and evaluation, planned from measured rates.

A run bounded by hours does not know its rates in advance: how long the target takes to answer a
prompt, how long a training step takes, how long a checkpoint's evaluation takes. The pipeline
measures each on its first batch and calls :func:`plan_budget` again whenever it knows more. The
plan follows the measured scaling of drafters trained on the target's answers: at equal steps,
more answers beat more epochs over the same answers, so while there is time to regenerate,
training sees each answer at most ``max_epochs`` times (4 by default; 3,000 answers at 8 epochs
gained 0.073 tau where 6,000 answers at 4 gained 0.103) and the rest of the time goes into answers.

:class:`BudgetBar` is the one progress bar of such a run: seconds elapsed against the budget, with
the phase and its counts (answers, steps, epochs) as they are planned and done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseCosts:
    """Measured (or prior) seconds of one unit of each phase."""

    answer_s: float  # one regenerated answer (a batch's time over its answers)
    step_s: float  # one training step
    eval_s: float  # one checkpoint's evaluation (a point of the learning curve)
    tail_s: float = 0.0  # what runs after the curve and cannot shrink below this (calibration, a verdict, the card)


@dataclass(frozen=True)
class BudgetPlan:
    answers: int  # answers the corpus should hold when regeneration stops
    steps: int  # training steps
    epochs: float  # steps * batch_size / answers
    curve_points: int  # checkpoints to evaluate
    regenerate_s: float
    train_s: float
    evaluate_s: float
    tail_s: float


def plan_budget(remaining_s: float, answers_done: int, costs: PhaseCosts, batch_size: int, max_epochs: float = 4.0,
                curve_points: int = 4, min_answers: int = 1) -> BudgetPlan:
    """Split ``remaining_s`` seconds: first the tail and the curve's evaluations are reserved (fewer
    curve points when they would not leave training any time, never fewer than one), then the rest
    buys answers and steps together at ``max_epochs`` epochs, ``N`` answers in all with
    ``(N - answers_done) * answer_s + max_epochs * N / batch_size * step_s`` seconds.

    >>> p = plan_budget(3600, 0, PhaseCosts(answer_s=1.0, step_s=2.0, eval_s=60.0, tail_s=360.0), batch_size=8)
    >>> p.answers, p.steps, p.epochs, p.regenerate_s, p.train_s
    (1500, 750, 4.0, 1500.0, 1500.0)
    """
    points = max(1, curve_points)
    while points > 1 and remaining_s - costs.tail_s - points * costs.eval_s < 0.5 * remaining_s:
        points -= 1  # the curve may take at most half of what is left
    reserve = costs.tail_s + points * costs.eval_s
    middle = max(remaining_s - reserve, 0.0)
    per_answer = costs.answer_s + max_epochs * costs.step_s / batch_size
    answers = int((middle + answers_done * costs.answer_s) / per_answer) if per_answer > 0 else answers_done
    answers = max(answers, answers_done, min_answers)
    regenerate_s = max(answers - answers_done, 0) * costs.answer_s
    train_s = max(middle - regenerate_s, 0.0)
    steps = min(int(train_s / costs.step_s) if costs.step_s > 0 else 0, epoch_steps(answers, batch_size, max_epochs))
    return BudgetPlan(answers, steps, round(steps * batch_size / max(answers, 1), 2), points, regenerate_s, train_s,
                      points * costs.eval_s, costs.tail_s)


def epoch_steps(answers: int, batch_size: int, max_epochs: float) -> int:
    """The most steps ``max_epochs`` passes over ``answers`` allow (at least one).

    >>> epoch_steps(53, 8, 4.0), epoch_steps(3, 8, 4.0)
    (26, 1)
    """
    return max(1, int(max_epochs * answers / batch_size))


class BudgetBar:
    """One progress bar over a wall-clock budget: its total is the budget in seconds, its count the
    seconds elapsed since ``start`` (a ``time.perf_counter()`` value), and its text the phase with
    its counts, e.g. ``train: step 120/400, epoch 1.9/4``."""

    def __init__(self, budget_s: float, start: float | None = None, disable: bool = False):
        from tqdm.auto import tqdm

        self.budget_s = float(budget_s)
        self.start = time.perf_counter() if start is None else start
        self.total = max(1, int(round(budget_s)))
        self.bar = tqdm(total=self.total, unit="s", desc="budget", disable=disable,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s{postfix}")
        self.phase = ""

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def show(self, phase: str, counts: str = "") -> None:
        self.phase = phase
        elapsed = int(self.elapsed())
        if elapsed > self.bar.total:  # past the budget: the bar grows (tqdm cannot draw a count above its total)
            self.bar.total = elapsed
        self.bar.n = elapsed
        self.bar.set_postfix_str(f"{phase}: {counts}" if counts else phase, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.show(self.phase or "done")
        self.bar.close()


@dataclass(frozen=True)
class HeldOutCounts:
    eval_items: int
    curve_points: int
    calibration_items: int
    verdict_items: int
    seconds: float  # what they are expected to cost


def held_out_cost(item_s: float, eval_items: int, curve_points: int, calibration_items: int, verdict_items: int) -> float:
    """Seconds of a run's held-out measurements, in plain greedy generations of one item (``item_s``):
    the evaluation items' references (1 each), each curve point (1.5 per item: drafter-alone rounds),
    a calibration round (1.5 per item), the verdict (4.5 per item: plain, the drafter, the drafter-free
    assistant, with their differences in speed) and its three warm-ups (1 in all).

    >>> held_out_cost(2.0, eval_items=4, curve_points=2, calibration_items=2, verdict_items=2)
    58.0
    """
    return item_s * (eval_items * (1 + 1.5 * curve_points) + 1.5 * calibration_items + 4.5 * verdict_items + 1.0)


def held_out_counts(spare_s: float, item_s: float, eval_items: int, curve_points: int, calibration_items: int, verdict_items: int,
                    share: float = 0.4) -> HeldOutCounts:
    """The held-out measurements a budget affords: as asked when they cost at most ``share`` of
    ``spare_s``; otherwise the curve keeps its first and last points, then every count shrinks in
    proportion, none below one (a run always ends with a curve point, a calibration and a verdict).

    >>> held_out_counts(1000, 2.0, 4, 2, 2, 2)
    HeldOutCounts(eval_items=4, curve_points=2, calibration_items=2, verdict_items=2, seconds=58.0)
    >>> held_out_counts(100, 2.0, 12, 4, 12, 8).verdict_items
    1
    """
    allowed = share * spare_s
    counts = (eval_items, curve_points, calibration_items, verdict_items)
    if held_out_cost(item_s, *counts) > allowed:
        counts = (eval_items, min(curve_points, 2), calibration_items, verdict_items)
    full = held_out_cost(item_s, *counts)
    if full > allowed:
        scale = max(allowed - item_s, 0.0) / max(full - item_s, 1e-9)
        counts = (max(1, int(eval_items * scale)), counts[1], max(1, int(calibration_items * scale)), max(1, int(verdict_items * scale)))
    return HeldOutCounts(*counts, round(held_out_cost(item_s, *counts), 2))
