"""Grouped-query attention over a long cache without copying it, for verification forwards on CPU.

A verification forward has several query rows, so it needs a causal mask. transformers' SDPA path
(5.24) then expands the keys and values of every grouped-query layer to all query heads
(``repeat_kv``) before calling ``scaled_dot_product_attention``, because masked grouped-query SDPA
falls back to the math kernel on CUDA. On CPU, torch's flash kernel takes the mask and the grouped
heads as they are (``enable_gqa=True``), and the copies are what a long cache makes expensive: a
2-token forward of SmolLM2-135M in fp32 over an 8,000-token cache takes 235 ms with them and 124 ms
without (``benchmarks/verify_forward_cost.py``), while a plain 1-token step, which needs no mask,
never copies.

:func:`masked_gqa` switches a CPU target with SDPA attention to :func:`gqa_sdpa_attention` for the
duration of one ``generate`` call (the seam does it for JetSpec drafters), registered with
transformers' public ``AttentionInterface`` under :data:`ATTENTION_NAME`. Masked grouped-query calls
on CPU go straight to SDPA with ``enable_gqa=True``; every other call goes to transformers' own
``sdpa_attention_forward`` unchanged. The keys, values, mask and scale are the same, only the
expansion is skipped.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

ATTENTION_NAME = "jetspec_sdpa"


def gqa_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, with masked grouped-query calls on CPU left unexpanded."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain = (
        attention_mask is None or groups <= 1 or query.device.type != "cpu" or kwargs.get("softcap") is not None
        or kwargs.get("position_bias") is not None or kwargs.get("output_attentions", False)
        or key.shape[-1] != value.shape[-1] or torch.jit.is_tracing()
    )
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
                                         enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make :data:`ATTENTION_NAME` known to transformers (idempotent): the attention function above
    and the same mask builder as ``"sdpa"``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, gqa_sdpa_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


@contextmanager
def masked_gqa(target):
    """While the block runs, a CPU ``target`` with ``sdpa`` attention uses :func:`gqa_sdpa_attention`;
    its setting is restored afterwards, whatever happens. Other targets are left as they are."""
    config = target.config
    if getattr(config, "_attn_implementation", None) != "sdpa" or target.device.type != "cpu":
        yield
        return
    register()
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
