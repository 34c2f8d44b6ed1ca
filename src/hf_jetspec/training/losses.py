"""Training losses: divergences between the target's and the drafter's next-token distributions, and the
foresight adapter's state-prediction loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

DIVERGENCES = ("forward_kl", "reverse_kl", "cross_entropy")
MISSING_LOGIT = -1.0e4  # logit of tokens outside a stored top-k (probability exactly 0 in float32)


@dataclass
class TopKLabels:
    """The target's distribution at each position as its top-k tokens: ``ids`` [..., k] (in the drafter's
    vocabulary) and ``logprobs`` [..., k], renormalised over the k at use; an entry at ``MISSING_LOGIT``
    has probability 0 (a token outside the draft vocabulary, or padding).

    :meth:`dense` gives the same labels as ``[..., V]`` logits (``MISSING_LOGIT`` off the k; where an id
    repeats, the largest value is kept, so entries at ``MISSING_LOGIT`` are harmless); the forward KL
    reads them without building that tensor: the drafter's log-probabilities at k ids and one
    log-sum-exp per position.
    """

    ids: torch.Tensor
    logprobs: torch.Tensor

    def __getitem__(self, index) -> TopKLabels:
        return TopKLabels(self.ids[index], self.logprobs[index])

    def to(self, device) -> TopKLabels:
        return TopKLabels(self.ids.to(device), self.logprobs.to(device))

    def dense(self, vocab_size: int) -> torch.Tensor:
        out = torch.full((*self.ids.shape[:-1], vocab_size), MISSING_LOGIT, dtype=torch.float32, device=self.ids.device)
        return out.scatter_reduce_(-1, self.ids.long(), self.logprobs.float(), reduce="amax")


def label_known(labels: torch.Tensor | TopKLabels) -> torch.Tensor:
    """Whether each position's label has any token with probability above 0 (dense logits or top-k)."""
    values = labels.logprobs if isinstance(labels, TopKLabels) else labels
    return values.max(-1).values > MISSING_LOGIT / 2


def label_argmax(labels: torch.Tensor | TopKLabels) -> torch.Tensor:
    """The label's most probable token at each position."""
    if isinstance(labels, TopKLabels):
        return labels.ids.gather(-1, labels.logprobs.argmax(-1, keepdim=True)).squeeze(-1).long()
    return labels.argmax(-1)


def topk_divergence(labels: TopKLabels, draft_logits: torch.Tensor, kind: str = "forward_kl") -> torch.Tensor:
    """:func:`divergence` against top-k labels without a dense ``[..., V]`` label tensor.

    ``forward_kl``: ``sum_i p_i (log p_i - z_{id_i} + logsumexp(z))`` over the k entries (``p`` the
    softmax of the k log-probabilities); ``cross_entropy``: ``logsumexp(z) - z_{argmax p}``.
    ``reverse_kl`` needs ``p`` at every token, so it takes the dense path.
    """
    if kind == "reverse_kl":
        return divergence(labels.dense(draft_logits.shape[-1]).to(draft_logits.device), draft_logits, kind)
    z = draft_logits.float()
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    if kind == "cross_entropy":
        return (lse - z.gather(-1, label_argmax(labels)[..., None])).squeeze(-1)
    if kind != "forward_kl":
        raise ValueError(f"unknown divergence {kind!r}; choose one of {DIVERGENCES}")
    logq = z.gather(-1, labels.ids.long()) - lse
    logp = F.log_softmax(labels.logprobs.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1)


def divergence(target_logits: torch.Tensor | TopKLabels, draft_logits: torch.Tensor, kind: str = "forward_kl") -> torch.Tensor:
    """Per-position divergence ``D(p_target || q_draft)`` over the last dim (no reduction).

    ``forward_kl``: KL(p || q), the seed's default. ``reverse_kl``: KL(q || p). ``cross_entropy``:
    -log q(argmax p), SFT on the target's greedy token. ``target_logits`` may be
    :class:`TopKLabels` (see :func:`topk_divergence`).
    """
    if isinstance(target_logits, TopKLabels):
        return topk_divergence(target_logits, draft_logits, kind)
    logq = F.log_softmax(draft_logits.float(), dim=-1)
    if kind == "cross_entropy":
        return -logq.gather(-1, target_logits.argmax(-1, keepdim=True)).squeeze(-1)
    logp = F.log_softmax(target_logits.float(), dim=-1)
    if kind == "forward_kl":
        return (logp.exp() * (logp - logq)).sum(-1)
    if kind == "reverse_kl":
        return (logq.exp() * (logq - logp)).sum(-1)
    raise ValueError(f"unknown divergence {kind!r}; choose one of {DIVERGENCES}")


def state_prediction_loss(pred: torch.Tensor, true: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Smooth L1 plus cosine distance between predicted and true states (Appendix A), per row mean."""
    per_row = F.smooth_l1_loss(pred.float(), true.float(), reduction="none").mean(-1) + (1 - F.cosine_similarity(pred.float(), true.float(), dim=-1))
    if weight is None:
        return per_row.mean()
    return (per_row * weight).sum() / weight.sum().clamp(min=1e-8)


def gap_recovered(pred: torch.Tensor, true: torch.Tensor, copy: torch.Tensor) -> float:
    """Share of the gap between copying the last verified state and the true states that ``pred`` closes.

    ``1 - ||pred - true||^2 / ||copy - true||^2`` (squared errors summed over all rows): 1 means the
    true states, 0 means no better than the copy baseline.
    """
    err_pred = (pred.float() - true.float()).pow(2).sum()
    err_copy = (copy.float() - true.float()).pow(2).sum()
    return float(1 - err_pred / err_copy.clamp(min=1e-12))
