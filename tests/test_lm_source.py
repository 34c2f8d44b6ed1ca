"""A small LM as a proposal source: its arithmetic, its cache kept in step with the verified text,
greedy output identical to the target's in tree rounds, chain rounds and drafter-free rounds (two
architectures), the target's exact law when sampling, and clear refusals."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_llama
from test_sampling_exactness import NEW, PROMPT, SAMPLES, chi2_pvalue, exact_joint, sharp_drafter, small_target
from transformers.generation.logits_process import TemperatureLogitsWarper

from hf_jetspec.assistant import DrafterFreeAssistant, LMSource, LMSourceConfig, assistant_for
from hf_jetspec.policy import AcceptanceModel, OutputMemory
from hf_jetspec.assistant.lm_source import (best_seed, check_lm_source, common_prefix_length, expected_run, lm_head_ids, seed_bucket,
                                             worth_another_token)

EXACT = LMSourceConfig(head_vocab=None, int8=False, min_prob=0.0)  # the LM's own argmax, in its own dtype


@pytest.fixture(autouse=True)
def fixed_lm_cost(monkeypatch):
    """An LM token costs 1 ms whatever the machine is doing (beside conftest's fixed verification
    costs), so chain lengths, and the counts the tests assert, do not depend on the load."""
    monkeypatch.setattr(LMSource, "_observe_token", lambda self, seconds: setattr(self, "token_seconds", 0.001))


# ---------------------------------------------------------------------------- arithmetic
def test_restricted_head_ids_keep_the_preferred_ids_then_the_lowest():
    assert lm_head_ids(10, 4, preferred=[7, 2, 7]).tolist() == [0, 1, 2, 7]
    assert lm_head_ids(10, 3).tolist() == [0, 1, 2]
    assert lm_head_ids(5, 9, preferred=[4]).tolist() == [0, 1, 2, 3, 4]  # never more rows than the vocabulary
    assert lm_head_ids(10, 2, preferred=[9, 8, 7]).tolist() == [8, 9]  # the preferred ids alone fill it


def test_another_token_pays_while_its_expected_saving_exceeds_its_cost():
    # a 0.5B token at 35 ms beside a 190 ms target step: worth it while the path's acceptance > 35/190 = 0.184
    assert worth_another_token(0.19, 0.035, 0.19)
    assert not worth_another_token(0.18, 0.035, 0.19)
    assert not worth_another_token(1.0, 0.2, 0.19)  # an LM dearer than the target never pays


def test_the_seed_is_the_proposal_with_the_most_expected_accepted_tokens():
    assert expected_run([0.5, 0.5]) == 0.75 and expected_run([]) == 0.0
    assert expected_run([1.0, 1.0, 0.0, 1.0]) == 2.0  # nothing after a certain rejection counts
    # a short sure copy beats a long doubtful block: 0.9 + 0.81 = 1.71 against 0.5 + 0.25 + 0.125 = 0.875
    assert best_seed([([1, 2], [0.9, 0.9]), ([3, 4, 5], [0.5, 0.5, 0.5])]) == ([1, 2], [0.9, 0.9])
    assert best_seed([([1], [0.3]), ([3, 4], [0.5, 0.5, 0.7])]) == ([3, 4], [0.5, 0.5])  # estimates cut to the tokens
    assert best_seed([([], []), ([7], [0.1])]) == ([7], [0.1]) and best_seed([]) == ([], [])
    assert [seed_bucket(r) for r in (0.0, 0.99, 1.0, 2.9, 3.0, 5.9, 6.0, 15.0)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2


def test_config_is_validated():
    with pytest.raises(ValueError, match="max_tokens"):
        LMSourceConfig(max_tokens=0)
    with pytest.raises(ValueError, match="head_vocab"):
        LMSourceConfig(head_vocab=0)
    with pytest.raises(ValueError, match="min_prob"):
        LMSourceConfig(min_prob=1.0)


# ---------------------------------------------------------------------------- the source itself
def greedy_continuation(model, ids: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(ids) :].tolist()


def test_a_chain_is_the_lms_greedy_continuation_and_survives_rollback(llama_target):
    lm = tiny_llama(seed=3)
    source = LMSource(lm, EXACT)
    first = [1, 5, 9, 12, 7]
    assert source.propose(first, 6).tokens == greedy_continuation(lm, first, 6)
    # the verified text takes two of the chain, then a token of its own: the cache is cropped, not rebuilt
    second = first + source.propose(first, 6).tokens[:2] + [3]
    forwards = source.forwards
    chain = source.propose(second, 5)
    assert chain.tokens == greedy_continuation(lm, second, 5)
    assert source.forwards - forwards == 5  # one forward per token: the catch-up feeds the new tokens with the first
    assert source.ids == second + chain.tokens[:-1]
    # a different text from the start: nothing shared, everything recomputed
    other = [4, 4, 2]
    assert source.propose(other, 3).tokens == greedy_continuation(lm, other, 3)
    assert all(0 < p <= 1 for p in chain.probs)


def test_keep_going_and_min_prob_end_a_chain(llama_target):
    lm = tiny_llama(seed=3)
    seen = []
    chain = LMSource(lm, EXACT).propose([1, 2, 3], 8, keep_going=lambda raw: seen.append(list(raw)) or len(raw) < 3)
    assert len(chain.tokens) == 3 and [len(r) for r in seen] == [1, 2, 3]
    assert len(LMSource(lm, EXACT.replace(min_prob=0.999)).propose([1, 2, 3], 8).tokens) == 1
    assert len(LMSource(lm, EXACT.replace(max_tokens=2)).propose([1, 2, 3], 8).tokens) == 2


def test_restricted_head_and_int8_propose_only_kept_ids_and_leave_the_model_alone():
    lm = tiny_llama(seed=3)
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    logits = lm(ids).logits
    source = LMSource(lm, LMSourceConfig(head_vocab=32, int8=True, min_prob=0.0), preferred_ids=[100, 120])
    chain = source.propose(ids[0], 6)
    kept = set(source.head_ids.tolist())
    assert len(kept) == 32 and {100, 120} <= kept and set(chain.tokens) <= kept
    assert all(torch.equal(v, lm.state_dict()[k]) for k, v in before.items())
    assert torch.equal(lm(ids).logits, logits)
    assert LMSource(lm, LMSourceConfig()).config.int8  # on the CPU, int8 by default


def test_mismatched_lms_are_refused(llama_target):
    from hf_jetspec.tools.testing import tiny_qwen2

    with pytest.raises(ValueError, match="vocabulary .* does not match"):
        check_lm_source(llama_target, tiny_qwen2())
    mine, other = tiny_llama(seed=4), tiny_llama(seed=5)
    mine.config.eos_token_id, other.config.eos_token_id = 7, 8
    with pytest.raises(ValueError, match="eos_token_id"):
        check_lm_source(mine, other)
    a = SimpleNamespace(get_vocab=lambda: {"a": 0, "b": 1})
    b = SimpleNamespace(get_vocab=lambda: {"a": 1, "b": 0})
    with pytest.raises(ValueError, match="tokenizer differs"):
        check_lm_source(llama_target, tiny_llama(seed=4), a, b)
    check_lm_source(llama_target, tiny_llama(seed=4), a, a)


# ---------------------------------------------------------------------------- greedy: the target's own text
def sharpened(model, factor: float = 200.0):
    """``model`` with its final norm scaled, so its logits are: the same argmax, confident probabilities
    (which the policy prices high, so its chains are verified even beside a drafter that accepts often)."""
    with torch.no_grad():
        model.base_model.norm.weight.mul_(factor)
    return model


def _generate(target, assistant_model, prompt, n=40):
    return target.generate(prompt, assistant_model=assistant_model, do_sample=False, max_new_tokens=n)


@pytest.mark.parametrize("tree", ["auto", None])
@pytest.mark.parametrize("lm_kind", ["same", "other"])
def test_greedy_rounds_with_an_lm_source_are_the_targets_text(trained_llama, tree, lm_kind):
    target, drafter, prompts = trained_llama
    lm = sharpened(copy.deepcopy(target) if lm_kind == "same" else tiny_llama(seed=5))
    saved, saved_memory = drafter.drafting_config, assistant_for(drafter).output_memory
    assistant = assistant_for(drafter)
    assistant.output_memory = OutputMemory()  # a fresh LM gate and calibration, whatever ran before
    drafter.drafting_config = saved.replace(tree=tree, policy=True)  # whatever an earlier test left on the shared drafter
    assistant.attach_lm_source(lm, EXACT)
    try:
        lm_nodes = accepted = 0
        for prompt in [prompts[0:1], prompts[1:2], torch.tensor([[1, 5, 9, 12, 7, 3]])]:
            plain = target.generate(prompt, do_sample=False, max_new_tokens=40)
            out = _generate(target, drafter, prompt)
            assert torch.equal(out, plain)
            lm_nodes += drafter.generation_stats.lm_nodes
            accepted += drafter.generation_stats.lm_accepted
    finally:
        assistant.attach_lm_source(None)
        drafter.drafting_config, assistant.output_memory = saved, saved_memory
    assert lm_nodes > 0
    if lm_kind == "same":  # the target itself as the LM: every verified LM token is the target's
        assert accepted == lm_nodes


def test_greedy_qwen2_rounds_with_an_lm_source_are_the_targets_text(trained_qwen):
    target, drafter, prompts = trained_qwen
    assistant = assistant_for(drafter)
    saved_memory, assistant.output_memory = assistant.output_memory, OutputMemory()
    saved = drafter.drafting_config
    drafter.drafting_config = saved.replace(policy=True, tree="auto")
    assistant.attach_lm_source(sharpened(copy.deepcopy(target)), EXACT)
    try:
        accepted = 0
        for prompt in [prompts[0:1], prompts[3:4]]:
            assert torch.equal(_generate(target, drafter, prompt), target.generate(prompt, do_sample=False, max_new_tokens=40))
            accepted += drafter.generation_stats.lm_accepted
        assert accepted > 0
    finally:
        assistant.attach_lm_source(None)
        assistant.output_memory, drafter.drafting_config = saved_memory, saved


def test_drafter_free_rounds_with_an_lm_source_are_the_targets_text(llama_target):
    free = DrafterFreeAssistant.for_target(llama_target, lm_source=LMSource(sharpened(copy.deepcopy(llama_target)), EXACT))
    for prompt in [torch.tensor([[1, 5, 9, 12, 7, 3]]), torch.tensor([[3, 3, 8, 100, 2]])]:
        assert torch.equal(_generate(llama_target, free, prompt), llama_target.generate(prompt, do_sample=False, max_new_tokens=40))
    assert free.generation_stats.lm_accepted > 0 and free.generation_stats.source_counts.get("lm", 0) > 0


def test_an_lm_source_needs_the_policy_one_row_and_chain_tries(trained_llama, llama_target):
    target, drafter, prompts = trained_llama
    saved = drafter.drafting_config
    assistant = assistant_for(drafter)
    assistant.attach_lm_source(tiny_llama(seed=5), EXACT)
    try:
        for tree in ("auto", None):
            drafter.drafting_config = saved.replace(policy=False, tree=tree)
            with pytest.raises(ValueError, match="LM source"):
                _generate(target, drafter, prompts[0:1])
    finally:
        assistant.attach_lm_source(None)
        drafter.drafting_config = saved
    free = DrafterFreeAssistant.for_target(llama_target, lm_source=LMSource(tiny_llama(seed=5), EXACT))
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match="one sequence at a time"):
        llama_target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=free, do_sample=False, max_new_tokens=4)
    from hf_jetspec.assistant import DrafterFreeConfig

    with pytest.raises(ValueError, match="chain rounds"):
        DrafterFreeAssistant.for_target(llama_target, DrafterFreeConfig(tree=True), lm_source=tiny_llama(seed=5))


# ---------------------------------------------------------------------------- sampling: the target's law
def lm_empirical(target, assistant_model, stats_of, memory, **gen_kwargs):
    """Counts of the first NEW tokens over SAMPLES calls, and the LM tokens verified in them. The LM's
    gate is reopened before each call, so every call's first round weighs an LM chain (a gate shut by
    a sibling that disagrees would leave the law test without LM tokens)."""
    torch.manual_seed(1234)
    counts, lm_nodes = {}, 0
    for _ in range(SAMPLES):
        for bucket in range(4):
            memory.draft_gate(f"lm@{bucket}").reset()
        out = target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), assistant_model=assistant_model, do_sample=True,
                              max_new_tokens=NEW, min_new_tokens=NEW, **gen_kwargs)
        key = tuple(out[0, PROMPT.shape[1] :].tolist())
        counts[key] = counts.get(key, 0) + 1
        lm_nodes += stats_of().lm_nodes
    return counts, lm_nodes


@pytest.fixture(scope="module")
def vocab4():
    target = small_target()
    lm = small_target()
    with torch.no_grad():  # a sibling that agrees with the target often, not always
        for p in lm.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return target, sharpened(lm, 5.0)  # confident: the policy verifies its chains beside the drafter and the n-grams


def lm_drafter(target, lm, **changes):
    """A sharp drafter with ``lm`` attached. In chain rounds its blocks are priced low (a round picks
    one source, and a confident drafter would leave the LM few rounds); tree rounds graft both."""
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(tree_max_temperature=None, budget=3, **changes)
    assistant = assistant_for(drafter)
    if drafter.drafting_config.tree is None:
        assistant.sampled_acceptance_model = AcceptanceModel(weights=[-3.0, 0.0, 0.0, 0.0], temperature=1.0)
    assistant.attach_lm_source(lm, EXACT)
    return drafter


@pytest.mark.parametrize("tree", ["auto", None])
def test_sampled_rounds_with_an_lm_source_follow_the_exact_law(vocab4, tree):
    target, lm = vocab4
    drafter = lm_drafter(target, lm, tree=tree)
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts, lm_nodes = lm_empirical(target, drafter, lambda: drafter.generation_stats, assistant_for(drafter).output_memory, temperature=1.0, top_k=0)
    assert lm_nodes > 100  # LM tokens were verified, not gated away
    assert chi2_pvalue(law, counts) > 1e-3


def test_sampled_drafter_free_rounds_with_an_lm_source_follow_the_exact_law(vocab4):
    target, lm = vocab4
    free = DrafterFreeAssistant.for_target(target, lm_source=LMSource(lm, EXACT))
    law = exact_joint(target, [TemperatureLogitsWarper(0.7)])
    counts, lm_nodes = lm_empirical(target, free, lambda: free.generation_stats, free.output_memory, temperature=0.7, top_k=0)
    assert lm_nodes > 100
    assert chi2_pvalue(law, counts) > 1e-3
