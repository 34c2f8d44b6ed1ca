"""Greedy output with a drafter must equal the target's own greedy output, token for token (fp32)."""

import pytest
import torch

from hf_jetspec import JetSpecDrafter
from helpers import tiny_llama
from hf_jetspec.assistant import assistant_for


def greedy_pair(target, drafter, prompt, **kwargs):
    ref = target.generate(prompt, do_sample=False, **kwargs)
    out = target.generate(prompt, assistant_model=drafter, do_sample=False, **kwargs)
    return ref, out


@pytest.mark.parametrize("which", ["trained_llama", "trained_qwen"])
@pytest.mark.parametrize("budget", [4, 16, 32])
@pytest.mark.parametrize("passes", [0, 1, 2, 3])
@pytest.mark.parametrize("policy", [True, False])
def test_often_accepting_drafter_is_exact(request, which, budget, passes, policy):
    target, drafter, prompts = request.getfixturevalue(which)
    drafter.drafting_config = drafter.drafting_config.replace(budget=budget, num_jacobi_passes=passes, policy=policy)
    taus = []
    for i in range(3):
        ref, out = greedy_pair(target, drafter, prompts[i : i + 1], max_new_tokens=48)
        assert torch.equal(ref, out)
        taus.append(drafter.generation_stats.tau)
    # the fixture really is an often-accepting drafter: the equality above is tested under acceptance
    assert max(taus) > 1.8


@pytest.mark.parametrize("target_fixture", ["llama_target", "qwen_target"])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 5, 17, 64, 200])
def test_random_drafter_is_exact_for_any_length(request, target_fixture, max_new_tokens):
    target = request.getfixturevalue(target_fixture)
    torch.manual_seed(max_new_tokens)
    drafter = JetSpecDrafter.for_target(target).eval()
    prompt = torch.randint(0, target.config.vocab_size, (1, 7))
    ref, out = greedy_pair(target, drafter, prompt, max_new_tokens=max_new_tokens)
    assert torch.equal(ref, out)
    stats = drafter.generation_stats
    assert stats.committed_tokens + 1 == out.shape[1] - prompt.shape[1]  # + the prefill token


@pytest.mark.parametrize("max_new_tokens", [1, 7, 16, 31, 33, 100])
def test_trained_drafter_any_length_budget_32(trained_llama, max_new_tokens):
    target, drafter, prompts = trained_llama
    drafter.drafting_config.budget = 32
    drafter.drafting_config.num_jacobi_passes = 2
    ref, out = greedy_pair(target, drafter, prompts[3:4], max_new_tokens=max_new_tokens)
    assert torch.equal(ref, out)
    assert out.shape[1] - 8 == max_new_tokens


def test_eos_inside_a_block(trained_llama):
    target, drafter, prompts = trained_llama
    drafter.drafting_config.budget = 16
    drafter.drafting_config.num_jacobi_passes = 1
    prompt = prompts[0:1]
    free = target.generate(prompt, do_sample=False, max_new_tokens=40)[0, 8:]
    # a token first produced well inside the continuation, so the stop lands mid-block
    eos = int(free[9])
    first = int((free == eos).nonzero()[0])
    ref, out = greedy_pair(target, drafter, prompt, max_new_tokens=40, eos_token_id=eos)
    assert torch.equal(ref, out)
    assert out.shape[1] == 8 + first + 1 and int(out[0, -1]) == eos
    assert drafter.generation_stats.tau > 1.0  # the stop really happened with drafts in flight


def test_stopping_criteria_stop_where_plain_decoding_stops(trained_llama):
    target, drafter, prompts = trained_llama
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StopAfter(StoppingCriteria):
        def __init__(self, n):
            self.n = n

        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.n, dtype=torch.bool)

    class EndsWith(StoppingCriteria):  # a "stop string" of two tokens that may end inside a block
        def __init__(self, pair):
            self.pair = torch.tensor(pair)

        def __call__(self, input_ids, scores, **kwargs):
            return (input_ids[:, -2:] == self.pair).all(-1)

    drafter.drafting_config.budget = 16
    drafter.drafting_config.num_jacobi_passes = 1
    ref, out = greedy_pair(target, drafter, prompts[1:2], max_new_tokens=60, min_new_tokens=20)
    assert torch.equal(ref, out)
    for p in range(4):
        prompt = prompts[p : p + 1]
        free = target.generate(prompt, do_sample=False, max_new_tokens=60)[0, 8:]
        pair = free[12:14].tolist()
        for criteria in (StopAfter(30), EndsWith(pair)):
            ref, out = greedy_pair(target, drafter, prompt, max_new_tokens=60, stopping_criteria=StoppingCriteriaList([criteria]))
            assert torch.equal(ref, out)
    assert drafter.generation_stats.tau > 1.5  # blocks were in flight when the criteria fired


def test_repetition_penalty_processor_is_respected():
    target = tiny_llama(seed=3)
    drafter = JetSpecDrafter.for_target(target).eval()
    prompt = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(3))
    ref, out = greedy_pair(target, drafter, prompt, max_new_tokens=40, repetition_penalty=1.3, no_repeat_ngram_size=3)
    assert torch.equal(ref, out)


def test_bidirectional_and_mask_drafters_are_exact(llama_target):
    prompt = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(5))
    for overrides in ({"attention": "bidirectional"}, {"block_inputs": "mask"}, {"draft_vocab_size": 50}):
        torch.manual_seed(0)
        drafter = JetSpecDrafter.for_target(llama_target, **overrides).eval()
        drafter.drafting_config.num_jacobi_passes = 2
        ref, out = greedy_pair(llama_target, drafter, prompt, max_new_tokens=50)
        assert torch.equal(ref, out), overrides


@pytest.mark.slow
def test_real_smollm2_random_drafter_is_exact(smollm2):
    model, tok = smollm2
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(model).eval()
    prompts = [
        "What is the capital of France?",
        "Write a Python function that checks whether a number is prime.",
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
    ]
    for j, text in enumerate(prompts):
        drafter.drafting_config.num_jacobi_passes = j % 2
        enc = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ref = model.generate(**enc, do_sample=False, max_new_tokens=40)
        out = model.generate(**enc, assistant_model=drafter, do_sample=False, max_new_tokens=40)
        assert torch.equal(ref, out), text
        assert drafter.generation_stats.rounds > 0
    enc = tok.apply_chat_template([{"role": "user", "content": "Count from 1 to 30, separated by commas."}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    kwargs = dict(do_sample=False, max_new_tokens=60, stop_strings=["5. 5"], tokenizer=tok)
    ref = model.generate(**enc, **kwargs)
    out = model.generate(**enc, assistant_model=drafter, **kwargs)
    assert torch.equal(ref, out) and tok.decode(out[0]).endswith("5. 5")


@pytest.mark.parametrize("target_fixture", ["llama_target", "qwen_target"])
def test_policy_rounds_of_every_kind_are_exact(request, target_fixture):
    """Plain steps (L = 0), n-gram proposals and n-gram-seeded drafter blocks, all token-exact."""
    target = request.getfixturevalue(target_fixture)
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(target).eval()
    assistant_for(drafter).output_memory.clear()
    sources: dict = {}
    seeded = 0
    for i, prompt in enumerate([torch.randint(0, 100, (1, 7)), torch.tensor([[5, 6, 7, 8] * 3])]):
        ref, out = greedy_pair(target, drafter, prompt, max_new_tokens=64)
        assert torch.equal(ref, out)
        stats = drafter.generation_stats
        assert sum(stats.source_counts.values()) == stats.rounds == len(stats.chosen_lengths)
        for k, v in stats.source_counts.items():
            sources[k] = sources.get(k, 0) + v
        seeded += stats.seeded_drafter_runs
    assert sources.get("plain", 0) > 0 and sources.get("ngram", 0) > 0
    assert seeded > 0  # the repeated prompt has an n-gram continuation from the first round on
