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


def test_widen_by_counts_reads_the_fallback_only_when_the_counts_run_out():
    from types import SimpleNamespace

    import torch

    from hf_jetspec.drafter.draft_vocab import widen_by_counts

    class Stub:  # the two members widen_by_counts uses, with JetSpecDrafter's meaning
        def __init__(self, ids):
            self.draft_vocab = torch.tensor(ids)
            self.config = SimpleNamespace(draft_vocab_size=len(ids))

        def widen_draft_vocab(self, ranked, size):
            self.draft_vocab = torch.tensor(widened_vocab(self.draft_vocab.tolist(), ranked, size))
            self.config.draft_vocab_size = len(self.draft_vocab)

    calls = []
    fallback = lambda: calls.append(1) or [50, 51]  # noqa: E731
    stub = Stub([1])
    report = widen_by_counts(stub, 3, Counter({2: 5, 3: 3, 1: 2}), fallback)
    assert stub.draft_vocab.tolist() == [1, 2, 3] and not calls  # the counts filled it
    assert report == "draft vocabulary widened from 1 to 3 ids, covering 20.0% -> 100.0% of the counted answer tokens"
    widen_by_counts(stub, 5, Counter({2: 1}), fallback)
    assert stub.draft_vocab.tolist() == [1, 2, 3, 50, 51] and calls == [1]
    assert widen_by_counts(Stub([4]), 2, None, lambda: [9]) == "draft vocabulary widened from 1 to 2 ids"
