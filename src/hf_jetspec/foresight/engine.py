"""Foresight drafting rounds: scoring, outcome selection, batched pre-drafting, refresh and replacement.

Everything here only changes *proposals*. Every committed token still goes through exact-match
verification in ``generate``, so the output does not depend on anything computed here (seed 000,
Appendix F.3).

Block layout (shared with :mod:`hf_jetspec.drafter.jacobi`): a block is its anchor ``t_0`` at position
``start`` followed by ``gamma`` draft tokens. A drafter pass reads inputs ``[t_f, .., t_{gamma-1}]``
from the *pass anchor* ``t_f`` and rewrites ``t_{f+1} .. t_gamma``; rows of predicted target states
(:class:`PredictedRows`) for positions before the pass anchor that the target has not verified
yet stand in for true context rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..drafter.drafter_cache import DrafterCache
from .cache import CachedBlock, SpeculationCache
from .calibration import ForesightCalibration, decoder_position_stats, position_features
from .outcomes import TopRows, top_outcomes

RECORD_TOP = 33  # top tokens kept per row in round records (32 candidates + the excluded draft token)


@dataclass
class PredictedRows:
    """Predicted target-side rows of not-yet-verified positions: read-layer states and decoder inputs."""

    states: torch.Tensor  # [1, E, n_read * H]
    decoder_inputs: list[torch.Tensor]  # per reused decoder layer: [1, E, H]
    positions: torch.Tensor  # [E]
    adapter_inputs: list[torch.Tensor] = field(default_factory=list)  # per layer of a LayerSkipAdapter: [1, E, H]

    def __len__(self) -> int:
        return int(self.positions.numel())

    def head(self, count: int) -> "PredictedRows":
        return PredictedRows(self.states[:, :count], [h[:, :count] for h in self.decoder_inputs], self.positions[:count],
                             [h[:, :count] for h in self.adapter_inputs])


@dataclass
class BlockScore:
    """Adapter + decoder view of blocks ``[t_0 .. t_gamma]``: predicted rows and the decoder's final states."""

    rows: PredictedRows  # gamma + 1 rows of the first (or only) block
    hidden: torch.Tensor  # [B, gamma + 1, H] decoder states before its norm and LM head
    pred: torch.Tensor | None = None  # [B, gamma + 1, n_read * H] predicted read-layer states of every block


@dataclass
class ForesightRecord:
    """One round as foresight saw it (for calibration and offline replay of selection rules)."""

    draft: list[int]
    draft_top1: list[float]
    draft_own_prob: list[float]
    draft_row_tokens: list[list[int]]
    draft_row_probs: list[list[float]]
    p_hat: list[float]
    decoder_row_tokens: list[list[int]]
    decoder_row_probs: list[list[float]]
    features: list[list[float]]
    selected: list[tuple[int, int]] = field(default_factory=list)
    realized: tuple[int, int] | None = None
    hit: bool | None = None


class ForesightEngine:
    """The adapter/decoder side of a JetSpec++ drafter, with its own caches over the verified context."""

    def __init__(self, drafter, adapter, decoder, calibration: ForesightCalibration | None, options):
        self.drafter = drafter
        self.adapter = adapter
        self.decoder = decoder
        self.calibration = calibration
        self.options = options
        self.adapter_cache = adapter.new_cache()
        self.decoder_cache = decoder.new_cache()
        self._draft_vocab = None if drafter.config.draft_vocab_size is None else drafter.draft_vocab.cpu()
        self._draft_index = drafter.draft_index()  # target id -> row of the draft head (-1: not draftable)

    # ------------------------------------------------------------------ verified context
    def observe(self, read_states: torch.Tensor, hidden_states, count: int, positions: torch.Tensor) -> None:
        """Add verified rows: read-layer states [1, T, n*H] and the target's hidden-state tuple."""
        layer_inputs = [hidden_states[i][:, :count] for i in self.adapter.state_indices]
        self.adapter.append_context(self.adapter_cache, read_states, positions, layer_inputs=layer_inputs)
        self.decoder.append_context(self.decoder_cache, [hidden_states[i][:, :count] for i in self.decoder.state_indices], positions)

    # ------------------------------------------------------------------ scoring
    def score(self, tokens: torch.Tensor, start: int | torch.Tensor, rows: PredictedRows | None = None, visible: torch.Tensor | None = None) -> BlockScore:
        """Predict the target rows of blocks ``tokens`` ([L] or [B, L]) at ``start`` ([B]) and run the decoder.

        ``rows`` are predicted context rows before the blocks; block b sees those marked in ``visible``
        [B, E] (all of them by default). The LM head is left to the caller (:meth:`top_rows`,
        :meth:`decoder_argmax`), which applies it only to the rows it needs."""
        tokens = tokens.reshape(-1, tokens.shape[-1])
        bsz, length = tokens.shape
        start_t = torch.as_tensor(start).reshape(-1).expand(bsz)
        a_extra = d_extra = None
        if rows is not None and len(rows):
            vis = torch.ones(bsz, len(rows), dtype=torch.bool) if visible is None else visible
            a_extra = (self.adapter.extra_context(rows.states, rows.positions, rows.adapter_inputs), vis)
            d_extra = (self.decoder.extra_context(rows.decoder_inputs, rows.positions), vis)
        pred, a_inputs = self.adapter.predict(self.adapter_cache, tokens.to(self.adapter.device), start_t, a_extra, return_layer_inputs=True)
        top = pred[..., -self.adapter.config.hidden_size :]
        hidden, dec_inputs = self.decoder.hidden(self.decoder_cache, top.to(self.decoder.head.weight.device), start_t, d_extra)
        positions = int(start_t[0]) + torch.arange(length)
        first = PredictedRows(pred[:1], [h[:1] for h in dec_inputs], positions, [h[:1] for h in a_inputs])
        return BlockScore(first, hidden, pred)

    def top_rows(self, scored: BlockScore, draft: torch.Tensor, top: int) -> TopRows:
        """The decoder's rows of the first block, sparse: full normaliser, ``top`` tokens per row."""
        return TopRows.from_logits(self.decoder.head_logits(scored.hidden[0]), draft.to(scored.hidden.device), top)

    def decoder_argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """The decoder's top token for decoder states [..., H] (no normaliser needed)."""
        return self.decoder.head_logits(hidden).max(-1).indices

    def _kv(self, rows: PredictedRows | None):
        """The drafter's keys/values of predicted rows (per layer), or None."""
        if rows is None or not len(rows):
            return None
        return self.drafter.extra_context(rows.states, rows.positions)

    # ------------------------------------------------------------------ drafting passes
    def draft_pass(self, cache: DrafterCache, tokens: torch.Tensor, start: int, fixed: int, kv):
        """One drafter pass over ``tokens`` [gamma+1] from pass anchor ``fixed`` with extra rows' keys/values
        ``kv`` (per layer, all visible) or None; returns (tokens, logits)."""
        gamma = tokens.numel() - 1
        inputs = tokens[fixed:gamma][None].to(self.drafter.device)
        extra = None if kv is None else (kv, torch.ones(1, kv[0][0].shape[2], dtype=torch.bool))
        ids, logits = self.drafter.draft_blocks(cache, inputs, torch.tensor([start + fixed]), None, extra)
        out = tokens.clone()
        out[fixed + 1 :] = ids[0].to(out.device, out.dtype)
        return out, logits[0]

    def refresh(self, tokens: torch.Tensor, start: int, fixed: int, context_rows: PredictedRows | None):
        """Context refresh (+ anchor replacement) of one block.

        The adapter re-predicts the target rows of the current draft, the decoder re-scores it, and
        the first index i > ``fixed`` whose draft token is not the decoder's top token becomes the
        new pass anchor (its token replaced by the decoder's with ``anchor_replacement``).
        ``context_rows`` are predicted rows *before* the block (a pre-drafted block's). Returns
        ``(tokens, fixed, block_rows, replaced)``; later passes read ``block_rows`` (indices < i).
        """
        gamma = tokens.numel() - 1
        scored = self.score(tokens, start, context_rows)
        i, replacement = self._first_disagreement(scored.hidden[0], tokens, fixed)
        if i is None:  # the decoder agrees with the whole draft: nothing left to redraft
            return tokens, gamma, scored.rows, False
        out = tokens.clone()
        if self.options.anchor_replacement:
            out[i] = replacement.to(out.dtype)
        return out, i, scored.rows.head(i), bool(self.options.anchor_replacement)

    def _first_disagreement(self, hidden: torch.Tensor, tokens: torch.Tensor, fixed: int):
        """``(i, token)``: the first i in fixed+1..gamma where the decoder's top token after i-1 is not
        ``tokens[i]``, and that top token (decoder rows ``fixed .. gamma-1`` only); ``(None, None)``
        when they all agree."""
        gamma = tokens.numel() - 1
        top = self.decoder_argmax(hidden[fixed:gamma]).cpu()
        i = _first_mismatch(top, tokens, fixed)
        return (None, None) if i is None else (i, top[i - 1 - fixed])

    def refine(self, cache: DrafterCache, tokens: torch.Tensor, start: int, logits: torch.Tensor, passes: int, refreshes: int,
               context_rows: PredictedRows | None = None, stats=None):
        """J Jacobi passes with a context refresh before each of the first R (Appendix D). Returns (tokens, logits).

        The drafter's keys/values of ``context_rows`` are computed once; those of a refresh's block
        rows once per refresh."""
        fixed = 0
        gamma = tokens.numel() - 1
        ctx_kv = self._kv(context_rows)
        kv = ctx_kv
        for r in range(passes):
            if r < refreshes:
                tokens, fixed, block_rows, replaced = self.refresh(tokens, start, fixed, context_rows)
                kv = _cat_kv(ctx_kv, self._kv(block_rows))
                if stats is not None:
                    stats.refreshes += 1
                    stats.anchor_replacements += int(replaced)
            if fixed >= gamma:
                break
            new, new_logits = self.draft_pass(cache, tokens, start, fixed, kv)
            logits = torch.cat([logits[:fixed], new_logits], 0)
            if torch.equal(new, tokens) and r + 1 >= refreshes:
                break
            tokens = new
        return tokens, logits

    def refine_outcomes(self, cache: DrafterCache, tokens: torch.Tensor, starts: torch.Tensor, logits: torch.Tensor, rows: PredictedRows,
                        ks: torch.Tensor, passes: int, refreshes: int):
        """:meth:`refine` of B pre-drafted blocks at once.

        Block b is ``tokens[b]`` [gamma+1] at ``starts[b]``, after the first ``ks[b] + 1`` of the
        predicted ``rows`` of the block under verification. Every refresh scores all B blocks in one
        adapter + decoder pass, and every Jacobi pass drafts all of them in one drafter pass: block b
        reads its inputs from its own pass anchor on (right-padded to a common length), the
        predicted rows it may see and its own refreshed rows. Returns (tokens [B, gamma+1], logits
        [B, gamma, V_draft])."""
        bsz, width = tokens.shape
        gamma = width - 1
        tokens, logits = tokens.clone(), logits.clone()
        fixed = torch.zeros(bsz, dtype=torch.long)
        done = torch.zeros(bsz, dtype=torch.bool)
        ctx_visible = torch.arange(len(rows))[None, :] <= ks[:, None]
        ctx_kv = self._kv(rows)
        block_states = block_positions = block_owner = own_kv = None
        for r in range(passes):
            if r < refreshes:
                scored = self.score(tokens, starts, rows, ctx_visible)
                # one LM-head pass over the rows every live block needs (fixed_b .. gamma-1), not one per block
                live = [b for b in range(bsz) if not done[b]]
                wanted = [scored.hidden[b, int(fixed[b]) : gamma] for b in live]
                tops = self.decoder_argmax(torch.cat(wanted)).cpu().split([w.shape[0] for w in wanted]) if live else []
                states, positions, owner = [], [], []
                for b, top in zip(live, tops):
                    i = _first_mismatch(top, tokens[b], int(fixed[b]))
                    if i is None:
                        fixed[b] = gamma
                        done[b] = True
                        continue
                    if self.options.anchor_replacement:
                        tokens[b, i] = top[i - 1 - int(fixed[b])].to(tokens.dtype)
                    fixed[b] = i
                    states.append(scored.pred[b : b + 1, :i])
                    positions.append(int(starts[b]) + torch.arange(i))
                    owner.append(torch.full((i,), b))
                if states:
                    block_states, block_positions, block_owner = torch.cat(states, 1), torch.cat(positions), torch.cat(owner)
                else:
                    block_states = block_positions = block_owner = None
            live = (~done).nonzero().flatten()
            if live.numel() == 0:
                break
            kv, visible = ctx_kv, ctx_visible
            if block_states is not None:
                if r < refreshes or own_kv is None:  # the refreshed rows' keys/values, once per refresh
                    own_kv = self.drafter.extra_context(block_states, block_positions)
                kv = _cat_kv(ctx_kv, own_kv)
                visible = torch.cat([ctx_visible, block_owner[None, :] == torch.arange(bsz)[:, None]], 1)
            length = gamma - int(fixed[live].min())
            inputs = torch.zeros(live.numel(), length, dtype=tokens.dtype)
            for n, b in enumerate(live.tolist()):
                f = int(fixed[b])
                inputs[n, : gamma - f] = tokens[b, f:gamma]
            extra = None if kv is None else (kv, visible[live])
            ids, new_logits = self.drafter.draft_blocks(cache, inputs.to(self.drafter.device), starts[live] + fixed[live], None, extra)
            ids = ids.cpu()
            for n, b in enumerate(live.tolist()):
                f = int(fixed[b])
                new = tokens[b].clone()
                new[f + 1 :] = ids[n, : gamma - f].to(tokens.dtype)
                logits[b, f:] = new_logits[n, : gamma - f]
                if torch.equal(new, tokens[b]) and r + 1 >= refreshes:
                    done[b] = True
                tokens[b] = new
        return tokens, logits

    # ------------------------------------------------------------------ foresight round
    def predraft(self, cache: DrafterCache, tokens: torch.Tensor, start: int, draft_logits: torch.Tensor, noise_source: torch.Tensor,
                 record: bool = False) -> tuple[SpeculationCache, ForesightRecord | None]:
        """Score the block under verification, select outcomes and pre-draft a block for each.

        ``tokens`` = ``[y0, d_1 .. d_gamma]`` at ``start``; ``draft_logits`` [gamma, V_draft] are the
        drafter's logits of its final pass (features, draft-model rule); J0 noise of the pre-drafted
        blocks is drawn from ``noise_source`` (the verified tokens).
        """
        budget_gamma = self.options.budget - 1
        scored = self.score(tokens, start)
        draft = tokens[1:]
        width = max(self.options.cache_size, self.calibration.top_candidates if self.calibration is not None else 0) + 1
        rows = self.top_rows(scored, draft, max(width, RECORD_TOP) if record else width)
        dprobs = torch.softmax(draft_logits.float(), -1)
        draft_top1 = dprobs.max(-1).values
        p_hat, is_top, alt = decoder_position_stats(rows, draft)
        scale = self.calibration.position_scale if self.calibration is not None else 14.0
        feats = position_features(draft_top1.to(p_hat.device), p_hat, is_top, alt, scale)
        if self.calibration is not None:
            picked = self.calibration.select(feats, rows, draft, self.options.cache_size, self.options.conformal)
        else:
            picked = top_outcomes(rows, draft, self.options.cache_size)
        spec = SpeculationCache()
        if picked:
            ks = torch.tensor([k for k, _ in picked])
            anchors = torch.tensor([a for _, a in picked])
            blocks, logits = self._draft_outcomes(cache, scored.rows, ks, anchors, start, budget_gamma, noise_source)
            for b, (k, a) in enumerate(picked):
                spec.put(CachedBlock(k=k, anchor=a, tokens=blocks[b], logits=logits[b]))
        rec = None
        if record:
            rec = self._record(draft, dprobs, draft_top1, rows, feats, picked)
            rec.draft_row_tokens = self._to_target_ids(rec.draft_row_tokens)
        return spec, rec

    def _draft_outcomes(self, cache, rows: PredictedRows, ks, anchors, start: int, gamma: int, noise_source: torch.Tensor) -> torch.Tensor:
        """Draft blocks [B, gamma] for outcomes (k_b, a_b): anchor a_b at index k_b + 1 of the verified block."""
        bsz = ks.numel()
        e = len(rows)
        visible = torch.arange(e)[None, :] <= ks[:, None]  # rows of y0, d_1 .. d_k
        extra = (self._kv(rows), visible)
        starts = start + ks + 1
        g = torch.Generator().manual_seed(int(self.options.seed) + start)
        src = noise_source.reshape(-1).cpu()
        noise = src[torch.randint(0, src.numel(), (bsz, gamma - 1), generator=g)]
        inputs = torch.cat([anchors[:, None], noise], 1)
        ids, logits = self.drafter.draft_blocks(cache, inputs.to(self.drafter.device), starts, None, extra)
        if self.options.num_context_refreshes > 0:  # refreshes move each block's pass anchor: the batched refine
            tokens = torch.cat([anchors[:, None], ids.cpu()], 1)
            tokens, logits = self.refine_outcomes(cache, tokens, starts, logits, rows, ks, self.options.num_jacobi_passes,
                                                  self.options.num_context_refreshes)
            return tokens[:, 1:], logits
        for _ in range(self.options.num_jacobi_passes):
            inputs = torch.cat([anchors[:, None].to(ids.device), ids[:, :-1]], 1)
            new, logits = self.drafter.draft_blocks(cache, inputs, starts, None, extra)
            if torch.equal(new, ids):
                break
            ids = new
        return ids.cpu(), logits

    def _to_target_ids(self, rows: list[list[int]]) -> list[list[int]]:
        if self._draft_vocab is None:
            return rows
        return [self._draft_vocab[torch.tensor(r, dtype=torch.long)].tolist() for r in rows]

    def _record(self, draft, dprobs, draft_top1, rows: TopRows, feats, picked) -> ForesightRecord:
        idx = draft.cpu().long() if self._draft_index is None else self._draft_index[draft.cpu().long()]
        own = torch.where(idx >= 0, dprobs.cpu().gather(-1, idx.clamp(min=0)[:, None]).squeeze(-1), torch.zeros(()))
        dv, di = torch.topk(dprobs, min(RECORD_TOP, dprobs.shape[-1]), -1)
        return ForesightRecord(
            draft=draft.tolist(),
            draft_top1=draft_top1.tolist(),
            draft_own_prob=own.tolist(),
            draft_row_tokens=di.tolist(),
            draft_row_probs=dv.tolist(),
            p_hat=rows.draft_probs.tolist(),
            decoder_row_tokens=rows.ids[:, :RECORD_TOP].tolist(),
            decoder_row_probs=rows.probs[:, :RECORD_TOP].tolist(),
            features=feats.tolist(),
            selected=list(picked),
        )


def _first_mismatch(top: torch.Tensor, tokens: torch.Tensor, fixed: int) -> int | None:
    """First i > ``fixed`` with ``top[i - 1 - fixed] != tokens[i]`` (``top``: the decoder's top tokens
    after indices fixed .. gamma-1), or None when they all agree."""
    diff = (top != tokens[fixed + 1 :].cpu()).nonzero()
    return None if diff.numel() == 0 else fixed + 1 + int(diff[0, 0])


def _cat_kv(a, b):
    """Per-layer keys/values of two sets of extra rows, one after the other (either may be None)."""
    if a is None or b is None:
        return a if b is None else b
    return [(torch.cat([ka, kb], 2), torch.cat([va, vb], 2)) for (ka, va), (kb, vb) in zip(a, b)]
