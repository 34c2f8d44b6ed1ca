"""Jacobi self-refinement of a block draft (seed 000, Section 3.2 and Eq. 8).

Conventions used throughout the package. A round drafts ``gamma`` tokens after the anchor ``y0``
(the latest verified token). The drafter reads a block of ``gamma`` input tokens
``[y0, z_1, ..., z_{gamma-1}]`` at positions ``n .. n+gamma-1`` and its output at block index i
predicts the token at index i+1, so position i reads ``y_{<=i}`` under causal attention:

    J0:          inputs = [y0, noise_1 .. noise_{gamma-1}]   (noise drawn from the verified context)
    pass r + 1:  inputs = [y0, d^(r)_1 .. d^(r)_{gamma-1}],   d^(r+1) = argmax q(. | h_x, inputs)

The first draft token is exact in every pass, the first two after one pass, and so on: after
``gamma - 1`` passes a causal drafter reproduces its own autoregressive greedy draft, the fixed
point of the iteration. Once a pass returns its own inputs, further passes cannot change the draft.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def sample_noise_tokens(context_ids: torch.Tensor, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Noise tokens for the initial draft: ``count`` tokens drawn uniformly from ``context_ids`` (1-D)."""
    if count <= 0:
        return context_ids.new_empty(0)
    if context_ids.numel() == 0:
        raise ValueError("cannot draw noise tokens from an empty context")
    device = generator.device if generator is not None else context_ids.device
    idx = torch.randint(0, context_ids.numel(), (count,), generator=generator, device=device)
    return context_ids[idx.to(context_ids.device)]


def initial_block_inputs(anchor: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """J0 block inputs: the anchor (shape [1]) followed by the noise tokens."""
    return torch.cat([anchor.reshape(1), noise.reshape(-1)])


def refined_block_inputs(anchor: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """Inputs of the next Jacobi pass: the anchor followed by all but the last draft token."""
    return torch.cat([anchor.reshape(1), draft.reshape(-1)[:-1]])


def jacobi_refine(
    draft_fn: Callable[[torch.Tensor], torch.Tensor],
    anchor: torch.Tensor,
    draft: torch.Tensor,
    num_passes: int,
) -> tuple[torch.Tensor, int]:
    """Run up to ``num_passes`` Jacobi passes on ``draft`` and return ``(draft, passes_run)``.

    ``draft_fn`` maps block inputs (1-D, length gamma) to a draft (1-D, length gamma). Stops early at
    a fixed point, which saves forwards without changing the result.
    """
    passes = 0
    for _ in range(num_passes):
        inputs = refined_block_inputs(anchor, draft)
        new = draft_fn(inputs)
        passes += 1
        if torch.equal(new, draft):
            break
        draft = new
    return draft, passes
