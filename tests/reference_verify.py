"""Exact-match verification of a fixed draft (seed 000, Appendix F.3).

Inside ``generate`` the verification itself is transformers' assisted-decoding loop: when the
candidate generator returns no proposal logits, it draws ``v_i ~ p_i`` at every position (argmax
under greedy) and keeps the draft up to the first ``v_i != d_i``, committing ``v_i`` there. That is
precisely the point-mass proposal ``q_i = delta_{d_i}`` of Appendix F.3: each draft token is
accepted with the target's own probability of it, so every committed token is the target's draw.
The functions here are the reference form of that rule, which the exactness tests check the
generation path and the seed's worked examples against; the package itself never calls them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VerifyOutcome:
    """Result of verifying one block: ``accepted`` draft tokens kept, then the ``bonus`` token."""

    accepted: int
    bonus: int

    @property
    def committed(self) -> int:
        return self.accepted + 1


def greedy_accept_length(draft: torch.Tensor, target_argmax: torch.Tensor) -> int:
    """Number of leading draft tokens equal to the target's greedy tokens at the same positions."""
    gamma = draft.shape[-1]
    mismatch = (draft != target_argmax[..., :gamma]).to(torch.int64)
    return int((mismatch.cumsum(-1) == 0).sum())


def exact_match_verify(draft: torch.Tensor, target_probs: torch.Tensor, generator: torch.Generator | None = None) -> VerifyOutcome:
    """Point-mass verification: draw ``v_i ~ p_i``; accept ``d_i`` iff ``v_i == d_i``; else commit ``v_i``.

    ``target_probs`` has ``len(draft) + 1`` rows: row i is the target's distribution (at the
    sampling temperature) after the draft prefix ``d_{<=i}``; the last row gives the bonus token
    when the whole draft is accepted.
    """
    gamma = draft.shape[0]
    for i in range(gamma + 1):
        v = int(torch.multinomial(target_probs[i], 1, generator=generator))
        if i == gamma or v != int(draft[i]):
            return VerifyOutcome(accepted=i, bonus=v)
    raise AssertionError("unreachable")


def point_mass_accept_probability(target_prob_of_draft: float) -> float:
    """Acceptance probability of a fixed draft token under the point-mass proposal: p_i(d_i)."""
    return float(target_prob_of_draft)


def rejection_accept_probability(target_prob_of_draft: float, proposal_prob_of_draft: float) -> float:
    """Leviathan et al.'s acceptance min(1, p/q) with an explicit proposal probability q.

    Committing probability of a fixed token under this rule with the drafter's softmax as q is
    ``min(1, p/q)``, which is *not* p when the token was an argmax rather than a draw from q:
    the Appendix F.3 counter-example (q=0.9, p=0.6) commits with 2/3 instead of 0.6.
    """
    if proposal_prob_of_draft <= 0:
        raise ValueError("a proposal must give the drafted token positive probability")
    return min(1.0, target_prob_of_draft / proposal_prob_of_draft)
