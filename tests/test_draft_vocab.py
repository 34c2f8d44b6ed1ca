"""Draft-vocabulary helpers on hand-checkable numbers."""

from collections import Counter

import pytest

from hf_jetspec.drafter.draft_vocab import ranked_by_count, vocab_coverage, widened_vocab


def test_widened_vocab_keeps_every_id_and_adds_in_rank_order():
    assert widened_vocab([9, 4], [4, 7, 1, 8], 4) == [1, 4, 7, 9]  # 4 is held: 7 and 1 join, 8 does not fit
    assert widened_vocab([9, 4], [7], 5) == [4, 7, 9]  # the ranking ran out
    assert widened_vocab([2], [], 1) == [2]
    with pytest.raises(ValueError, match="cannot widen"):
        widened_vocab([1, 2, 3], [4], 2)


def test_vocab_coverage_counts_occurrences_not_ids():
    counts = Counter({1: 6, 2: 3, 3: 1})
    assert vocab_coverage([1], counts) == pytest.approx(0.6)
    assert vocab_coverage([2, 3, 99], counts) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="no counted"):
        vocab_coverage([1], Counter())


def test_ranked_by_count_breaks_ties_by_id():
    assert ranked_by_count(Counter({7: 2, 3: 5, 9: 2, 1: 1})) == [3, 7, 9, 1]
    assert ranked_by_count(Counter()) == []
