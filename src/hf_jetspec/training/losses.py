"""Training losses: divergences between the target's and the drafter's next-token distributions, and the
foresight adapter's state-prediction loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

DIVERGENCES = ("forward_kl", "reverse_kl", "cross_entropy")


def divergence(target_logits: torch.Tensor, draft_logits: torch.Tensor, kind: str = "forward_kl") -> torch.Tensor:
    """Per-position divergence ``D(p_target || q_draft)`` over the last dim (no reduction).

    ``forward_kl``: KL(p || q), the seed's default. ``reverse_kl``: KL(q || p). ``cross_entropy``:
    -log q(argmax p), SFT on the target's greedy token.
    """
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
