"""Per-generation statistics of speculative decoding."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


def accept_length_histogram(accepted: list[int], max_len: int | None = None) -> list[int]:
    """Counts of rounds by number of accepted draft tokens: ``hist[k]`` rounds accepted exactly k."""
    top = max(accepted, default=-1) if max_len is None else max_len
    hist = [0] * (top + 1)
    for k in accepted:
        hist[k] += 1
    return hist


@dataclass
class GenerationStats:
    """What one ``generate`` call did, kept on the drafter as ``drafter.generation_stats``.

    ``rounds`` counts verification rounds after the prefill (the prefill forward of the target
    commits the first token without any draft and is not a round). ``accepted_lengths[r]`` is the
    number of draft tokens accepted in round r; every round also commits one token drawn by the
    target (the bonus), unless the generation stopped inside the block.
    """

    rounds: int = 0
    committed_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    drafted_tokens: int = 0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_time_s: float = 0.0
    cache_lookups: int = 0
    cache_hits: int = 0
    outcomes: list[tuple[int, int]] = field(default_factory=list)
    background_time_s: float = 0.0
    worker_failures: int = 0
    refreshes: int = 0
    anchor_replacements: int = 0
    foresight_records: list = field(default_factory=list)
    chosen_lengths: list[int] = field(default_factory=list)
    round_sources: list[str] = field(default_factory=list)
    drafter_runs: int = 0
    seeded_drafter_runs: int = 0
    acceptance_records: list = field(default_factory=list)
    cost_model: dict = field(default_factory=dict)
    tree_nodes: list[int] = field(default_factory=list)  # tree rounds: nodes verified per round
    tree_paths: list[tuple[int, bool]] = field(default_factory=list)  # (accepted depth, left the top-1 chain)
    drafted_lengths: list[int] = field(default_factory=list)  # per round: draft tokens (tree nodes) verified
    sampled_drafts: int = 0  # drafter blocks drawn from q under sampling (verified with min(1, p/q))
    grafted_nodes: int = 0  # tree rounds with the policy: n-gram nodes verified inside drafted trees
    lm_time_s: float = 0.0  # an LM source's time proposing chains (inside draft_time_s)
    lm_tokens: int = 0  # tokens the LM source proposed
    lm_nodes: int = 0  # of those, verified
    lm_accepted: int = 0  # of those, accepted

    @property
    def hit_rate(self) -> float | None:
        """Share of foresight rounds whose realised outcome (k*, a*) was pre-drafted."""
        return self.cache_hits / self.cache_lookups if self.cache_lookups else None

    @property
    def exposed_draft_time_per_round_s(self) -> float | None:
        """Drafting time on the critical path per round (waiting for the worker included)."""
        return self.draft_time_s / self.rounds if self.rounds else None

    @property
    def tau(self) -> float | None:
        """Mean tokens committed per verification round (bonus included)."""
        return self.committed_tokens / self.rounds if self.rounds else None

    @property
    def accept_length_hist(self) -> list[int]:
        return accept_length_histogram(self.accepted_lengths)

    @property
    def chosen_length_hist(self) -> list[int]:
        """Rounds by the number of draft tokens the round policy chose to verify (0: a plain step)."""
        return accept_length_histogram(self.chosen_lengths)

    @property
    def source_counts(self) -> dict[str, int]:
        """Rounds by the source of what was verified: ``plain``, ``ngram`` or ``drafter``."""
        out: dict[str, int] = {}
        for s in self.round_sources:
            out[s] = out.get(s, 0) + 1
        return out

    def record_round(self, accepted: int, committed: int, drafted: int) -> None:
        self.rounds += 1
        self.accepted_lengths.append(int(accepted))
        self.committed_tokens += int(committed)
        self.drafted_tokens += int(drafted)
        self.drafted_lengths.append(int(drafted))

    def position_acceptance(self, source: str | None = None) -> list[tuple[int, int]]:
        """Per draft position ``i = 1, 2, ..``: ``(reached, accepted)`` over the rounds (of ``source``
        only, where given: ``"drafter"`` / ``"ngram"``, policy rounds) that verified position ``i``
        and accepted every position before it; ``accepted / reached`` is the conditional acceptance
        rate of position ``i``. Chain rounds only (a tree round verifies nodes, not positions)."""
        rounds = list(zip(self.drafted_lengths, self.accepted_lengths))
        if source is not None:
            if len(self.round_sources) != len(rounds):
                return position_acceptance([] if source != "drafter" else rounds)
            rounds = [r for r, s in zip(rounds, self.round_sources) if s == source]
        return position_acceptance(rounds)

    def record_tree_round(self, nodes: int, depth: int, off_chain: bool) -> None:
        """A tree round: nodes verified, and the accepted path's depth and whether it took a non-top-1 branch."""
        self.tree_nodes.append(int(nodes))
        self.tree_paths.append((int(depth), bool(off_chain)))

    def merge(self, other: "GenerationStats") -> "GenerationStats":
        """Field-wise sum (counters and times) / concatenation (per-round lists)."""
        def add(a, b):
            return b or a if isinstance(a, dict) else a + b  # the cost model: the latest snapshot

        return GenerationStats(**{f.name: add(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self)})

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["tau"] = self.tau
        out["accept_length_hist"] = self.accept_length_hist
        out["hit_rate"] = self.hit_rate
        out["exposed_draft_time_per_round_s"] = self.exposed_draft_time_per_round_s
        out["chosen_length_hist"] = self.chosen_length_hist
        out["source_counts"] = self.source_counts
        return out


def position_acceptance(rounds) -> list[tuple[int, int]]:
    """``rounds``: ``(drafted, accepted)`` pairs. Returns, for positions ``i = 1 .. max drafted``,
    ``(reached, accepted)``: rounds with ``drafted >= i`` and ``accepted >= i - 1``, and of those the
    ones with ``accepted >= i``."""
    depth = max((d for d, _ in rounds), default=0)
    out = []
    for i in range(1, depth + 1):
        reached = [a for d, a in rounds if d >= i and a >= i - 1]
        out.append((len(reached), sum(a >= i for a in reached)))
    return out
