"""Foresight drafting rounds: scoring, outcome selection, batched pre-drafting, refresh and replacement.

Everything here only changes *proposals*. Every committed token still goes through exact-match
verification in ``generate``, so the output does not depend on anything computed here (seed 000,
Appendix F.3).

Block layout (shared with :mod:`hf_jetspec.jacobi`): a block is its anchor ``t_0`` at position
``start`` followed by ``gamma`` draft tokens. A drafter pass reads inputs ``[t_f, .., t_{gamma-1}]``
from the *pass anchor* ``t_f`` and rewrites ``t_{f+1} .. t_gamma``; rows of predicted target states
(:class:`PredictedRows`) for positions before the pass anchor that the target has not verified
yet stand in for true context rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..drafter_cache import DrafterCache
from .cache import CachedBlock, SpeculationCache
from .calibration import ForesightCalibration, decoder_position_stats, position_features
from .outcomes import outcome_scores, select_top_outcomes

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

    def cat(self, other: "PredictedRows | None") -> "PredictedRows":
        if other is None or len(other) == 0:
            return self
        return PredictedRows(
            torch.cat([self.states, other.states], 1),
            [torch.cat([a, b], 1) for a, b in zip(self.decoder_inputs, other.decoder_inputs)],
            torch.cat([self.positions, other.positions]),
            [torch.cat([a, b], 1) for a, b in zip(self.adapter_inputs, other.adapter_inputs)],
        )


@dataclass
class BlockScore:
    """Adapter + decoder view of a block ``[t_0 .. t_gamma]``: predicted rows and decoder probabilities."""

    rows: PredictedRows  # gamma + 1 rows
    probs: torch.Tensor  # [gamma + 1, V] decoder estimate of the target's next-token law after each index


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
    def score(self, tokens: torch.Tensor, start: int, rows: PredictedRows | None = None) -> BlockScore:
        """Predict the target rows of block ``tokens`` [L] at ``start`` and the decoder's estimates."""
        start_t = torch.tensor([start])
        a_extra = d_extra = None
        if rows is not None and len(rows):
            vis = torch.ones(1, len(rows), dtype=torch.bool)
            a_extra = (self.adapter.extra_context(rows.states, rows.positions, rows.adapter_inputs), vis)
            d_extra = (self.decoder.extra_context(rows.decoder_inputs, rows.positions), vis)
        pred, a_inputs = self.adapter.predict(self.adapter_cache, tokens[None].to(self.adapter.device), start_t, a_extra, return_layer_inputs=True)
        top = pred[..., -self.adapter.config.hidden_size :]
        logits, dec_inputs = self.decoder.logits(self.decoder_cache, top.to(self.decoder.head.weight.device), start_t, d_extra, return_layer_inputs=True)
        positions = torch.arange(start, start + tokens.numel())
        return BlockScore(PredictedRows(pred, dec_inputs, positions, a_inputs), torch.softmax(logits[0].float(), -1))

    # ------------------------------------------------------------------ drafting passes
    def draft_pass(self, cache: DrafterCache, tokens: torch.Tensor, start: int, fixed: int, rows: PredictedRows | None):
        """One drafter pass over ``tokens`` [gamma+1] from pass anchor ``fixed``; returns (tokens, logits)."""
        gamma = tokens.numel() - 1
        inputs = tokens[fixed:gamma][None].to(self.drafter.device)
        extra = None
        if rows is not None and len(rows):
            extra = (self.drafter.extra_context(rows.states, rows.positions), torch.ones(1, len(rows), dtype=torch.bool))
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
        top = scored.probs.argmax(-1)
        i = next((j for j in range(fixed + 1, gamma + 1) if int(top[j - 1]) != int(tokens[j])), None)
        if i is None:  # the decoder agrees with the whole draft: nothing left to redraft
            return tokens, gamma, scored.rows, False
        out = tokens.clone()
        if self.options.anchor_replacement:
            out[i] = top[i - 1].to(out.dtype)
        return out, i, scored.rows.head(i), bool(self.options.anchor_replacement)

    def refine(self, cache: DrafterCache, tokens: torch.Tensor, start: int, logits: torch.Tensor, passes: int, refreshes: int,
               context_rows: PredictedRows | None = None, stats=None):
        """J Jacobi passes with a context refresh before each of the first R (Appendix D). Returns (tokens, logits)."""
        fixed = 0
        gamma = tokens.numel() - 1
        block_rows = None
        for r in range(passes):
            if r < refreshes:
                tokens, fixed, block_rows, replaced = self.refresh(tokens, start, fixed, context_rows)
                if stats is not None:
                    stats.refreshes += 1
                    stats.anchor_replacements += int(replaced)
            if fixed >= gamma:
                break
            rows = block_rows if context_rows is None else context_rows.cat(block_rows)
            new, new_logits = self.draft_pass(cache, tokens, start, fixed, rows)
            logits = torch.cat([logits[:fixed], new_logits], 0)
            if torch.equal(new, tokens) and r + 1 >= refreshes:
                break
            tokens = new
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
        dprobs = torch.softmax(draft_logits.float(), -1)
        draft_top1 = dprobs.max(-1).values
        p_hat, is_top, alt = decoder_position_stats(scored.probs, draft.to(scored.probs.device))
        scale = self.calibration.position_scale if self.calibration is not None else 14.0
        feats = position_features(draft_top1.to(p_hat.device), p_hat, is_top, alt, scale)
        if self.calibration is not None:
            picked = self.calibration.select(feats, scored.probs, draft, self.options.cache_size, self.options.conformal)
        else:
            picked = select_top_outcomes(outcome_scores(scored.probs, draft.to(scored.probs.device)), self.options.cache_size)
        spec = SpeculationCache()
        if picked:
            ks = torch.tensor([k for k, _ in picked])
            anchors = torch.tensor([a for _, a in picked])
            blocks, logits = self._draft_outcomes(cache, scored.rows, ks, anchors, start, budget_gamma, noise_source)
            for b, (k, a) in enumerate(picked):
                spec.put(CachedBlock(k=k, anchor=a, tokens=blocks[b], logits=logits[b]))
        rec = None
        if record:
            rec = self._record(draft, dprobs, draft_top1, p_hat, scored.probs, feats, picked)
            rec.draft_row_tokens = self._to_target_ids(rec.draft_row_tokens)
        return spec, rec

    def _draft_outcomes(self, cache, rows: PredictedRows, ks, anchors, start: int, gamma: int, noise_source: torch.Tensor) -> torch.Tensor:
        """Draft blocks [B, gamma] for outcomes (k_b, a_b): anchor a_b at index k_b + 1 of the verified block."""
        bsz = ks.numel()
        e = len(rows)
        visible = torch.arange(e)[None, :] <= ks[:, None]  # rows of y0, d_1 .. d_k
        extra = (self.drafter.extra_context(rows.states, rows.positions), visible)
        starts = start + ks + 1
        g = torch.Generator().manual_seed(int(self.options.seed) + start)
        src = noise_source.reshape(-1).cpu()
        noise = src[torch.randint(0, src.numel(), (bsz, gamma - 1), generator=g)]
        inputs = torch.cat([anchors[:, None], noise], 1)
        ids, logits = self.drafter.draft_blocks(cache, inputs.to(self.drafter.device), starts, None, extra)
        if self.options.num_context_refreshes > 0:  # refreshes differ per block: refine one by one
            out_ids, out_logits = [], []
            for b in range(bsz):
                tokens = torch.cat([anchors[b : b + 1], ids[b].cpu()])
                tokens, lg = self.refine(cache, tokens, int(starts[b]), logits[b], self.options.num_jacobi_passes,
                                         self.options.num_context_refreshes, context_rows=rows.head(int(ks[b]) + 1))
                out_ids.append(tokens[1:])
                out_logits.append(lg)
            return torch.stack(out_ids), torch.stack(out_logits)
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

    def _record(self, draft, dprobs, draft_top1, p_hat, probs, feats, picked) -> ForesightRecord:
        idx = draft.cpu().long() if self._draft_index is None else self._draft_index[draft.cpu().long()]
        own = torch.where(idx >= 0, dprobs.cpu().gather(-1, idx.clamp(min=0)[:, None]).squeeze(-1), torch.zeros(()))
        dv, di = torch.topk(dprobs, min(RECORD_TOP, dprobs.shape[-1]), -1)
        pv, pi = torch.topk(probs, min(RECORD_TOP, probs.shape[-1]), -1)
        return ForesightRecord(
            draft=draft.tolist(),
            draft_top1=draft_top1.tolist(),
            draft_own_prob=own.tolist(),
            draft_row_tokens=di.tolist(),
            draft_row_probs=dv.tolist(),
            p_hat=p_hat.tolist(),
            decoder_row_tokens=pi.tolist(),
            decoder_row_probs=pv.tolist(),
            features=feats.tolist(),
            selected=list(picked),
        )
