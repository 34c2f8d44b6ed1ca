"""The architecture matrix: tiny random models of every supported family, built from configs (no download).

For each family, greedy fp32 output with a drafter is plain decoding's, token for token, in chain and
tree rounds, with the round policy on and off, on a prompt longer than the sliding window where the
family has one; sampled output follows the target's law. Families whose hidden states or cache a
drafter cannot read get a clear error when the drafter is built.
"""

import pytest
import torch
import transformers
from transformers.generation.logits_process import TemperatureLogitsWarper

from hf_jetspec import DrafterFreeAssistant, DrafterFreeConfig, JetSpecDrafter
from hf_jetspec.assistant import assistant_for
from test_sampling_exactness import VOCAB, chi2_pvalue, empirical, exact_joint

WINDOW = 8  # sliding window of the families that have one: shorter than the prompts below
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, bos_token_id=0, eos_token_id=None, pad_token_id=None)
FAMILIES = {
    # family: (config class, causal-LM class, the family's own options)
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": False}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),  # per-head q/k norms, head_dim != hidden / heads
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {  # sliding and global layers, scaled embeddings, tied head
        "sliding_window": WINDOW, "head_dim": 16, "query_pre_attn_scalar": 16, "tie_word_embeddings": True,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": None}),  # fused qkv and gate-up projections
}


def build(family: str, vocab_size: int = 96, seed: int = 0):
    config_name, model_name, own = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(vocab_size=vocab_size, **COMMON, **own)
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():  # sharper logits: fewer near-ties, and a greedy continuation that repeats itself
        model.get_output_embeddings().weight.mul_(4.0)
    return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def target(request):
    return build(request.param)


PROMPTS = [torch.tensor([[5, 17, 33, 2, 90, 41, 7, 12, 5, 17, 33, 2, 60, 41, 7, 12, 5, 17, 33, 2]]),  # 20 > WINDOW
           torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4]])]


@pytest.mark.parametrize("rounds", [dict(policy=False, tree=None), dict(policy=True, tree=None),
                                    dict(policy=False, tree="auto"), dict(policy=True, tree="auto")],
                         ids=["chain", "chain-policy", "tree", "tree-policy"])
def test_greedy_output_is_plain_decoding(target, rounds):
    torch.manual_seed(1)
    drafter = JetSpecDrafter.for_target(target).eval()
    drafter.drafting_config = drafter.drafting_config.replace(budget=6, **rounds)
    for prompt in PROMPTS:
        plain = target.generate(prompt, do_sample=False, max_new_tokens=40)
        for _ in range(2):  # the second call starts from the first's output memory and calibration
            out = target.generate(prompt, do_sample=False, max_new_tokens=40, assistant_model=drafter)
            assert torch.equal(out, plain)
    stats = drafter.generation_stats
    assert stats.rounds > 0
    # tree rounds keep a full-attention cache's accepted rows; a sliding-window cache runs chain rounds
    sliding = getattr(target.config, "sliding_window", None) is not None
    assert bool(stats.tree_nodes) == (rounds["tree"] is not None and not sliding)


def test_greedy_output_with_an_accepting_drafter(target):
    """Drafts that are accepted: the target's own continuation seeded as the drafter's block (n-gram seeds
    from a repeating output), so verification commits several drafted tokens per round."""
    drafter = JetSpecDrafter.for_target(target).eval()
    drafter.drafting_config = drafter.drafting_config.replace(budget=8, policy=True, tree=None)
    prompt = PROMPTS[0]
    plain = target.generate(prompt, do_sample=False, max_new_tokens=60)
    accepted = 0
    for _ in range(3):
        out = target.generate(prompt, do_sample=False, max_new_tokens=60, assistant_model=drafter)
        assert torch.equal(out, plain)
        accepted += sum(drafter.generation_stats.accepted_lengths)
    for tree in (False, True):  # chain rounds, then tree rounds of the distinct continuations (chains on sliding windows)
        free = DrafterFreeAssistant.for_target(target, DrafterFreeConfig(tree=tree))
        for _ in range(2):
            assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=60, assistant_model=free), plain)
            accepted += sum(free.generation_stats.accepted_lengths)
    assert accepted > 30, accepted  # proposals were accepted, not only rejected


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sampling_law(family):
    target = build(family, vocab_size=VOCAB, seed=3)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(2.0)
    torch.manual_seed(2)
    drafter = JetSpecDrafter.for_target(target).eval()
    drafter.drafting_config = drafter.drafting_config.replace(budget=3, num_jacobi_passes=1, policy=True, sampled_drafts=True)
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(target, drafter, temperature=1.0, top_k=0)
    assert chi2_pvalue(law, counts) > 1e-3
    assert assistant_for(drafter).output_memory.sequences  # the calls ran through the drafter's rounds


@pytest.mark.parametrize("name, model", [
    ("t5", lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=2, vocab_size=64))),
    ("mamba", lambda: transformers.MambaForCausalLM(transformers.MambaConfig(hidden_size=32, num_hidden_layers=2, vocab_size=64))),
])
def test_unsupported_architectures_get_a_clear_error(name, model):
    with pytest.raises(ValueError, match="cannot serve"):
        JetSpecDrafter.for_target(model())
