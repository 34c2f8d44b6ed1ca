"""Greedy target rollouts from many anchors at once (ALR, seed 003), reusing the target's cache.

After the target's forward over the batch (kept as a KV cache), every rollout step feeds one
token per anchor: the previous step's greedy token, at position ``a + r``, with a custom attention
mask that lets the rollout of anchor ``a`` see only the corpus prefix ``x_{<=a}`` and its own
earlier rollout tokens. One extra target forward of ``num_anchors`` tokens per step gives, for
every anchor, the rollout-conditioned distributions ``p_T(. | x_{<=a}, y*_{<k})`` that ALR uses as
labels, and the read-layer states of the rollout tokens that IRA uses as context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollouts:
    """Greedy rollouts of depth R from nb anchors per sequence.

    ``tokens[..., r]`` is y*_{r+1} (r = 0..R); ``logits[..., k-1, :]`` is the label logits of slot k
    (k = 1..R+1); ``states[..., r-1, :]`` the read-layer states of the rollout token y*_r fed at
    position a + r (r = 1..R); ``alive[..., k-1]`` is False for slots after an end-of-sequence token.
    """

    tokens: torch.Tensor  # [B, nb, R + 1]
    logits: torch.Tensor  # [B, nb, R + 1, V]
    states: torch.Tensor  # [B, nb, R, n_read * H]
    alive: torch.Tensor  # [B, nb, R + 1]


def rollout_attention_mask(anchors: torch.Tensor, seq_len: int, step: int) -> torch.Tensor:
    """Boolean mask [B, 1, nb, seq_len + step * nb] of rollout step ``step`` (1-based).

    Query j (the rollout of anchor ``anchors[:, j]``) sees corpus positions ``<= anchor`` and the
    cache slots ``seq_len + (r - 1) * nb + j`` of its own rollout tokens for r = 1..step.
    """
    bsz, nb = anchors.shape
    device = anchors.device
    corpus = torch.arange(seq_len, device=device)[None, None, :] <= anchors[..., None]  # [B, nb, T]
    own = torch.eye(nb, dtype=torch.bool, device=device)[None, :, None, :].expand(bsz, nb, step, nb)
    mask = torch.cat([corpus, own.reshape(bsz, nb, step * nb)], dim=-1)
    return mask[:, None]


@torch.no_grad()
def greedy_rollouts(target, main_out, anchors: torch.Tensor, depth: int, layer_ids: list[int], eos_token_ids=()) -> Rollouts:
    """Roll the target out greedily ``depth`` tokens from every anchor.

    ``main_out`` is the target's output over the whole batch with ``use_cache=True`` (its cache is
    extended in place by the rollout tokens and must not be reused afterwards).
    """
    logits0 = main_out.logits
    cache = main_out.cache if hasattr(main_out, "cache") else main_out.past_key_values
    bsz, seq_len, _ = logits0.shape
    device = logits0.device
    anchors = anchors.to(device)
    b_idx = torch.arange(bsz, device=device)[:, None]
    step_logits = [logits0[b_idx, anchors]]  # slot 1: p(. | x_{<=a})
    tokens = [step_logits[0].argmax(-1)]
    states = []
    eos = torch.tensor(list(eos_token_ids), device=device, dtype=torch.long)
    for r in range(1, depth + 1):
        out = target(
            input_ids=tokens[-1],
            position_ids=anchors + r,
            attention_mask=rollout_attention_mask(anchors, seq_len, r),
            cache=cache,
            use_cache=True,
            output_hidden_states=[i + 1 for i in layer_ids],
        )
        cache = out.cache if hasattr(out, "cache") and out.cache is not None else out.past_key_values
        states.append(torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1))
        step_logits.append(out.logits)
        tokens.append(out.logits.argmax(-1))
    tokens_t = torch.stack(tokens, dim=-1)
    ended = torch.isin(tokens_t, eos) if eos.numel() else torch.zeros_like(tokens_t, dtype=torch.bool)
    # slot k is alive while none of y*_1 .. y*_{k-1} ended the sequence
    alive = torch.cat([torch.ones_like(ended[..., :1]), ~(ended[..., :-1].cumsum(-1) > 0)], dim=-1)
    empty = logits0.new_zeros(bsz, anchors.shape[1], 0, len(layer_ids) * target.config.get_text_config().hidden_size)
    return Rollouts(
        tokens=tokens_t,
        logits=torch.stack(step_logits, dim=2),
        states=torch.stack(states, dim=2) if states else empty,
        alive=alive,
    )
