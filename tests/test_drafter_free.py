"""The drafter-free assistant: exact output, the target's law under sampling, memory across calls, clear errors."""

import pytest
import torch
from transformers import LlamaConfig, T5Config
from transformers.generation.logits_process import TemperatureLogitsWarper

from hf_jetspec import DrafterFreeAssistant, DrafterFreeConfig
from test_sampling_exactness import chi2_pvalue, empirical, exact_joint, small_target

REPEATING = torch.tensor([[5, 17, 33, 2, 90, 41, 7, 12, 5, 17, 33, 2, 90]])


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("name", ["llama_target", "qwen_target"])
def test_greedy_output_is_plain_decoding_and_ngram_rounds_commit(name, tree, request):
    target = request.getfixturevalue(name)
    assistant = DrafterFreeAssistant.for_target(target, DrafterFreeConfig(tree=tree))
    sources = set()
    prompts = [REPEATING, torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]]), torch.tensor([[7]])]
    accepted = 0
    for prompt in prompts * 2:  # the second pass meets its own earlier outputs in the memory
        plain = target.generate(prompt, do_sample=False, max_new_tokens=60)
        out = target.generate(prompt, do_sample=False, max_new_tokens=60, assistant_model=assistant)
        assert torch.equal(out, plain)
        stats = assistant.generation_stats
        assert stats.committed_tokens == out.shape[1] - prompt.shape[1] - 1  # the prefill commits the first token
        accepted += sum(stats.accepted_lengths)
        sources |= set(stats.round_sources)
    assert accepted > 20  # proposals were verified and accepted, not only plain steps
    if tree:  # rounds that verified several distinct continuations at once
        assert "ngram-tree" in sources, sources


def test_output_memory_makes_a_repeated_request_cheaper(llama_target):
    assistant = DrafterFreeAssistant.for_target(llama_target)
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    llama_target.generate(prompt, do_sample=False, max_new_tokens=60, assistant_model=assistant)
    first = assistant.generation_stats
    llama_target.generate(prompt, do_sample=False, max_new_tokens=60, assistant_model=assistant)
    second = assistant.generation_stats
    assert second.rounds < first.rounds and second.tau > first.tau
    off = DrafterFreeAssistant.for_target(llama_target, DrafterFreeConfig(output_memory=False))
    for _ in range(2):
        llama_target.generate(prompt, do_sample=False, max_new_tokens=60, assistant_model=off)
    # without the memory the second call has no earlier output to copy (only its acceptance counts carry over)
    assert off.output_memory.sequences == [] and off.generation_stats.rounds > second.rounds


@pytest.mark.parametrize("tree", [False, True])
def test_sampled_output_follows_the_exact_law(tree):
    target = small_target()
    assistant = DrafterFreeAssistant.for_target(target, DrafterFreeConfig(budget=3, tree=tree))
    law = exact_joint(target, [TemperatureLogitsWarper(0.8)])
    sources = {}
    counts = empirical(target, assistant, sources=sources, temperature=0.8, top_k=0)
    assert sources.get("ngram", 0) > 100, sources  # a 4-token vocabulary repeats: proposals were verified
    if tree:
        assert sources.get("ngram-tree", 0) > 20, sources
    assert chi2_pvalue(law, counts) > 1e-3


def test_clear_errors():
    target = small_target()
    assistant = DrafterFreeAssistant.for_target(target)
    other = DrafterFreeAssistant(LlamaConfig(vocab_size=32))
    with pytest.raises(ValueError, match="built for a llama target with a 32-token vocabulary"):
        target.generate(torch.tensor([[1, 2]]), max_new_tokens=4, assistant_model=other)
    with pytest.raises(ValueError, match="decoder-only"):
        DrafterFreeAssistant(T5Config())
    with pytest.raises(ValueError, match="budget must be >= 2"):
        DrafterFreeConfig(budget=1)
    with pytest.raises(ValueError, match="num_beams=1"):
        target.generate(torch.tensor([[1, 2]]), max_new_tokens=4, num_beams=2, assistant_model=assistant)
