"""The likelihood of realised accepted lengths under per-position acceptance probabilities, and the
logistic fit of feature weights that maximises it (the round policy's and foresight's calibrations)."""

from __future__ import annotations

import torch


def length_log_likelihood(accept_probs: torch.Tensor, realized_k: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Sum over rounds of ``log P_tilde(k*)``; ``accept_probs`` [R, gamma], ``realized_k`` [R].

    ``valid`` [R, gamma] marks real positions (rounds with a shorter draft are padded).
    """
    gamma = accept_probs.shape[-1]
    j = torch.arange(1, gamma + 1, device=accept_probs.device)[None]
    k = realized_k[:, None]
    accepted = j <= k
    rejected = j == k + 1
    if valid is not None:
        accepted, rejected = accepted & valid, rejected & valid
    p = accept_probs.clamp(1e-7, 1 - 1e-7)
    return (torch.log(p) * accepted).sum() + (torch.log1p(-p) * rejected).sum()


def fit_feature_weights(features: torch.Tensor, realized_k: torch.Tensor, valid: torch.Tensor | None = None, l2: float = 1e-3, steps: int = 200) -> list[float]:
    """Maximum-likelihood ``w`` of the realised accepted lengths (a logistic regression, LBFGS)."""
    w = torch.zeros(features.shape[-1], dtype=torch.float64, requires_grad=True)
    x = features.double()
    opt = torch.optim.LBFGS([w], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = -length_log_likelihood(torch.sigmoid(x @ w), realized_k, valid) / max(1, realized_k.numel()) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return [float(v) for v in w.detach()]
