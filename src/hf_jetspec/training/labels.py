"""Label and weight rules of seed 003 (erase, ALR, IRA) as pure functions."""

from __future__ import annotations

import torch


def survival_gate(corpus_token_probs: torch.Tensor) -> torch.Tensor:
    """Erase baseline gate ``g_k = prod_{1<=j<k} p_T(x_{a+j} | x_{<a+j})`` for slots k = 1..K.

    ``corpus_token_probs[..., j-1]`` is the target's probability of the corpus token at slot j.
    The gate is 1 at slot 1 and decreases along the block.
    """
    ones = torch.ones_like(corpus_token_probs[..., :1])
    return torch.cumprod(torch.cat([ones, corpus_token_probs[..., :-1]], dim=-1), dim=-1)
