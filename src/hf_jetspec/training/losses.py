"""Divergences between the target's and the drafter's next-token distributions."""

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
