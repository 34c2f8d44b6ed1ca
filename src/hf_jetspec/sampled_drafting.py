"""Drafts sampled from the drafter's own distribution, for exact speculative sampling.

Under greedy decoding a draft is the drafter's argmax and verification keeps it while it equals the
target's argmax. Under sampling an argmax draft is a point mass ``q = delta_d``: the target accepts
``d`` with its own probability ``p(d)``, often 0.4-0.8 at temperature 0.7, so long accepted runs are
rare. Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) instead draws each draft token
from a proposal ``q`` and accepts it with probability ``min(1, p(x) / q(x))``, committing a draw of
the residual ``norm(max(p - q, 0))`` at the first rejection. A token is then accepted with
probability ``sum_x min(p(x), q(x)) = 1 - TV(p, q)``, which for a calibrated drafter is well above
``p(argmax)`` wherever the target is uncertain.

**When it is exact.** Position ``i``'s committed token follows the target's law when, given
everything before it, its draft ``x_i`` was drawn from the very ``q_i`` that verification uses, and
both ``q_i`` and the decision to verify position ``i`` were fixed before ``x_i`` was drawn, from
inputs that hold neither ``x_i`` nor any later draft token. Here:

- the Jacobi passes (J0 and ``num_jacobi_passes`` refinements) run on argmax tokens exactly as
  under greedy decoding; the final pass's distributions ``q_1 .. q_gamma`` come from inputs of
  argmax tokens, noise and the n-gram seed only, never from a sampled token;
- the round policy chooses the source and the verify length from that pass's numbers (top-1
  probabilities, agreement), before any draw;
- only then is the block drawn, every ``x_i ~ q_i`` in one go, with the global random stream (the one
  the user seeds and transformers verifies with), never with a fixed-seed generator: a seeded draw
  would be the same every call, a point mass that ``min(1, p/q)`` would misjudge.

This holds for causal and bidirectional drafters alike, for J0-only drafting and any number of
passes, for the foresight engine's pre-drafted blocks (their logits come from a pass over argmax
tokens), and for tree rounds (:mod:`hf_jetspec.tree`, multi-draft rejection). Refining a block
*after* drawing it and verifying with the refined ``q`` would not be exact, and nothing here does it.
n-gram proposals stay point masses (``q = delta_d``): they are verified by exact match, which is
the same rule.

**How q is shaped.** Any ``q`` is exact as long as the draft is drawn from it; a ``q`` shaped like
the target's processed ``p`` accepts more. The drafter's logits (its draft vocabulary placed in the
target's vocabulary, ``-inf`` elsewhere), scaled by ``DraftingConfig.proposal_sharpness`` (a drafter
trained on other text is flatter than its target; ``benchmarks/proposal_shape.py`` measures the
acceptance of each sharpness exactly), go through the same logits processors as the target's
(temperature, top-k, top-p, repetition penalty, ...), all rows in one batched call with the
verified sequence as their input ids. Processors that read input ids therefore see the sequence
before the block, not the draft tokens before each position: a slightly different ``q``, still exact.
"""

from __future__ import annotations

import torch


def full_vocab_logits(logits: torch.Tensor, draft_vocab: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits [..., V_draft] -> float32 logits over the target's vocabulary [..., V],
    ``-inf`` at ids outside the draft vocabulary (``draft_vocab``: the target id of each draft row;
    None: the draft vocabulary is the target's)."""
    logits = logits.float()
    if draft_vocab is None:
        if logits.shape[-1] != vocab_size:
            raise ValueError(f"draft logits have {logits.shape[-1]} columns, the target's vocabulary {vocab_size}")
        return logits
    out = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    out[..., draft_vocab.to(logits.device)] = logits
    return out


def proposal_logits(logits: torch.Tensor, prefix_ids: torch.Tensor, logits_processor=None, sharpness: float = 1.0) -> torch.Tensor:
    """The proposal ``q`` of each row of ``logits`` [g, V] as logits: scaled by ``sharpness`` (1: the
    drafter's own distribution; larger: sharper, towards its argmax), then through the target's
    logits processors applied in one batched call with ``prefix_ids`` [1, T] as every row's input ids."""
    if sharpness != 1.0:
        logits = logits * sharpness
    if logits_processor is None or len(logits_processor) == 0:
        return logits
    rows = logits.shape[0]
    return logits_processor(prefix_ids.expand(rows, -1), logits.clone())


def usable_rows(q_logits: torch.Tensor) -> int:
    """Leading rows of ``q_logits`` [g, V] that define a distribution (some finite entry). A row that
    the processors emptied (every allowed id outside the draft vocabulary) ends the draft there."""
    ok = torch.isfinite(q_logits).any(-1)
    bad = (~ok).nonzero()
    return int(bad[0]) if bad.numel() else q_logits.shape[0]


def sample_block(q_logits: torch.Tensor) -> torch.Tensor:
    """One draw ``x_i ~ softmax(q_logits[i])`` per row [g], from the global random stream."""
    if q_logits.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=q_logits.device)
    return torch.multinomial(torch.softmax(q_logits.float(), dim=-1), 1).squeeze(-1)


def top1_probs(q_logits: torch.Tensor) -> torch.Tensor:
    """Top-1 probability of each row's proposal [g] (the policy's feature under sampling)."""
    return torch.softmax(q_logits.float(), dim=-1).amax(-1)
