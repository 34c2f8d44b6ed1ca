"""Verification forwards through :mod:`hf_jetspec.generation.gqa_attention`: the same logits as transformers'
SDPA path, the target's setting switched only for the duration of a JetSpec call."""

import pytest
import torch
from helpers import tiny_llama
from transformers import DynamicCache

from hf_jetspec import JetSpecDrafter
from hf_jetspec.generation.gqa_attention import ATTENTION_NAME, masked_gqa


def _cached_forward(target, prefix, block):
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids=prefix, cache=cache, use_cache=True)
        mask = torch.ones(1, prefix.shape[1] + block.shape[1], dtype=torch.long)
        return target(input_ids=block, cache=cache, use_cache=True, attention_mask=mask).logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_grouped_query_forward_has_the_sdpa_logits(dtype):
    target = tiny_llama().to(dtype)
    assert target.config._attn_implementation == "sdpa" and target.config.num_key_value_heads < target.config.num_attention_heads
    g = torch.Generator().manual_seed(0)
    prefix, block = torch.randint(0, 128, (1, 40), generator=g), torch.randint(0, 128, (1, 7), generator=g)
    ref = _cached_forward(target, prefix, block)
    with masked_gqa(target):
        assert target.config._attn_implementation == ATTENTION_NAME
        got = _cached_forward(target, prefix, block)
    assert target.config._attn_implementation == "sdpa"
    assert torch.equal(ref, got)


def test_the_setting_is_restored_after_an_error_and_other_targets_are_left_alone():
    target = tiny_llama()
    with pytest.raises(RuntimeError, match="boom"):
        with masked_gqa(target):
            raise RuntimeError("boom")
    assert target.config._attn_implementation == "sdpa"
    eager = tiny_llama()
    eager.config._attn_implementation = "eager"
    with masked_gqa(eager):
        assert eager.config._attn_implementation == "eager"


def test_generate_switches_only_while_a_drafter_runs(llama_target):
    seen = []
    drafter = JetSpecDrafter.for_target(llama_target)
    original = drafter.draft_blocks

    def spy(*args, **kwargs):
        seen.append(llama_target.config._attn_implementation)
        return original(*args, **kwargs)

    drafter.draft_blocks = spy
    drafter.drafting_config = drafter.drafting_config.replace(policy=False)
    prompt = torch.tensor([[5, 6, 7, 8]])
    out = llama_target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=12)
    assert seen and set(seen) == {ATTENTION_NAME}
    assert llama_target.config._attn_implementation == "sdpa"
    assert torch.equal(out, llama_target.generate(prompt, do_sample=False, max_new_tokens=12))
