"""Several prompts at once: speculative rounds over a left-padded batch, each row accepting its own count.

``target.generate(input_ids, attention_mask=mask, assistant_model=...)`` with several left-padded
rows runs this loop, for a :class:`~hf_jetspec.DrafterFreeAssistant` and for a drafter alike: every
round each live row gets its own proposal (its n-gram continuation, else a match in the assistant's
output memory, priced by the running acceptance of such proposals; with a drafter also the drafter's
block, all live rows drafted in one forward by
:class:`~hf_jetspec.generation.batched_drafting.BatchedDrafter` and priced by the calibrated
acceptance model, the row keeping whichever of the two is expected to commit more, behind a draft
gate that weighs the drafter's pass against the width it fills), one width ``W`` is chosen for the batch from what a forward of that many rows costs
on this machine (:func:`~hf_jetspec.policy.batch_cost_profile_for`, measured once per row count, and
:func:`~hf_jetspec.policy.choose_batch_width`; ``W = 1`` is a plain step for every row), the target
verifies every row in one forward of ``[B, W]`` tokens (shorter proposals padded), and each row commits its own accepted prefix and the target's token
after it: greedy exact match, or under sampling the point-mass rule (accept ``d`` with ``p(d)``,
otherwise draw from ``p`` without ``d``), which is the target's law row by row.

Cache layout: per-row lengths with masked holes. A round appends ``W`` columns to every row; a row
keeps the columns of its anchor and accepted tokens, and its other columns become holes, masked out
for every later query (``attention_mask`` 0). Positions count each row's real tokens only, so a row
sees exactly the keys plain decoding of that row would see. Columns that are holes in every live
row at the end of the cache are cropped at once; when holes pass ``COMPACT_SHARE`` of the cache, the
cache is compacted (each row's real columns gathered, left-padded, into a new cache). Rows that
finish (EOS, stop strings, length) leave the batch at the end of their round, their cache rows with
them, and the left padding no live row needs is cut. The alternatives: cropping every row to the
shortest accepted count would throw away the longer rows' accepted tokens and verify them again;
compacting every round copies the whole cache every round. A batch's statistics
(``generation_stats.cost_model``) count its compactions, and ``hf-jetspec bench --batch-size B``
measures the loop against transformers' batched plain decoding.

Targets with sliding-window layers get a cache that keeps every column (a window counted in
columns would count holes too) and explicit 4D masks per layer kind (:func:`window_mask`): a query
sees the real keys fewer than ``window`` positions back, which is what a sliding layer of batched
plain decoding sees, since left padding shifts query and key columns alike.

The output is what transformers' batched plain decoding returns for the same left-padded input:
``[B, P + G]``, each row its prompt (with its padding), its tokens up to and including the one where
it stopped, then ``pad_token_id``.
"""

from __future__ import annotations

import time

import torch

from ..policy import CostModel, NgramIndex, choose_batch_width, expected_committed, expected_committed_tree, propose_ngram
from .stats import GenerationStats
from .tree import DraftTree, accept_greedy, tree_attention_mask, truncate_tree

COMPACT_SHARE = 0.5  # compact the cache when this share of its columns are holes


def row_bucket(rows: int) -> int:
    """The power of two at or above ``rows``: batched rounds price a batch at its bucket's profile.

    >>> [row_bucket(n) for n in (1, 2, 3, 5, 8)]
    [1, 2, 4, 8, 8]
    """
    return 1 << max(int(rows) - 1, 0).bit_length()


def check_left_padded(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The batch's attention mask, checked: left padding only (a row's real tokens are contiguous and
    end at the last column), the shape of the ids. Rows of one length need no mask."""
    if attention_mask is None:
        return torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, the input ids {tuple(input_ids.shape)}: "
                         "give one mask entry per token")
    mask = attention_mask.to(torch.long)
    if bool((mask[:, -1] == 0).any()):
        raise ValueError("a row's last token is padding: batched speculative decoding needs left padding "
                         "(tokenizer.padding_side = 'left')")
    steps = mask[:, 1:] - mask[:, :-1]
    if bool((steps < 0).any()):
        raise ValueError("the attention mask has a gap inside a row: batched speculative decoding needs left padding "
                         "(padding before each prompt, none inside or after it)")
    if bool((mask.sum(-1) == 0).any()):
        raise ValueError("a row of the batch has no tokens")
    return mask


def compact_layout(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For a ``[B, T]`` mask with holes: the ``[B, T']`` column index that gathers each row's real
    columns, left-padded (padding points at column 0), and the new mask; ``T'`` is the longest row.

    >>> index, new = compact_layout(torch.tensor([[0, 1, 0, 1, 1], [1, 1, 1, 0, 1]]))
    >>> index.tolist(), new.tolist()
    ([[0, 1, 3, 4], [0, 1, 2, 4]], [[0, 1, 1, 1], [1, 1, 1, 1]])
    """
    counts = mask.sum(-1)
    width = int(counts.max())
    index = torch.zeros(mask.shape[0], width, dtype=torch.long, device=mask.device)
    new = torch.zeros(mask.shape[0], width, dtype=mask.dtype, device=mask.device)
    for b in range(mask.shape[0]):
        real = mask[b].nonzero().squeeze(-1)
        index[b, width - real.numel():] = real
        new[b, width - real.numel():] = 1
    return index, new


def _cache_layers(cache):
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or not all(type(layer) is DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers or []})
        raise ValueError(f"batched speculative decoding needs a dynamic cache (DynamicLayer or DynamicSlidingWindowLayer); "
                         f"this target's cache has {kinds or 'no layers'}")
    return layers


def attention_windows(cache) -> dict[str, int | None] | None:
    """The sliding windows of the target's layers, from the cache ``generate`` built for it: None when
    every layer attends to the whole context; else ``{layer type: window or None}`` for the kinds
    present (``"full_attention"``, ``"sliding_attention"``)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None) or []
    kinds = {type(layer) for layer in layers}
    if not kinds or not kinds <= {DynamicLayer, DynamicSlidingWindowLayer}:
        _cache_layers(cache)  # the error that names what is there
    if DynamicSlidingWindowLayer not in kinds:
        return None
    sizes = {int(layer.sliding_window) for layer in layers if isinstance(layer, DynamicSlidingWindowLayer)}
    if len(sizes) != 1:
        raise ValueError(f"batched speculative decoding supports one sliding window per target; this one has {sorted(sizes)}")
    windows = {"sliding_attention": sizes.pop()}
    if DynamicLayer in kinds:
        windows["full_attention"] = None
    return windows


def window_mask(key_real: torch.Tensor, key_pos: torch.Tensor, query_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[B, 1, Q, K]`` boolean mask of queries at positions ``query_pos`` ``[B, Q]`` over keys at
    ``key_pos`` ``[B, K]`` of which ``key_real`` are real (the rest holes or padding): a query sees
    the real keys at or before its position, and with a ``window`` only those fewer than ``window``
    positions back, as a sliding-window layer of plain decoding sees them (padding shifts query and
    key columns alike, so the window counts positions).

    >>> window_mask(torch.tensor([[1, 0, 1, 1]]), torch.tensor([[0, 0, 1, 2]]), torch.tensor([[2]]), 2).int().tolist()
    [[[[0, 0, 1, 1]]]]
    """
    seen = key_real.bool()[:, None, :] & (key_pos[:, None, :] <= query_pos[:, :, None])
    if window is not None:
        seen = seen & (query_pos[:, :, None] - key_pos[:, None, :] < window)
    return seen[:, None]


def tree_round_mask(key_real: torch.Tensor, key_pos: torch.Tensor, query_pos: torch.Tensor, block: torch.Tensor,
                    window: int | None) -> torch.Tensor:
    """``[B, 1, W, T + W]`` boolean mask of a batched tree round: the ``W`` new rows of each batch row (its
    anchor, its tree's nodes, padding) at ``query_pos`` ``[B, W]`` see the real cached keys at or before
    their position (``key_real``, ``key_pos`` ``[B, T]``) and, among the new rows, what ``block``
    ``[B, W, W]`` allows (the tree mask: the anchor, a node's ancestors and itself); with a ``window``,
    nothing ``window`` or more positions back."""
    cached = key_real.bool()[:, None, :] & (key_pos[:, None, :] <= query_pos[:, :, None])
    new = block.clone()
    if window is not None:
        cached = cached & (query_pos[:, :, None] - key_pos[:, None, :] < window)
        new = new & (query_pos[:, :, None] - query_pos[:, None, :] < window)
    return torch.cat([cached, new], dim=-1)[:, None]


def layer_masks(windows: dict[str, int | None], key_real, key_pos, query_pos, boolean: bool, dtype, layer_types: bool, block=None):
    """The attention mask argument of a 4D-masked round: one mask per layer kind (``block``: a tree round's
    new rows, :func:`tree_round_mask`; else a chain round over cached and new keys, :func:`window_mask`)
    (a dict keyed by layer type where the model reads one, else the single kind's mask), boolean for
    SDPA-style kernels, additive (0 / dtype min) for eager attention."""
    masks = {}
    for kind, window in windows.items():
        if block is None:
            mask = window_mask(key_real, key_pos, query_pos, window)
        else:
            mask = tree_round_mask(key_real, key_pos, query_pos, block, window)
        masks[kind] = mask if boolean else torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    if layer_types:
        return masks
    if len(masks) != 1:
        raise ValueError("a target with both full and sliding-window layers must name its layer_types")
    return next(iter(masks.values()))


def gather_columns(cache, index: torch.Tensor) -> None:
    """Keep the cache columns ``index[b]`` of each row ``b`` (``[B, T']``), in place."""
    for layer in _cache_layers(cache):
        for name in ("keys", "values"):
            t = getattr(layer, name)
            idx = index.to(t.device)[:, None, :, None].expand(t.shape[0], t.shape[1], index.shape[1], t.shape[3])
            setattr(layer, name, torch.gather(t, 2, idx))


def crop_columns(cache, length: int) -> None:
    for layer in _cache_layers(cache):
        layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]


class _Row:
    """One prompt of the batch: its padded prompt, what it has committed, its n-gram index."""

    def __init__(self, prompt: torch.Tensor, real: int, max_ngram: int):
        self.prompt = prompt  # [P], with its left padding
        self.real = real  # real tokens so far (prompt and committed): the next position
        self.tokens: list[int] = []  # committed
        self.index = NgramIndex(max_ngram=max_ngram)
        self.index.extend(prompt[prompt.numel() - real:].tolist())
        self.done = False

    def ids(self, extra: list[int] = ()) -> torch.Tensor:
        tail = torch.tensor(self.tokens + list(extra), dtype=self.prompt.dtype, device=self.prompt.device)
        return torch.cat([self.prompt, tail])


def _process(processors, row: _Row, drafts: list[int], logits: torch.Tensor) -> torch.Tensor:
    """Row ``j`` of ``logits`` processed with the row's sequence and its first ``j`` drafts as input ids."""
    if processors is None or len(processors) == 0:
        return logits
    logits = logits.float()  # processors see float32 scores, as in transformers' own loop
    return torch.cat([processors(row.ids(drafts[:j])[None], logits[j : j + 1]) for j in range(logits.shape[0])])


def _process_tree(processors, row: _Row, tree: DraftTree, logits: torch.Tensor) -> torch.Tensor:
    """Row ``r`` of a tree round's ``logits`` processed with the row's sequence and (``r > 0``) the path
    of node ``r - 1`` as input ids, as plain decoding would have had them."""
    if processors is None or len(processors) == 0:
        return logits
    logits = logits.float()
    rows = []
    for r in range(logits.shape[0]):
        path = [] if r == 0 else tree.tokens[tree.path(r - 1)].tolist()
        rows.append(processors(row.ids(path)[None], logits[r : r + 1]))
    return torch.cat(rows)


def _verify_row(logits: torch.Tensor, drafts: list[int], do_sample: bool) -> tuple[int, int]:
    """``(accepted, token)``: how many of ``drafts`` the target keeps and the token it commits after
    them, from the row's processed logits ``[len(drafts) + 1, V]`` (greedy exact match; sampled: the
    point-mass rule, exact for the target's law)."""
    if not do_sample:
        choice = logits.argmax(-1).tolist()
        n = 0
        while n < len(drafts) and drafts[n] == choice[n]:
            n += 1
        return n, choice[n]
    for j, d in enumerate(drafts):
        p = torch.softmax(logits[j].float(), -1)
        if float(torch.rand(())) < float(p[d]):
            continue
        p[d] = 0.0  # rejected: a draw from p without d (renormalised by multinomial)
        return j, int(torch.multinomial(p, 1))
    return len(drafts), int(torch.multinomial(torch.softmax(logits[len(drafts)].float(), -1), 1))


def batched_decoding(target, input_ids, logits_processor, stopping_criteria, generation_config, streamer, assistant, model_kwargs):
    """Generate for every row of a left-padded batch with an assistant's proposals (see the module
    docstring); returns the sequences (or a ``GenerateDecoderOnlyOutput`` with them)."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    if streamer is not None:
        raise ValueError("a streamer receives one sequence: stream batched generation one row at a time")
    cache = model_kwargs.get("cache")
    windows = attention_windows(cache)
    if windows is not None:  # every key kept (holes would shift a column-counted window); the windows live in the masks
        from transformers import DynamicCache

        cache = DynamicCache()
    boolean = getattr(target.config, "_attn_implementation", "sdpa") != "eager"
    text_config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    named = windows is not None and getattr(text_config, "layer_types", None) is not None
    mask = check_left_padded(input_ids, model_kwargs.get("attention_mask"))

    def attention(key_real, key_pos, query_pos, block=None):
        if windows is None and block is None:
            return key_real  # the 2D mask: transformers builds the causal mask over it
        kinds = windows if windows is not None else {"full_attention": None}
        return layer_masks(kinds, key_real, key_pos, query_pos, boolean, target.dtype, named, block)
    options = assistant.drafting_config
    do_sample = bool(generation_config.do_sample)
    pad = generation_config._pad_token_tensor
    pad_id = int(pad) if pad is not None else 0
    from .. import policy as policy_module

    drafter = None
    if getattr(assistant, "drafter", None) is not None:  # a JetSpecAssistant: its drafter drafts every row in one forward
        from .batched_drafting import BatchedDrafter, check_batched_drafter

        check_batched_drafter(assistant)
        assistant.drafter.attach_target(target)
        assistant.drafter.configure_engine(options)
        drafter = BatchedDrafter(assistant, input_ids.shape[0])
    hidden_layers = None if drafter is None else drafter.hidden_layers

    # what a forward of rows x tokens costs here, per bucket of live rows (powers of two, each priced at
    # its top: a few profiles per process, all measured before the first round, none inside a later call)
    models: dict[int, CostModel] = {}
    for bucket in {row_bucket(n) for n in range(1, input_ids.shape[0] + 1)}:
        models[bucket] = CostModel(*policy_module.batch_cost_profile_for(target, options.budget, bucket))

    def cost_for(rows_live: int) -> CostModel:
        return models[row_bucket(rows_live)]
    memory = assistant.output_memory if options.output_memory else None
    gate = assistant.output_memory.draft_gate("batch") if drafter is not None else None
    trees = drafter is not None and options.batch_trees and not do_sample  # greedy: a tree per row (sampling: chains)
    use_ngrams = getattr(options, "ngram", True)  # a drafter's config may switch n-gram proposals off
    stats = GenerationStats()
    device = input_ids.device
    rows = [_Row(input_ids[b], int(mask[b].sum()), options.max_ngram) for b in range(input_ids.shape[0])]
    live = list(range(len(rows)))
    compactions, layout_s, hole_share, batch_rounds = 0, 0.0, 0.0, 0

    t0 = time.perf_counter()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = target(input_ids=input_ids, attention_mask=attention(mask, positions, positions), position_ids=positions, cache=cache,
                 use_cache=True, logits_to_keep=1, output_hidden_states=hidden_layers)
    last = out.logits[:, -1].float()
    if logits_processor is not None and len(logits_processor) > 0:
        last = logits_processor(input_ids, last)
    first = torch.multinomial(torch.softmax(last, -1), 1).squeeze(-1) if do_sample else last.argmax(-1)
    if drafter is not None:  # each row's prompt, without its padding, is the drafter's first context
        width = input_ids.shape[1]
        for b, row in enumerate(rows):
            drafter.observe(b, [out.hidden_states[i][b : b + 1, width - row.real :] for i in hidden_layers], torch.arange(row.real))
    stats.prefill_time_s += time.perf_counter() - t0
    anchors = []
    for b, row in enumerate(rows):
        _commit_row(row, [int(first[b])], stopping_criteria)
        anchors.append(row.tokens[-1])

    while True:
        keep = [j for j, b in enumerate(live) if not rows[b].done]
        if not keep:
            break
        if len(keep) < len(live):  # finished rows leave the batch, with their cache rows
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask = mask[index]
            live, anchors = [live[j] for j in keep], [anchors[j] for j in keep]
            if drafter is not None:
                drafter.select(keep)
            first_col = int(mask.any(0).float().argmax())  # left padding no live row needs
            if first_col > 0:
                for layer in _cache_layers(cache):
                    layer.keys, layer.values = layer.keys[:, :, first_col:], layer.values[:, :, first_col:]
                mask = mask[:, first_col:]
        t0 = time.perf_counter()
        cost = cost_for(len(live))
        gammas = [min(options.budget - 1, generation_config.max_length - rows[b].prompt.numel() - len(rows[b].tokens) - 1) for b in live]
        top_gamma = max(gammas)
        costs = cost.verify_costs(max(top_gamma, options.tree_node_budget if trees else 0, 0))
        proposals, offered, offered_probs, expected, sources = [], [], [], [], []
        for b, gamma in zip(live, gammas):
            row = rows[b]
            proposal = propose_ngram(row.index, memory, gamma) if gamma > 0 and use_ngrams else None
            tokens = [] if proposal is None else list(proposal.tokens[:gamma])
            probs = [] if proposal is None else assistant.output_memory.accept_probs(proposal)[: len(tokens)]
            proposals.append(proposal)
            offered.append(tokens)
            offered_probs.append(probs)
            expected.append(expected_committed(probs))
            sources.append("ngram" if tokens else "plain")
        plans = None  # a tree round: per row (its tree, its RankedTree)
        if drafter is not None and top_gamma > 0:
            free = choose_batch_width(expected, costs)
            if gate.should_draft():
                t_draft = time.perf_counter()
                starts_now = [rows[b].real - 1 for b in live]
                seen = [rows[b].ids()[rows[b].prompt.numel() - rows[b].real + len(rows[b].tokens):] for b in live]
                if trees:
                    chains = [[(t, p)] if t else [] for t, p in zip(offered, offered_probs)]
                    planned, passes = drafter.propose_trees(anchors, starts_now, seen, top_gamma, [max(g, 0) for g in gammas], chains)
                    cost.observe_draft(passes, time.perf_counter() - t_draft)
                    choice = choose_batch_width([expected_committed_tree(e) for _, e in planned], costs)
                    plans = [(truncate_tree(r.tree, min(choice.length, len(r.tree))), r) for r, _ in planned]
                else:
                    drafts, draft_probs, passes = drafter.propose(anchors, starts_now, seen, top_gamma)
                    cost.observe_draft(passes, time.perf_counter() - t_draft)
                    for j, gamma in enumerate(gammas):  # each row keeps the likelier of its two proposals
                        tokens, probs = drafts[j][: max(gamma, 0)], draft_probs[j][: max(gamma, 0)]
                        mine = expected_committed(probs)
                        if tokens and mine[-1] > expected[j][-1]:
                            offered[j], expected[j], sources[j] = tokens, mine, "drafter"
                    choice = choose_batch_width(expected, costs)
                stats.drafter_runs += 1
                gate.observe(choice.expected_tokens / (choice.cost_s + cost.draft_cost(passes)), free.rate)
            else:
                gate.skipped()
        starts = torch.tensor([rows[b].real - 1 for b in live], device=device)
        if plans is None:
            # one width for the batch: the cap on every row's proposal with the most expected tokens across
            # the rows per second, at what a forward of this many rows costs (plain steps for all: 0)
            top = max(len(t) for t in offered)
            cap = choose_batch_width(expected, costs).length if top else 0
            chosen = [t[:cap] for t in offered]
            width = 1 + max(len(c) for c in chosen)
            feed = torch.full((len(live), width), pad_id, dtype=input_ids.dtype, device=device)
            new_cols = torch.zeros(len(live), width, dtype=mask.dtype, device=device)
            for j, (anchor, drafts) in enumerate(zip(anchors, chosen)):
                feed[j, : 1 + len(drafts)] = torch.tensor([anchor] + drafts, dtype=feed.dtype)
                new_cols[j, : 1 + len(drafts)] = 1
            positions = starts[:, None] + torch.arange(width, device=device)[None]
            full = torch.cat([mask, new_cols], dim=1)
            if windows is not None:
                key_pos = torch.cat([(mask.cumsum(-1) - 1).clamp(min=0), positions], dim=1)
                full = attention(full, key_pos, positions)
        else:  # the anchor and each row's tree, padded; a node sits at its depth after the anchor under the tree mask
            width = 1 + max(len(t) for t, _ in plans)
            feed = torch.full((len(live), width), pad_id, dtype=input_ids.dtype, device=device)
            new_cols = torch.zeros(len(live), width, dtype=mask.dtype, device=device)
            block = torch.eye(width, dtype=torch.bool).repeat(len(live), 1, 1)  # padding sees itself only
            depth = torch.zeros(len(live), width, dtype=torch.long)
            for j, (anchor, (tree, _)) in enumerate(zip(anchors, plans)):
                n = len(tree)
                feed[j, : 1 + n] = torch.cat([torch.tensor([anchor]), tree.tokens]).to(feed.dtype)
                new_cols[j, : 1 + n] = 1
                block[j, : 1 + n, : 1 + n] = tree_attention_mask(tree)
                depth[j, 1 : 1 + n] = tree.depths
            positions = starts[:, None] + depth.to(device)
            full = attention(mask, (mask.cumsum(-1) - 1).clamp(min=0), positions, block.to(device))
        t1 = time.perf_counter()
        stats.draft_time_s += t1 - t0
        out = target(input_ids=feed, attention_mask=full, position_ids=positions, cache=cache, use_cache=True,
                     output_hidden_states=hidden_layers)
        logits = out.logits  # in the target's dtype: an argmax needs no upcast, a sampled row is upcast when read
        kept = torch.zeros_like(new_cols)
        for j, b in enumerate(live):
            row = rows[b]
            if plans is None:
                drafts = chosen[j]
                rowlogits = _process(logits_processor, row, drafts, logits[j, : 1 + len(drafts)])
                accepted, token = _verify_row(rowlogits, drafts, do_sample)
                cols, tokens, drafted = list(range(1 + accepted)), drafts[:accepted] + [token], len(drafts)
            else:
                tree, ranked = plans[j]
                drafted = len(tree)
                rowlogits = _process_tree(logits_processor, row, tree, logits[j, : 1 + drafted])
                path, token = accept_greedy(tree, rowlogits.argmax(-1))
                accepted, cols, tokens = len(path), [0] + [1 + i for i in path], tree.tokens[path].tolist() + [token]
            kept[j, cols] = 1  # the anchor and the accepted drafts are now in the cache
            if drafter is not None:  # ... and verified context for the drafter
                drafter.observe(j, [out.hidden_states[i][j : j + 1, cols] for i in hidden_layers],
                                torch.arange(row.real - 1, row.real + accepted))
                if plans is not None:
                    drafter.verified_tree(ranked, drafted, path)
                elif sources[j] == "drafter" and drafts:
                    drafter.verified(j, drafted, accepted)
            committed = _commit_row(row, tokens, stopping_criteria)
            anchors[j] = row.tokens[-1]
            if plans is not None and proposals[j] is not None and offered[j]:  # the grafted n-gram chain's nodes
                nodes = [i for i in ranked.chain_nodes[0] if i < drafted]
                if nodes:
                    assistant.output_memory.observe(proposals[j], verified=len(nodes), accepted=len(set(path) & set(nodes)))
            elif plans is None and sources[j] == "ngram" and proposals[j] is not None and drafts:
                assistant.output_memory.observe(proposals[j], verified=len(drafts), accepted=accepted)
            stats.record_round(accepted=accepted, committed=committed, drafted=drafted)
            stats.round_sources.append(("drafter" if plans is not None else sources[j]) if drafted else "plain")
        elapsed = time.perf_counter() - t1
        stats.verify_time_s += elapsed
        cost.observe_verify(width, elapsed)
        t2 = time.perf_counter()
        mask = torch.cat([mask, kept], dim=1)
        used = int(mask.any(0).nonzero().max()) + 1  # trailing columns no live row keeps
        if used < mask.shape[1]:
            crop_columns(cache, used)
            mask = mask[:, :used]
        holes = float((mask == 0).float().mean())
        hole_share += holes
        if holes > COMPACT_SHARE:
            index, mask = compact_layout(mask)
            gather_columns(cache, index)
            compactions += 1
        layout_s += time.perf_counter() - t2
        batch_rounds += 1
    if memory is not None:
        for row in rows:
            memory.add_sequence(row.ids()[row.prompt.numel() - (row.real - len(row.tokens)) :].tolist())
    stats.cost_model = {"batch_rows": len(rows), "compactions": compactions, "batch_rounds": batch_rounds,
                        "layout_ms": round(1000 * layout_s, 3),  # cropping, compacting: what the hole layout costs
                        "mean_hole_share": round(hole_share / max(batch_rounds, 1), 4),
                        "by_rows": {n: m.summary(options.budget - 1) for n, m in sorted(models.items())}}
    assistant.generation_stats = stats
    generated = max(len(row.tokens) for row in rows)
    sequences = torch.full((len(rows), input_ids.shape[1] + generated), pad_id, dtype=input_ids.dtype, device=device)
    for b, row in enumerate(rows):
        sequences[b, : input_ids.shape[1] + len(row.tokens)] = row.ids()
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences, past_key_values=cache)
    return sequences


def _commit_row(row: _Row, tokens: list[int], stopping_criteria) -> int:
    """Append ``tokens`` to the row one at a time, stopping at the first where a criterion fires
    (the row is then done); returns how many were committed."""
    n = 0
    for t in tokens:
        row.tokens.append(t)
        row.real += 1
        row.index.extend([t])
        n += 1
        if bool(stopping_criteria(row.ids()[None], None).all()):
            row.done = True
            break
    return n
