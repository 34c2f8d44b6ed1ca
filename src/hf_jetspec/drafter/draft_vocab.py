"""Choosing a drafter's draft vocabulary: the target ids its restricted head scores.

A drafter with a restricted head can never propose a token outside its draft vocabulary, so the
share of the target's own output tokens that lie inside it caps every accepted run. These small
functions measure that share and widen a vocabulary with the tokens a target actually writes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence


def widened_vocab(current: Sequence[int], ranked: Iterable[int], size: int) -> list[int]:
    """``current`` plus the first ids of ``ranked`` it lacks, until ``size`` ids; sorted.

    Every id of ``current`` stays, so a trained drafter keeps every token it could draft before.
    Fewer than ``size`` ids come back when ``ranked`` runs out.
    """
    kept = set(int(t) for t in current)
    if size < len(kept):
        raise ValueError(f"cannot widen a draft vocabulary of {len(kept)} ids to {size}")
    for t in ranked:
        if len(kept) >= size:
            break
        kept.add(int(t))
    return sorted(kept)


def ranked_by_count(counts: Counter) -> list[int]:
    """The counted ids, most frequent first and equal counts by id (a deterministic ranking)."""
    return [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def vocab_coverage(vocab: Iterable[int], counts: Counter) -> float:
    """The share of the counted tokens (e.g. a target's answer tokens) that ``vocab`` can draft."""
    total = sum(counts.values())
    if total == 0:
        raise ValueError("no counted tokens")
    ids = set(int(t) for t in vocab)
    return sum(n for t, n in counts.items() if t in ids) / total


def widen_by_counts(drafter, size: int, counts: Counter | None, fallback: Callable[[], Iterable[int]]) -> str:
    """Widen ``drafter``'s draft vocabulary to ``size`` ids with the counted tokens, most frequent first,
    then with ``fallback()``'s ranking (called only if the counts run out). Returns a one-line report,
    with the counted tokens' coverage before and after when there are counts."""
    before = drafter.draft_vocab.tolist()
    def then():  # fallback() runs only if the counted tokens did not fill the vocabulary
        yield from fallback()

    drafter.widen_draft_vocab(itertools.chain(ranked_by_count(counts) if counts else [], then()), size)
    covered = (f", covering {vocab_coverage(before, counts):.1%} -> {vocab_coverage(drafter.draft_vocab.tolist(), counts):.1%} "
               "of the counted answer tokens") if counts else ""
    return f"draft vocabulary widened from {len(before)} to {drafter.config.draft_vocab_size} ids{covered}"
