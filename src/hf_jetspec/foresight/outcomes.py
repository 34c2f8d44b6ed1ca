"""Verification outcomes and their scores (seed 000, Section 4.2, Eq. 6-7 and Appendix F.1).

A round verifies a block ``[y0, d_1 .. d_gamma]``. Its outcome is ``(k, a)``: verification accepted
the first k draft tokens and committed the bonus token a (a != d_{k+1} when k < gamma). The decoder
gives, for every block index j = 0..gamma, an estimate ``p_hat(. | j)`` of the target's next-token
distribution after the prefix up to j; ``p_hat_j = p_hat(d_j | j - 1)``. Then

    P(k)    = prod_{j<=k} p_hat_j * (1 - p_hat_{k+1})         (k < gamma),   P(gamma) = prod_j p_hat_j
    P(k, a) = prod_{j<=k} p_hat_j * p_hat(a | k)               (a != d_{k+1}), P(gamma, a) = P(gamma) p_hat(a | gamma)

With a perfect decoder (p_hat = the target at the sampling temperature) P(k, a) is exactly the law
of the outcome under exact-match verification of a fixed draft (Proposition 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import log_normaliser


def draft_token_probs(bonus_probs: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """``p_hat_j = p_hat(d_j | j-1)`` for j = 1..gamma, from rows ``bonus_probs`` [gamma+1, V]."""
    gamma = draft.shape[-1]
    if bonus_probs.shape[-2] != gamma + 1:
        raise ValueError(f"need gamma + 1 = {gamma + 1} decoder rows, got {bonus_probs.shape[-2]}")
    return bonus_probs[..., :gamma, :].gather(-1, draft[..., None].long()).squeeze(-1)


def accepted_prefix_probs(p_hat: torch.Tensor) -> torch.Tensor:
    """``G(k) = prod_{j<=k} p_hat_j`` for k = 0..gamma (G(0) = 1); shape [..., gamma+1]."""
    ones = torch.ones_like(p_hat[..., :1])
    return torch.cat([ones, torch.cumprod(p_hat, dim=-1)], dim=-1)


def length_probs(p_hat: torch.Tensor) -> torch.Tensor:
    """``P(k)``, the probability that verification accepts exactly k draft tokens, k = 0..gamma."""
    g = accepted_prefix_probs(p_hat)
    stop = torch.cat([1 - p_hat, torch.ones_like(p_hat[..., :1])], dim=-1)
    return g * stop


def outcome_scores(bonus_probs: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """``P(k, a)`` of every outcome as a [gamma+1, V] table (Eq. 6).

    Row k holds ``G(k) * p_hat(a | k)`` with the entry of ``d_{k+1}`` zeroed for k < gamma (that
    token would have been accepted, so it is not a bonus at k). Rows sum to ``P(k)``.
    """
    gamma = draft.shape[-1]
    g = accepted_prefix_probs(draft_token_probs(bonus_probs, draft))
    scores = bonus_probs * g[..., None]
    rows = torch.arange(gamma, device=draft.device)
    scores = scores.clone()
    scores[..., rows, draft.long()] = 0.0
    return scores


def select_top_outcomes(scores: torch.Tensor, cache_size: int) -> list[tuple[int, int]]:
    """The ``cache_size`` highest-scoring outcomes ``(k, a)`` of a [gamma+1, V] score table (Eq. 7).

    Ties are broken towards smaller k, then smaller token id; outcomes of score 0 are never
    selected (they cannot happen), so fewer than ``cache_size`` may come back.
    """
    if cache_size < 1:
        raise ValueError("cache_size must be >= 1")
    flat = scores.reshape(-1)
    n = min(cache_size, int((flat > 0).sum()))
    if n == 0:
        return []
    # stable sort on -score keeps row-major order (smaller k, then smaller a) among ties
    order = torch.sort(-flat, stable=True).indices[:n]
    vocab = scores.shape[-1]
    return [(int(i) // vocab, int(i) % vocab) for i in order]



def rank_outcomes(scored: list[tuple[float, int, int]], cache_size: int, threshold: float | None = None) -> list[tuple[int, int]]:
    """The ``cache_size`` best of scored outcomes ``(score, k, a)``: highest score first, ties to smaller k,
    then smaller token id; with ``threshold``, only outcomes scoring at least that (the conformal set)."""
    ranked = sorted(scored, key=lambda s: (-s[0], s[1], s[2]))
    if threshold is not None:
        ranked = [s for s in ranked if s[0] >= threshold]
    return [(k, a) for _, k, a in ranked[:cache_size]]


@dataclass
class TopRows:
    """The decoder's rows ``p_hat(. | j)``, j = 0..gamma, kept sparse.

    ``ids`` / ``probs`` [gamma+1, K]: each row's K most likely tokens, most likely first, with their
    probabilities under the full-vocabulary normaliser; ``draft_probs`` [gamma]: ``p_hat_j`` of the
    draft tokens (which need not be among the top K). Everything the outcome rules read comes from
    here: ``P(k, a)`` for the K best anchors of every row, the features, the refresh's argmax.
    """

    ids: torch.Tensor
    probs: torch.Tensor
    draft_probs: torch.Tensor

    @classmethod
    def from_logits(cls, logits: torch.Tensor, draft: torch.Tensor, top: int) -> "TopRows":
        """From decoder logits [gamma+1, V] (any float dtype) and the draft [gamma]."""
        norm = log_normaliser(logits)
        vals, ids = torch.topk(logits, min(top, logits.shape[-1]), dim=-1)
        gamma = draft.shape[-1]
        own = logits[:gamma].gather(-1, draft.to(logits.device)[:, None].long()).squeeze(-1)
        return cls(ids, torch.exp(vals.float() - norm[:, None]), torch.exp(own.float() - norm[:gamma]))

    @classmethod
    def from_probs(cls, probs: torch.Tensor, draft: torch.Tensor, top: int | None = None) -> "TopRows":
        """From dense probability rows [gamma+1, V] (the reference form used by the tests)."""
        vals, ids = torch.topk(probs.float(), min(top or probs.shape[-1], probs.shape[-1]), dim=-1)
        return cls(ids, vals, draft_token_probs(probs.float(), draft))

    @property
    def argmax(self) -> torch.Tensor:
        """Each row's most likely token [gamma+1]."""
        return self.ids[:, 0]


def top_outcomes(rows: TopRows, draft: torch.Tensor, cache_size: int) -> list[tuple[int, int]]:
    """:func:`select_top_outcomes` of Eq. 6 from sparse rows: the same picks whenever each row keeps at
    least ``cache_size + 1`` tokens (a row's best ``cache_size`` anchors other than ``d_{k+1}``)."""
    if cache_size < 1:
        raise ValueError("cache_size must be >= 1")
    gamma = draft.shape[-1]
    g = accepted_prefix_probs(rows.draft_probs.to(rows.probs.device))
    scores = rows.probs * g[:, None]
    excluded = torch.zeros_like(rows.ids, dtype=torch.bool)
    excluded[:gamma] = rows.ids[:gamma] == draft.to(rows.ids.device)[:, None]
    scores = scores.masked_fill(excluded, 0.0)
    scored = [(s, k, a) for k, (srow, arow) in enumerate(zip(scores.tolist(), rows.ids.tolist())) for s, a in zip(srow, arow) if s > 0]
    return rank_outcomes(scored, cache_size)
