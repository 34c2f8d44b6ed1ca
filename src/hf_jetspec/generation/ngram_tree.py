"""Tree rounds with no drafter: a trie of the distinct n-gram continuations, priced by the cost model.

A sequence often holds its current suffix more than once, followed by different text (a variable
name used in two statements, a number in two sentences). Chain rounds verify the latest match's
continuation only; a tree round verifies several in one forward, each branching off where it first
differs from the ones before it, and commits the longest path the target agrees with.

The plan of a round (:class:`NgramTreePolicy`):

- candidates: :meth:`~hf_jetspec.policy.NgramIndex.continuations` (longest suffix first, latest
  occurrence first; the first is the chain rounds' proposal), else the output memory's match;
- scores: the first candidate's tokens take the running per-position acceptance rates of chain
  rounds (:meth:`~hf_jetspec.policy.OutputMemory.accept_probs`); a later candidate's first own token
  takes ``(1 - c_j) / (r + 1)`` (the earlier candidates missed position ``j``, and it is the ``r``-th of
  the ones left, :func:`branch_conditionals`), and its further tokens ``c_j`` again. Those raw scores
  rank the nodes (:func:`~hf_jetspec.generation.tree.ranked_tree` grafts every candidate as a chain);
  the expected acceptance of a node only later candidates hold comes from the running calibration of
  those scores against verified outcomes (source ``"ngram-branch"`` of the output memory's
  ``node_calibration``);
- size: the prefix of the ranked tree with the most expected committed tokens per second
  (:func:`~hf_jetspec.policy.choose_tree_size`); zero nodes is a plain step.

:func:`ngram_tree_decoding` is the verification loop: one target forward over ``[anchor] + nodes``
under the tree mask, the walk on the target's own choices (greedy argmax, or the point-mass rule
when sampling: the committed token is always the target's own draw), and the accepted path's cache
rows kept. It needs a dynamic full-attention cache; targets with sliding-window layers run chain
rounds (:func:`~hf_jetspec.generation.tree_decoding.tree_cache_reason`).
"""

from __future__ import annotations

import time

import torch

from ..assistant.lm_source import common_prefix_length
from ..policy import CostModel, NgramIndex, NgramProposal, OutputMemory, choose_tree_size, choose_verify_length, propose_ngram
from .stats import GenerationStats
from .tree import DraftTree, accept_greedy, accept_sampled, chain_tree, ranked_tree, truncate_tree

BRANCH_SOURCE = "ngram-branch"


def branch_conditionals(primary: list[float], divergence: int, rank: int, length: int) -> list[float]:
    """Raw conditional acceptance of each token of the ``rank``-th candidate (``rank >= 1``) of a
    round, which shares its first ``divergence`` tokens with earlier candidates: the shared ones as
    the first candidate's (they are the same nodes), the first own one ``(1 - c) / (rank + 1)`` with
    ``c`` the first candidate's rate there, the later ones the first candidate's again.
    ``primary[j]``: the first candidate's conditional rate at position ``j + 1``; positions past its
    end take its last rate."""
    def rate(j):
        return primary[min(j, len(primary) - 1)] if primary else 0.5

    out = []
    for j in range(length):
        if j == divergence:
            out.append((1.0 - rate(j)) / (rank + 1))
        else:
            out.append(rate(j))
    return out


def divergence_depth(candidate: list[int], earlier: list[list[int]]) -> int:
    """How many leading tokens ``candidate`` shares with the trie of ``earlier`` candidates."""
    return max((common_prefix_length(candidate, e) for e in earlier), default=0)


class NgramTreePolicy:
    """Plans and learns from drafter-free tree rounds (see the module docstring). ``memory``: the
    assistant's :class:`~hf_jetspec.policy.OutputMemory` (running rates, calibration, earlier outputs);
    ``use_memory``: also propose matches in earlier outputs."""

    def __init__(self, memory: OutputMemory, cost: CostModel, budget: int, max_ngram: int = 4, candidates: int = 4,
                 use_memory: bool = True):
        self.memory, self.cost, self.budget, self.candidates = memory, cost, budget, candidates
        self.use_memory = use_memory
        self.index = NgramIndex(max_ngram=max_ngram, keep=candidates)
        self._proposal: NgramProposal | None = None
        self.primary_nodes: list[int] = []
        self._branch: list[tuple[float, int]] = []  # (raw score, node) of verified nodes only later candidates hold

    def plan(self, tokens: list[int], max_depth: int) -> tuple[DraftTree, str]:
        """This round's tree after ``tokens`` (the whole sequence so far) and its source: ``"plain"``,
        ``"ngram"`` (one candidate) or ``"ngram-tree"``."""
        self.index.extend(tokens[len(self.index.tokens) :])
        self.primary_nodes, self._branch = [], []
        costs = self.cost.verify_costs(self.budget - 1)
        self._proposal = propose_ngram(self.index, self.memory if self.use_memory else None, max_depth) if max_depth > 0 else None
        if self._proposal is None:
            return chain_tree([]), "plain"
        cands = [self._proposal.tokens]
        if self._proposal.source == "sequence":  # the first continuation is the proposal itself
            cands = [c for c, _ in self.index.continuations(max_depth, self.candidates)]
        primary = self.memory.accept_probs(self._proposal)
        if len(cands) == 1:
            choice = choose_verify_length(primary, costs)
            self.primary_nodes = list(range(choice.length))
            return chain_tree(self._proposal.tokens[: choice.length]), "plain" if choice.length == 0 else "ngram"
        chains = [(cands[0], primary)]
        for r in range(1, len(cands)):
            chains.append((cands[r], branch_conditionals(primary, divergence_depth(cands[r], cands[:r]), r, len(cands[r]))))
        depth = max(len(c) for c in cands)
        ranked = ranked_tree(torch.zeros(depth, 0, dtype=torch.long), torch.zeros(depth, 0), self.budget - 1, None, chains)
        primary_set = set(ranked.chain_nodes[0])
        raw = ranked.scores
        calibrated = self.memory.node_calibration(BRANCH_SOURCE, raw)
        expected = [s if i in primary_set else c for i, (s, c) in enumerate(zip(raw, calibrated))]
        n = choose_tree_size(expected, costs).length
        self.primary_nodes = [i for i in ranked.chain_nodes[0] if i < n]
        self._branch = [(raw[i], i) for i in range(n) if i not in primary_set]
        if n == 0:
            return chain_tree([]), "plain"
        return truncate_tree(ranked.tree, n), "ngram-tree" if self._branch else "ngram"

    def observe(self, nodes: int, accepted: list[int], seconds: float) -> None:
        """The round verified ``nodes`` nodes in ``seconds`` and accepted the path ``accepted``."""
        self.cost.observe_verify(nodes + 1, seconds)
        on_path = set(accepted)
        if self._branch:
            self.memory.node_calibration.observe(BRANCH_SOURCE, [s for s, _ in self._branch], [i in on_path for _, i in self._branch])
        if self._proposal is not None and self.primary_nodes:
            hits = len(on_path & set(self.primary_nodes))
            self.memory.observe(self._proposal, verified=len(self.primary_nodes), accepted=hits)


@torch.no_grad()
def ngram_tree_decoding(target, input_ids, logits_processor, stopping_criteria, generation_config, streamer, assistant, model_kwargs):
    """Generate with drafter-free tree rounds (see the module docstring); returns the sequences (or a
    ``GenerateDecoderOnlyOutput`` with them). ``assistant``: a :class:`~hf_jetspec.assistant.DrafterFreeAssistant`."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    from .sampled_drafting import row_pure
    from .tree_decoding import (ProcessedRows, _check_supported, _choose, _commit, _forward, _row_prefix, keep_cache_rows,
                                static_tree_forward, tree_forward)

    cache = model_kwargs.get("cache")
    options = assistant.drafting_config
    _check_supported(target, cache, generation_config, input_ids, model_kwargs, options.compiled_rounds)
    do_sample = bool(generation_config.do_sample)
    lazy_rows = do_sample and row_pure(logits_processor)
    boolean_mask = getattr(target.config, "_attn_implementation", "sdpa") != "eager"
    from .. import policy as policy_module  # one cost profile per target, device and dtype, kept by the policy package

    runner = None  # compiled rounds: the target's forwards on its static cache
    if options.compiled_rounds:
        from .static_rounds import static_target_for

        runner = static_target_for(target, generation_config.max_length, options.budget, [], options.compile_backend,
                                   options.compile_buckets)
        cache = runner.cache
    sizes, seconds = policy_module.cost_profile_for(target, options.budget) if runner is None else runner.profile(options.budget)
    planner = NgramTreePolicy(assistant.output_memory, CostModel(sizes, seconds), options.budget, options.max_ngram,
                              options.tree_candidates, options.output_memory)
    stats = GenerationStats()
    device = input_ids.device

    t0 = time.perf_counter()
    n = input_ids.shape[1]
    if runner is None:
        out = _forward(target, input_ids, torch.arange(n, device=device)[None], None, cache, None)
    else:
        out = runner.prefill(input_ids)
    tokens, probs = _choose(out.logits[0, -1:].float(), [input_ids[0]], logits_processor, do_sample)
    first = int(tokens[0]) if probs is None else int(torch.multinomial(probs[0], 1))
    stats.prefill_time_s += time.perf_counter() - t0
    input_ids, done = _commit(input_ids, [first], stopping_criteria, streamer)
    while not done:
        cur = input_ids.shape[1]
        t0 = time.perf_counter()
        max_depth = min(options.budget - 1, generation_config.max_length - cur)
        tree, source = planner.plan(input_ids[0].tolist(), max_depth)
        stats.round_sources.append(source)
        stats.chosen_lengths.append(len(tree))
        t1 = time.perf_counter()
        stats.draft_time_s += t1 - t0
        if runner is None:
            out = tree_forward(target, input_ids, tree, cache, None, boolean_mask)
        else:
            out = static_tree_forward(runner, input_ids, tree)
        logits = out.logits[0].float()
        if lazy_rows:
            rows = ProcessedRows(logits, tree, input_ids[0], logits_processor)
            accepted, bonus = accept_sampled(tree, rows)
        else:
            prefixes = [_row_prefix(input_ids[0], tree, r) for r in range(len(tree) + 1)] if len(logits_processor) > 0 else []
            choice, probs = _choose(logits, prefixes, logits_processor, do_sample)
            accepted, bonus = accept_greedy(tree, choice.cpu()) if probs is None else accept_sampled(tree, probs)
        if runner is None:
            keep_cache_rows(cache, cur - 1, [0] + [1 + i for i in accepted])
        else:
            runner.keep_rows(cur - 1, [0] + [1 + i for i in accepted])
        elapsed = time.perf_counter() - t1
        stats.verify_time_s += elapsed
        planner.observe(len(tree), accepted, elapsed)
        input_ids, done = _commit(input_ids, [int(tree.tokens[i]) for i in accepted] + [bonus], stopping_criteria, streamer)
        stats.record_round(accepted=len(accepted), committed=input_ids.shape[1] - cur, drafted=len(tree))
        stats.record_tree_round(nodes=len(tree), depth=len(accepted), off_chain=any(i not in planner.primary_nodes for i in accepted))
    if options.output_memory:
        assistant.output_memory.add_sequence(input_ids[0].tolist())
    stats.cost_model = planner.cost.summary(options.budget - 1) | {"node_calibration": assistant.output_memory.node_calibration.table()}
    assistant.generation_stats = stats
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=input_ids, past_key_values=cache)
    return input_ids
