"""Tree rounds: a verification loop of our own, behind the same ``generate`` seam as chain rounds.

transformers' assisted loop verifies chains only. With ``drafting_config.tree`` set, the seam runs
:func:`tree_decoding` instead: each round drafts one block (J0 and the Jacobi passes), reads a
token tree off its per-position top-k (:mod:`hf_jetspec.generation.tree`), verifies ``[anchor] + nodes`` in
one target forward under a tree attention mask, walks the tree on the target's own choices
(greedy argmax, or the point-mass rule when sampling), keeps in the target's cache only the rows
of the accepted path, and feeds the drafter the hidden states of that path alone. With
``drafting_config.policy`` (the default) and ``tree="auto"``, a :class:`TreeRoundPolicy` decides each round whether to
draft, grafts the n-gram continuation into the tree and picks the node count from the cost model.

What ``generate`` promises still holds: logits processors see each node's own prefix, stopping
criteria (EOS and ``max_new_tokens`` included) are checked after every committed token, and a
streamer receives each round's committed tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..assistant import assistant_for
from ..drafter.drafter_cache import gather_pending, trim_pending
from ..drafter.drafting_config import check_context_window
from ..drafter.jacobi import initial_block_inputs, jacobi_refine, sample_noise_tokens
from ..assistant.lm_source import LM_SOURCE, check_lm_source, propose_priced
from .cache_rows import keep_cache_rows
from .sampled_drafting import Proposal, make_proposal, row_pure
from .stats import GenerationStats
from ..policy import (
    CostModel,
    NgramIndex,
    choose_tree_size,
    choose_verify_length,
    cost_profile_for,
    node_features,
    propose_ngram,
)
from .tree import (
    DraftTree,
    accept_greedy,
    accept_multidraft,
    accept_sampled,
    best_first_tree,
    chain_tree,
    ranked_tree,
    sample_tree,
    sibling_tree,
    tree_attention_mask,
    tree_positions,
    truncate_tree,
)


@dataclass
class TopkDraft:
    """What one drafted block offers a tree: per position the final pass's top-``k`` target ids and
    probabilities ([gamma, k] each, CPU), its argmax draft, whether each position kept the token it
    held in that pass's inputs (``agreed`` [gamma], CPU) and the drafter passes run."""

    ids: torch.Tensor
    probs: torch.Tensor
    draft: torch.Tensor
    agreed: torch.Tensor
    passes: int
    logits: torch.Tensor | None = None  # the final pass's draft-vocabulary logits [gamma, V_draft]


def draft_topk(drafter, cache, anchor: torch.Tensor, context: torch.Tensor, gamma: int, start: int, passes: int, k: int, generator,
               seed=()) -> TopkDraft:
    """One block (J0, its inputs seeded with ``seed`` where given and noise after, then up to
    ``passes`` Jacobi passes) and the final pass's top-``k``."""
    seed = torch.tensor(list(seed)[: gamma - 1], dtype=anchor.dtype, device=anchor.device)
    noise = sample_noise_tokens(context, gamma - 1 - seed.numel(), generator)
    inputs = initial_block_inputs(anchor, torch.cat([seed, noise]))
    noise_mask = torch.arange(gamma, device=drafter.device) > seed.numel() if drafter.config.block_inputs == "mask" else None
    ids, logits = drafter.draft_block(cache, inputs, start, noise_mask, return_logits=True)
    last = {"logits": logits, "inputs": inputs}

    def draft_fn(block):  # a Jacobi pass that keeps its logits and inputs
        new, last["logits"] = drafter.draft_block(cache, block, start, return_logits=True)
        last["inputs"] = block
        return new

    ids, run = jacobi_refine(draft_fn, anchor, ids, passes)
    logits = last["logits"]
    probs, rows = torch.softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1)
    agreed = torch.zeros(gamma, dtype=torch.bool)
    agreed[:-1] = (ids[:-1] == last["inputs"][1:]).cpu()
    return TopkDraft(drafter._to_target_ids(rows).cpu(), probs.cpu(), ids, agreed, 1 + run, logits)


def sampled_topk(topk: TopkDraft, q: Proposal, k: int) -> TopkDraft:
    """``topk`` with its candidates and probabilities read from the proposal ``q`` (the final pass
    through the target's processors): the shape of a sampled tree is planned on the distribution its
    nodes are drawn from."""
    ids, probs = q.topk(k)
    return TopkDraft(ids.cpu(), probs.cpu(), topk.draft, topk.agreed, topk.passes, topk.logits)


def proposal_of(drafter, logits: torch.Tensor, input_ids: torch.Tensor, logits_processor, vocab_size: int,
                sharpness: float = 1.0) -> Proposal:
    """The proposal ``q`` of a drafted block under sampling (:mod:`hf_jetspec.generation.sampled_drafting`), on the CPU."""
    draft_vocab = drafter.draft_vocab_ids
    return make_proposal(logits.cpu(), None if draft_vocab is None else draft_vocab.cpu(), vocab_size, input_ids.cpu(), logits_processor,
                         sharpness)


def draft_branches(drafter, cache, anchor: torch.Tensor, draft: torch.Tensor, alternatives: torch.Tensor, start: int, k: int):
    """Re-draft what follows each depth-1 alternative, as one batch of blocks: the anchor, the
    alternative, then the main draft's continuation as inputs. Returns the top-``k`` target ids and
    probabilities of depths 2.. under each alternative ([B, gamma - 1, k] each, on CPU)."""
    gamma = draft.numel()
    rest = draft[1 : gamma - 1].to(anchor.device)
    inputs = torch.stack([torch.cat([anchor, alt.view(1).to(anchor.device), rest]) for alt in alternatives])
    _, logits = drafter.draft_blocks(cache, inputs, torch.full((inputs.shape[0],), start))
    probs, rows = torch.softmax(logits[:, 1:].float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1)
    return drafter._to_target_ids(rows).cpu(), probs.cpu()


def build_tree(options, topk_ids: torch.Tensor, topk_probs: torch.Tensor, max_depth: int, branches=None) -> DraftTree:
    """The round's tree without the round policy: ``options.tree == "auto"``: best-first under ``budget - 1`` nodes (with the
    re-drafted ``branches`` where given); a list of widths: :func:`~hf_jetspec.generation.tree.sibling_tree`.
    Never deeper than ``max_depth``."""
    topk_ids, topk_probs = topk_ids[:max_depth], topk_probs[:max_depth]
    if options.tree == "auto":
        if branches is not None:
            branches = (branches[0][:, : max_depth - 1], branches[1][:, : max_depth - 1])
        return best_first_tree(topk_ids, topk_probs, options.budget - 1, branches)
    return sibling_tree(topk_ids, list(options.tree)[:max_depth])


def verification_mask(tree: DraftTree, context_len: int, dtype: torch.dtype, device, boolean: bool) -> torch.Tensor:
    """[1, 1, 1 + N, context_len + 1 + N] mask of a tree forward: all of the cached context, then the tree.
    Boolean (True = attend) for SDPA-style kernels; additive (0 / dtype min) for eager attention."""
    inner = tree_attention_mask(tree)
    mask = torch.cat([torch.ones(inner.shape[0], context_len, dtype=torch.bool), inner], dim=1)[None, None].to(device)
    if boolean:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)


def _check_supported(target, cache, generation_config, input_ids, model_kwargs, compiled: bool = False) -> None:
    if input_ids.shape[0] != 1:
        raise ValueError("tree verification runs one sequence at a time (batch size 1)")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ValueError("tree verification needs an unpadded prompt (attention_mask all ones)")
    if generation_config.return_dict_in_generate and (
        generation_config.output_scores or generation_config.output_logits or generation_config.output_attentions
        or generation_config.output_hidden_states
    ):
        raise ValueError("tree verification returns sequences only: output_scores / output_logits / output_attentions / "
                         "output_hidden_states are not supported with drafting_config.tree")
    reason = None if compiled else tree_cache_reason(cache)  # compiled rounds check their static cache
    if reason is not None:
        raise ValueError(f"tree verification needs a dynamic full-attention cache; {type(target).__name__} {reason}")


def tree_cache_reason(cache) -> str | None:
    """Why tree rounds cannot run on ``cache`` (None: they can). They keep the accepted path's rows of
    a dynamic full-attention cache; a sliding-window layer drops rows by count, not by tree position,
    so targets with one (Mistral's window, Gemma-3's local layers) run chain rounds instead."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if layers is None or any(type(layer) is not DynamicLayer for layer in layers):
        return f"uses {sorted({type(layer).__name__ for layer in layers or []})}"
    return None


def tree_forward(target, input_ids, tree: DraftTree, cache, hidden_layers, boolean_mask: bool):
    """One verification forward of ``[anchor] + tree nodes``: the anchor is ``input_ids``' last token
    (not yet in ``cache``), the nodes sit at their depths after it under the tree mask."""
    anchor_position, device = input_ids.shape[1] - 1, input_ids.device
    ids = torch.cat([input_ids[0, -1:], tree.tokens.to(device)])[None]
    mask = verification_mask(tree, anchor_position, target.dtype, device, boolean_mask)
    return _forward(target, ids, tree_positions(tree, anchor_position)[None].to(device), mask, cache, hidden_layers)


def static_tree_forward(runner, input_ids, tree: DraftTree):
    """:func:`tree_forward` through a :class:`~hf_jetspec.generation.static_rounds.StaticTarget`: the
    same rows, written at the anchor's position of the static cache by the compiled bucket."""
    anchor_position, device = input_ids.shape[1] - 1, input_ids.device
    ids = torch.cat([input_ids[0, -1:], tree.tokens.to(device)])[None]
    return runner.verify(ids, tree_positions(tree, anchor_position)[None].to(device), tree_attention_mask(tree), anchor_position)


def _forward(target, ids, positions, mask, cache, hidden_layers):
    return target(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache, use_cache=True,
                  output_hidden_states=hidden_layers)


def _row_prefix(sequence: torch.Tensor, tree: DraftTree, row: int) -> torch.Tensor:
    """The input ids row ``row`` of a tree round is processed with: the sequence, then (row > 0) the
    path of node ``row - 1``."""
    if row == 0:
        return sequence
    return torch.cat([sequence, tree.tokens[tree.path(row - 1)].to(sequence.device)])


class ProcessedRows:
    """The target's processed distributions after the root and each node of a sampled tree round
    (``[1 + N]`` rows), each row processed with its own prefix (the sequence, then the node's path)
    and normalised when first read. Sampled verification reads only the rows on the accepted path, so
    the other nodes' rows (a top-p sort of the whole vocabulary each) are never processed. Row ``r``
    is what :func:`_choose` gives for it: the same processors on the same inputs, and a row's softmax
    equals that row of a batched softmax. Only for processors that read nothing but their own row
    (:func:`~hf_jetspec.generation.sampled_drafting.row_pure`)."""

    def __init__(self, logits: torch.Tensor, tree: DraftTree, sequence: torch.Tensor, logits_processor, device=None):
        self.logits, self.tree, self.sequence, self.processors = logits, tree, sequence, logits_processor
        self.device = logits.device if device is None else device  # where the rows are handed over
        self._rows: dict[int, torch.Tensor] = {}

    def __getitem__(self, row: int) -> torch.Tensor:
        row = int(row)
        if row not in self._rows:
            x = self.logits[row : row + 1]
            if len(self.processors) > 0:
                x = self.processors(_row_prefix(self.sequence, self.tree, row)[None], x)
            self._rows[row] = torch.softmax(x, dim=-1)[0].to(self.device)
        return self._rows[row]


def _choose(logits, prefixes, logits_processor, do_sample):
    """Process each row with its own prefix; greedy argmax or the processed probabilities."""
    if len(logits_processor) > 0:
        logits = torch.cat([logits_processor(p[None], logits[r : r + 1]) for r, p in enumerate(prefixes)])
    if do_sample:
        return None, torch.softmax(logits, dim=-1)
    return logits.argmax(-1), None


class TreeRoundPolicy:
    """The round policy for tree rounds (``drafting_config.policy``): what to verify and how much.

    Each round it looks up the n-gram continuation (the same sources as chain rounds), decides with
    the :class:`~hf_jetspec.policy.DraftGate` whether the drafter is worth a pass, and if it runs,
    builds one best-first tree from the drafter's candidates (their acceptance estimates through the
    drafter's calibration) with the n-gram continuation grafted in as a branch of its own. The node
    count ``n`` is the prefix of that tree with the most expected committed tokens per second under
    the measured cost model (:func:`~hf_jetspec.policy.choose_tree_size`); ``n = 0`` is a plain
    step. The drafter's node scores rank the nodes; what they are expected to commit comes from the
    running calibration of those scores against the verified outcomes
    (:class:`~hf_jetspec.policy.ScoreCalibration`, kept with the assistant's output memory). Without a
    drafter pass the round verifies the n-gram chain (or nothing) as chain rounds do.
    """

    def __init__(self, target, assistant, options, sampling: bool = False, profile=None):
        self.options = options
        self.assistant = assistant
        self.nodes = options.tree_node_budget
        sizes, seconds = profile if profile is not None else cost_profile_for(target, self.nodes + 1)
        self.cost = CostModel(sizes, seconds)
        self.gate = assistant.output_memory.draft_gate("tree")
        self.index = NgramIndex(max_ngram=options.max_ngram)
        self.memory = assistant.output_memory if options.output_memory else None
        self.acceptance = assistant.acceptance_model_for(sampling)
        self.calibration = assistant.output_memory.node_calibration
        self._proposal = None
        self._ngram_nodes: list[int] = []
        self._scored: list[tuple[float, int]] = []  # (raw score, node) of the verified drafter nodes
        self.lm = getattr(assistant, "lm_source", None)
        self.stats = None  # the call's GenerationStats (set by the loop): the LM source's counts go there
        if self.lm is not None:
            check_lm_source(target, self.lm.model)
        self._lm_chain = None  # this round's LM chain (raw probabilities) and its nodes in the tree
        self._lm_nodes: list[int] = []

    def _lm_propose(self, input_ids, max_depth: int, costs, free_rate: float, seeds=()):
        """The LM source's chain for this round, as long as another token pays (:func:`worth_another_token`);
        returns ``(tokens, calibrated conditionals)`` or None."""
        if self.lm is None or max_depth < 1:
            return None
        chain, calibrated = propose_priced(self.lm, input_ids[0], max_depth, self.calibration, costs,
                                           self.assistant.output_memory.draft_gate, free_rate, seeds)
        if chain is None:
            return None
        if self.stats is not None:
            self.stats.lm_time_s += chain.seconds
            self.stats.lm_tokens += len(chain.tokens)
        self._lm_chain = chain
        return chain.tokens, calibrated

    def plan(self, input_ids, max_depth: int, draft, before_draft=None):
        """This round's tree and its source (``"plain"``, ``"ngram"`` or ``"drafter"``).

        ``draft(seed)`` drafts the block (seeded with an n-gram continuation, or not) and returns
        ``(TopkDraft, branches or None, passes)``; ``before_draft()``, untimed, brings the drafter's
        cache up to date first (rows of earlier plain rounds are paid once, not per pass)."""
        opts = self.options
        self.index.extend(input_ids[0, len(self.index.tokens) :].tolist())
        costs = self.cost.verify_costs(self.nodes)
        proposal = propose_ngram(self.index, self.memory, max_depth) if max_depth > 0 and (opts.ngram or opts.ngram_seed) else None
        chain, free = [], choose_verify_length([], costs)
        if proposal is not None and opts.ngram:
            probs = self.assistant.output_memory.accept_probs(proposal)
            chain = [(proposal.tokens, probs)]
            free = choose_verify_length(probs, costs)
        self._proposal, self._ngram_nodes, self._scored, self._lm_chain, self._lm_nodes = proposal, [], [], None, []
        lm_chain = None

        def add_lm(seeds):  # the LM's chain (continuing the likeliest seed where it agrees) as the second grafted chain
            nonlocal chain, lm_chain
            lm_chain = self._lm_propose(input_ids, max_depth, costs, free.rate, seeds)
            if lm_chain is not None:
                chain = (chain or [([], [])]) + [lm_chain]  # chain 0 stays the n-gram's: the bookkeeping reads it so

        self.from_chain: list[bool] = []  # per node of the planned tree: taken for the n-gram chain
        # a drafter pass (and its branch pass) costs at most a small share of the time between probes
        self.gate.limit_probe_cost(self.cost.draft_cost(1 + opts.tree_passes), costs[0])
        if max_depth > 0 and self.gate.should_draft():
            if before_draft is not None:
                before_draft()
            t0 = time.perf_counter()
            seed = proposal.tokens if (proposal is not None and opts.ngram_seed) else []
            topk, branches, passes = draft(seed)
            self.cost.observe_draft(passes, time.perf_counter() - t0)
            table = self.acceptance.accept_probs(node_features(topk.probs, topk.agreed))
            # the LM continues the likelier of the drafter's argmax chain and the n-gram continuation: one forward
            # checks it, the LM's own forwards start where it disagrees
            add_lm([*chain[:1], (topk.draft[:max_depth].tolist(), table[:max_depth, 0].tolist())])
            if branches is not None:  # re-drafted subtrees: their own probabilities, never "agreed"
                b_ids, b_probs = branches
                flat = b_probs.reshape(-1, b_probs.shape[-1])
                b_table = self.acceptance.accept_probs(node_features(flat, torch.zeros(flat.shape[0], dtype=torch.bool)))
                branches = (b_ids, b_table.reshape(b_probs.shape))
            ranked = ranked_tree(topk.ids[:max_depth], table[:max_depth], self.nodes,
                                 None if branches is None else (branches[0][:, : max_depth - 1], branches[1][:, : max_depth - 1]), chain)
            # expected acceptance of each node's path: the drafter's nodes through the running calibration
            # of their scores, the n-gram chain's as estimated (running rates per position already)
            drafted = self.calibration("drafter", ranked.scores)
            expected = [s if ngram else d for s, d, ngram in zip(ranked.scores, drafted, ranked.from_chain)]
            choice = choose_tree_size(expected, costs)
            value = choose_tree_size(expected, costs, draft_cost=self.cost.draft_cost(passes), min_length=1).rate
            self.gate.observe(value, free.rate)
            if chain:
                self._ngram_nodes = [i for i in ranked.chain_nodes[0] if i < choice.length]
                self._lm_nodes = [i for i in ranked.chain_nodes[1] if i < choice.length] if len(chain) > 1 else []
            n = choice.length
            self._scored = [(s, i) for i, (s, ngram) in enumerate(zip(ranked.scores[:n], ranked.from_chain[:n])) if not ngram]
            self.from_chain = list(ranked.from_chain[:n])
            return truncate_tree(ranked.tree, n), "drafter"
        if max_depth > 0:
            self.gate.skipped()
            add_lm(chain[:1])
        if lm_chain is not None:  # no drafter pass: a tree of the n-gram and LM chains
            empty = torch.zeros(max_depth, 0)
            ranked = ranked_tree(empty.long(), empty, self.nodes, None, chain)
            choice = choose_tree_size(ranked.scores, costs)
            n = choice.length
            self._ngram_nodes = [i for i in ranked.chain_nodes[0] if i < n]
            self._lm_nodes = [i for i in ranked.chain_nodes[1] if i < n]
            self.from_chain = list(ranked.from_chain[:n])
            return truncate_tree(ranked.tree, n), ("plain" if n == 0 else "lm")
        if free.length == 0:
            return truncate_tree(chain_tree([]), 0), "plain"
        self._ngram_nodes = list(range(free.length))
        return chain_tree(proposal.tokens[: free.length]), "ngram"

    def observe(self, nodes: int, accepted: list[int], seconds: float) -> None:
        """The round verified ``nodes`` nodes in ``seconds`` and accepted the path ``accepted``."""
        self.cost.observe_verify(nodes + 1, seconds)
        if self._scored:
            on_path = set(accepted)
            self.calibration.observe("drafter", [s for s, _ in self._scored], [i in on_path for _, i in self._scored])
        if self._proposal is not None and self._ngram_nodes:
            hits = len(set(accepted) & set(self._ngram_nodes))
            self.assistant.output_memory.observe(self._proposal, verified=len(self._ngram_nodes), accepted=hits)
        if self._lm_chain is not None and self._lm_nodes:  # the chain's nodes form one path: its accepted ones are a prefix
            hits = len(set(accepted) & set(self._lm_nodes))
            self.calibration.observe_chain(LM_SOURCE, self._lm_chain.probs[: len(self._lm_nodes)], hits)
            if self.stats is not None:
                self.stats.lm_nodes += len(self._lm_nodes)
                self.stats.lm_accepted += hits

    def close(self, sequence: torch.Tensor, stats: GenerationStats) -> None:
        if self.memory is not None:
            self.memory.add_sequence(sequence.tolist())
        stats.cost_model = self.cost.summary(self.nodes) | {"node_calibration": self.calibration.table()}


@torch.no_grad()
def tree_decoding(target, input_ids, logits_processor, stopping_criteria, generation_config, streamer, assistant, model_kwargs,
                  recorder=None):
    """Generate with tree rounds; returns the sequences (or a ``GenerateDecoderOnlyOutput`` with them).
    ``recorder``: an online learner's :class:`~hf_jetspec.training.online.CallRecorder`, given the
    states of every verified position."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    cache = model_kwargs.get("cache")
    assistant = assistant_for(assistant)
    drafter = assistant.drafter
    _check_supported(target, cache, generation_config, input_ids, model_kwargs, drafter.drafting_config.compiled_rounds)
    drafter.attach_target(target)
    options = drafter.drafting_config
    check_context_window(drafter, options)
    drafter.configure_engine(options)
    stats = GenerationStats()
    layer_ids = list(drafter.config.target_layer_ids)
    hidden_layers = [i + 1 for i in layer_ids]
    runner = None  # compiled rounds: the target's forwards on its static cache
    if options.compiled_rounds:
        from .static_rounds import static_target_for

        t0 = time.perf_counter()
        runner = static_target_for(target, generation_config.max_length, options.max_verify_width, hidden_layers,
                                   options.compile_backend, options.compile_buckets)
        cache = runner.cache
        stats.prefill_time_s += time.perf_counter() - t0  # the warm-up of a target's first call counts there
    do_sample = bool(generation_config.do_sample)
    lazy_rows = do_sample and row_pure(logits_processor)  # sampled rounds process only the rows they read
    sampling = options.draws_from_q(generation_config)  # drafter nodes drawn from q, multi-draft verification
    vocab_size = target.get_output_embeddings().weight.shape[0]
    boolean_mask = getattr(target.config, "_attn_implementation", "sdpa") != "eager"
    generator = torch.Generator(device=drafter.device).manual_seed(options.seed)
    dcache = drafter.new_cache()
    device = input_ids.device
    k = max(options.tree_top_k, max(options.tree) if isinstance(options.tree, (list, tuple)) else 1)
    profile = None if runner is None else runner.profile(options.tree_node_budget + 1)
    policy = TreeRoundPolicy(target, assistant, options, sampling, profile) if options.policy and options.tree == "auto" else None  # static shapes stay static
    if policy is not None:
        policy.stats = stats
    elif getattr(assistant, "lm_source", None) is not None:
        raise ValueError("an LM source needs the round policy with tree='auto' (or chain rounds): fixed tree shapes have no place for it")
    pending = []  # verified states the drafter cache has not taken yet (with the policy, it takes them when it drafts)

    window = options.effective_context_window

    def states_of(out, rows):  # per read layer: views for a slice, the kept rows' copies for a list
        return [out.hidden_states[i][:, rows] for i in hidden_layers]

    def keep(states, positions):
        if recorder is not None:
            recorder.add(states)
        pending.append((states, positions))
        trim_pending(pending, window)

    def flush():
        if pending:
            states, positions = gather_pending(pending, window)
            pending.clear()
            drafter.append_context(dcache, states, positions, window=window)

    # prefill: the first token is the target's own step
    t0 = time.perf_counter()
    n = input_ids.shape[1]
    if runner is None:
        out = _forward(target, input_ids, torch.arange(n, device=device)[None], None, cache, hidden_layers)
    else:
        out = runner.prefill(input_ids)
    tokens, probs = _choose(out.logits[0, -1:].float(), [input_ids[0]], logits_processor, do_sample)
    first = int(tokens[0]) if probs is None else int(torch.multinomial(probs[0], 1))
    keep(states_of(out, slice(0, n)), torch.arange(n))
    if recorder is not None:
        recorder.add_labels(n - 1, out.logits[0, -1:])
    if policy is None:
        flush()
    stats.prefill_time_s += time.perf_counter() - t0
    committed = [first]
    while True:
        input_ids, done = _commit(input_ids, committed, stopping_criteria, streamer)
        if done:
            break
        cur = input_ids.shape[1]  # the anchor (last token) sits at position cur - 1, not yet in the target cache
        t0 = time.perf_counter()
        max_depth = min(options.budget - 1, generation_config.max_length - cur)
        anchor = input_ids[0, -1:].to(drafter.device)

        q_table = None

        def draft(seed=()):
            nonlocal q_table
            flush()
            topk = draft_topk(drafter, dcache, anchor, input_ids[0, :-1].to(drafter.device), options.budget - 1,
                              cur - 1, options.tree_passes, k, generator, seed)
            branches, passes = None, topk.passes
            if sampling:  # every node at depth d is drawn from the final pass's q_d: no re-drafted branches
                q_table = proposal_of(drafter, topk.logits, input_ids, logits_processor, vocab_size, options.proposal_sharpness)
                topk = sampled_topk(topk, q_table, k)
            elif options.tree == "auto" and options.tree_branches and max_depth > 1:
                alternatives = topk.ids[0, 1 : 1 + options.tree_branches]
                branches = draft_branches(drafter, dcache, anchor, topk.draft, alternatives, cur - 1, k)
                passes += 1
            stats.drafter_runs += 1
            stats.seeded_drafter_runs += int(len(seed) > 0)
            return topk, branches, passes

        from_chain = None
        if policy is not None:
            tree, source = policy.plan(input_ids, max_depth, draft, before_draft=flush)
            stats.round_sources.append(source)
            stats.chosen_lengths.append(len(tree))
            from_chain = policy.from_chain if source == "drafter" else None
            stats.grafted_nodes += sum(from_chain or [])
        elif max_depth > 0:
            topk, branches, _ = draft()
            tree = build_tree(options, topk.ids, topk.probs, max_depth, branches)
            from_chain = [False] * len(tree)
        else:
            tree = DraftTree(*(torch.zeros(0, dtype=torch.long),) * 3)
        sampled = origin = None
        if sampling and from_chain is not None and q_table is not None:  # the shape is fixed: now draw it
            sampled = sample_tree(tree, from_chain, q_table)
            tree, origin = sampled.tree, sampled.origin
            stats.sampled_drafts += 1
        t1 = time.perf_counter()
        stats.draft_time_s += t1 - t0
        if runner is None:
            out = tree_forward(target, input_ids, tree, cache, hidden_layers, boolean_mask)
        else:
            out = static_tree_forward(runner, input_ids, tree)
        logits = out.logits[0].float()
        if lazy_rows:  # sampling: each row processed and normalised when verification first reads it
            # multi-draft verification combines the rows with q on the CPU
            choice, probs = None, ProcessedRows(logits, tree, input_ids[0], logits_processor, "cpu" if sampled is not None else None)
        else:
            prefixes = []
            if len(logits_processor) > 0:  # each row is processed with its own prefix: the sequence, then the node's path
                prefixes = [_row_prefix(input_ids[0], tree, r) for r in range(len(tree) + 1)]
            choice, probs = _choose(logits, prefixes, logits_processor, do_sample)
            if probs is not None and sampled is not None:
                probs = probs.cpu()
        if probs is None:
            accepted, bonus = accept_greedy(tree, choice.cpu())
        elif sampled is not None:
            accepted, bonus = accept_multidraft(sampled, probs, q_table.dense_probs())
        else:
            accepted, bonus = accept_sampled(tree, probs)
        rows = [0] + [1 + i for i in accepted]
        if runner is None:
            keep_cache_rows(cache, cur - 1, rows)
        else:
            runner.keep_rows(cur - 1, rows)
        keep(states_of(out, rows), torch.arange(cur - 1, cur - 1 + len(rows)))
        if recorder is not None:
            recorder.add_labels(cur - 1, logits[rows])
        if policy is None:
            flush()
        committed = [int(tree.tokens[i]) for i in accepted] + [bonus]
        elapsed = time.perf_counter() - t1
        stats.verify_time_s += elapsed
        if policy is not None:
            policy.observe(len(tree), accepted if origin is None else [origin[i] for i in accepted], elapsed)
        stats.record_round(accepted=len(accepted), committed=len(committed), drafted=len(tree))
        stats.record_tree_round(nodes=len(tree), depth=len(accepted), off_chain=any(_rank(tree, i) > 0 for i in accepted))
    if policy is not None:
        policy.close(input_ids[0], stats)
    drafter.generation_stats = stats
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=input_ids, past_key_values=cache)
    return input_ids


def _rank(tree: DraftTree, node: int) -> int:
    """Rank of ``node`` among its siblings (0: the first child, the drafter's top choice there)."""
    return list(tree.children(int(tree.parents[node])).values()).index(node)


def _commit(input_ids, tokens, stopping_criteria, streamer):
    """Append ``tokens`` one at a time, stopping at the first token where a criterion fires."""
    done = False
    kept = []
    for t in tokens:
        kept.append(t)
        input_ids = torch.cat([input_ids, torch.tensor([[t]], dtype=input_ids.dtype, device=input_ids.device)], dim=1)
        if bool(stopping_criteria(input_ids, None).all()):
            done = True
            break
    if streamer is not None and kept:
        streamer.put(torch.tensor([kept], dtype=input_ids.dtype))
    return input_ids, done
