"""Choosing a drafter's draft vocabulary: the target ids its restricted head scores.

A drafter with a restricted head can never propose a token outside its draft vocabulary, so the
share of the target's own output tokens that lie inside it caps every accepted run. These small
functions measure that share and widen a vocabulary with the tokens a target actually writes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence


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
