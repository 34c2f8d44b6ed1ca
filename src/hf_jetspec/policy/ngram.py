"""Free draft sources: n-gram matches in the sequence so far and in earlier outputs of the process.

:class:`NgramIndex` finds the longest suffix of the current sequence (up to ``max_ngram`` tokens)
that occurred earlier in it, most recent occurrence first, and proposes what followed, as
transformers' prompt lookup does over the prompt and the output so far. It is updated
incrementally, so a round costs a few dictionary look-ups.

:class:`OutputMemory` keeps the same kind of index over earlier sequences (prompt and output) of
this process, so repeated tasks reuse what was generated before, and the running acceptance rates
of n-gram proposals by source, match length and position, from which the round policy estimates
their worth (and, for tree rounds, the observed acceptance of node scores: ``node_calibration``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .round_policy import DraftGate
from .score_calibration import ScoreCalibration


@dataclass(frozen=True)
class NgramProposal:
    """Tokens proposed after the current sequence, where they came from and the matched length."""

    tokens: list[int]
    source: str  # "sequence" or "memory"
    match_length: int


def periodic_continuation(seq: list[int], pos: int, max_tokens: int) -> list[int]:
    """What follows ``seq[:pos]``'s match, up to ``max_tokens``: ``seq[pos:]`` and then, where that runs
    out, the copy continued with its own tokens (an overlapping copy, period ``len(seq) - pos``). The
    suffix that matched before ``pos`` recurs every ``len(seq) - pos`` tokens, so a loop proposes
    whole further laps rather than stopping at the end of the sequence."""
    out = seq[pos : pos + max_tokens]
    period = len(seq) - pos
    while len(out) < max_tokens and period > 0:
        out.append(out[len(out) - period])
    return out


class NgramIndex:
    """Incremental index of one token sequence: n-gram -> positions right after its latest
    ``keep`` occurrences (the latest last; chain rounds read the latest only, tree rounds several)."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, keep: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.keep = keep
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], list[int]] = {}

    def extend(self, new_tokens: list[int]) -> None:
        """Append tokens; every n-gram that now has a following token is indexed."""
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in new_tokens)
        seq = self.tokens
        # n-grams ending at j (j = start-1 .. len-2) are followed by seq[j + 1]
        for j in range(max(start - 1, 0), len(seq) - 1):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if j - n + 1 < 0:
                    break
                positions = self._next.setdefault(tuple(seq[j - n + 1 : j + 1]), [])
                positions.append(j + 1)
                if len(positions) > self.keep:
                    del positions[0]

    def lookup(self, max_tokens: int, min_ngram: int | None = None) -> tuple[list[int], int]:
        """``(continuation, matched n)`` of the longest indexed suffix, or ``([], 0)``. A match close to
        the end runs on as a copy of itself (:func:`periodic_continuation`)."""
        seq = self.tokens
        lo = self.min_ngram if min_ngram is None else max(min_ngram, self.min_ngram)
        for n in range(min(self.max_ngram, len(seq)), lo - 1, -1):
            positions = self._next.get(tuple(seq[len(seq) - n :]))
            if positions:
                return periodic_continuation(seq, positions[-1], max_tokens), n
        return [], 0

    def continuations(self, max_tokens: int, limit: int) -> list[tuple[list[int], int]]:
        """Up to ``limit`` distinct ``(continuation, matched n)``: the longest matched suffix first and,
        within one length, the latest occurrence first, so the first is :meth:`lookup`'s. A
        continuation that merely extends an earlier one's prefix adds nothing and is skipped."""
        seq = self.tokens
        out: list[tuple[list[int], int]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(min(self.max_ngram, len(seq)), self.min_ngram - 1, -1):
            for pos in reversed(self._next.get(tuple(seq[len(seq) - n :]), ())):
                cont = periodic_continuation(seq, pos, max_tokens)
                key = tuple(cont)
                if not cont or key in seen or any(o[: len(cont)] == cont for o, _ in out):
                    continue
                seen.add(key)
                out.append((cont, n))
                if len(out) >= limit:
                    return out
        return out

    def suffix(self, n: int) -> tuple[int, ...]:
        return tuple(self.tokens[max(len(self.tokens) - n, 0) :])


class OutputMemory:
    """Earlier sequences of this process and what this process's rounds have observed: the running
    acceptance of n-gram proposals and of drafted paths, and the draft gates.

    ``memory_ngram`` is the n-gram length that keys earlier sequences (longer than within a
    sequence, since a match across tasks must be specific to be worth verifying).
    """

    POSITION_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)

    def __init__(self, memory_ngram: int = 3, max_sequences: int = 256, prior: tuple[float, float] = (1.0, 1.0)):
        self.memory_ngram = memory_ngram
        self.max_sequences = max_sequences
        self.prior = prior
        self._sequences: dict[int, list[int]] = {}  # id -> tokens, ids counting up; the oldest is forgotten first
        self._next_id = 0
        self._next: dict[tuple[int, ...], tuple[int, int]] = {}  # n-gram -> (id, position after it), newest sequence wins
        self._counts: dict[tuple[str, int, int], list[float]] = {}
        self.node_calibration = ScoreCalibration()  # observed acceptance of drafted paths: tree nodes and chain blocks
        self._gates: dict[str, DraftGate] = {}  # the draft gate of each round kind, carried from call to call

    @property
    def sequences(self) -> list[list[int]]:
        """The remembered sequences, oldest first."""
        return list(self._sequences.values())

    def clear(self) -> None:
        self._sequences.clear()
        self._next.clear()
        self._counts.clear()
        self.node_calibration.clear()
        self._gates.clear()

    def drafter_changed(self, keep: float = 0.5) -> None:
        """The drafter's weights changed (online learning): its drafted paths' calibration keeps
        ``keep`` of its counts and the draft gates judge the drafter afresh at the next round."""
        self.node_calibration.forget("drafter", keep)
        for gate in self._gates.values():
            gate.reset()

    def draft_gate(self, kind: str) -> DraftGate:
        """The :class:`DraftGate` of ``kind`` rounds (``"chain"``, ``"tree"``), kept across calls: a
        drafter found not to pay stays behind its probes in the next call rather than being tried
        afresh at every prompt."""
        return self._gates.setdefault(kind, DraftGate())

    # ------------------------------------------------------------------ earlier outputs
    def _ngrams(self, seq: list[int]):
        n = self.memory_ngram
        for j in range(n - 1, len(seq) - 1):
            yield tuple(seq[j - n + 1 : j + 1]), j + 1

    def add_sequence(self, tokens: list[int]) -> None:
        """Remember ``tokens``; past ``max_sequences`` the oldest sequence is forgotten.

        An n-gram keys the newest sequence that holds it, so forgetting the oldest drops exactly the
        n-grams that point at it (a newer sequence holding one would already own it): the index is
        the one a rebuild from the kept sequences would give, at the cost of one sequence."""
        if len(self._sequences) >= self.max_sequences:
            oldest = next(iter(self._sequences))
            for key, _ in self._ngrams(self._sequences.pop(oldest)):
                if self._next.get(key, (None,))[0] == oldest:
                    del self._next[key]
        sid, self._next_id = self._next_id, self._next_id + 1
        seq = [int(t) for t in tokens]
        self._sequences[sid] = seq
        for key, pos in self._ngrams(seq):
            self._next[key] = (sid, pos)

    def lookup(self, suffix: tuple[int, ...], max_tokens: int) -> list[int]:
        if len(suffix) < self.memory_ngram:
            return []
        hit = self._next.get(tuple(suffix[-self.memory_ngram :]))
        if hit is None:
            return []
        sid, pos = hit
        return self._sequences[sid][pos : pos + max_tokens]

    # ------------------------------------------------------------------ acceptance of n-gram proposals
    @classmethod
    def bucket(cls, position: int) -> int:
        for b in cls.POSITION_BUCKETS:
            if position <= b:
                return b
        return cls.POSITION_BUCKETS[-1]

    def _key(self, source: str, match_length: int, position: int) -> tuple[str, int, int]:
        return (source, min(match_length, 4), self.bucket(position))

    def accept_probs(self, proposal: NgramProposal) -> list[float]:
        """Running conditional acceptance rate of each proposed position: the first position's counts
        smoothed by the Beta ``prior``, each later position's smoothed towards the estimate of the
        position before it (with the prior's weight). A position that rounds have not yet reached
        (verification stops at the chosen length) is thus judged by the positions before it rather
        than by a flat prior: in a copy regime the deeper positions accept as often as the earlier
        ones, and a flat 0.5 would keep the policy from ever verifying far enough to find out."""
        a0, b0 = self.prior
        out: list[float] = []
        for i in range(1, len(proposal.tokens) + 1):
            acc, rej = self._counts.get(self._key(proposal.source, proposal.match_length, i), (0.0, 0.0))
            if out:
                out.append((acc + (a0 + b0) * out[-1]) / (acc + rej + a0 + b0))
            else:
                out.append((acc + a0) / (acc + rej + a0 + b0))
        return out

    def observe(self, proposal: NgramProposal, verified: int, accepted: int) -> None:
        """A round verified the first ``verified`` proposed tokens and accepted ``accepted`` of them."""
        for i in range(1, min(verified, accepted + 1) + 1):
            counts = self._counts.setdefault(self._key(proposal.source, proposal.match_length, i), [0.0, 0.0])
            counts[0 if i <= accepted else 1] += 1.0


def propose_ngram(index: NgramIndex, memory: OutputMemory | None, max_tokens: int) -> NgramProposal | None:
    """The n-gram proposal of a round: the current sequence's longest match, else earlier outputs."""
    tokens, n = index.lookup(max_tokens)
    if tokens:
        return NgramProposal(tokens, "sequence", n)
    if memory is not None:
        tokens = memory.lookup(index.suffix(memory.memory_ngram), max_tokens)
        if tokens:
            return NgramProposal(tokens, "memory", memory.memory_ngram)
    return None
