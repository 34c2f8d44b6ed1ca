"""Tiny targets and a quickly trained drafter for mechanics tests (see :mod:`hf_jetspec.tools.testing`)."""

import torch

from hf_jetspec.tools.testing import tiny_llama, tiny_qwen2, train_drafter_on_greedy

__all__ = ["tiny_llama", "tiny_qwen2", "train_drafter_on_greedy", "verified_context"]


def verified_context(target, drafter, prompt, n: int, new_tokens: int = 24):
    """``(seq, out, cache)``: the target's greedy continuation ``seq`` of ``prompt`` [1, P], its forward
    ``out`` (hidden states) over the first ``n`` tokens, and a drafter cache holding those ``n`` rows."""
    seq = target.generate(prompt, do_sample=False, max_new_tokens=new_tokens)[0]
    with torch.no_grad():
        out = target(seq[None, :n], output_hidden_states=True)
    states = torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1)
    cache = drafter.new_cache()
    drafter.append_context(cache, states, torch.arange(n))
    return seq, out, cache
