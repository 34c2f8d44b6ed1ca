"""Compiled rounds on a static cache: the bucket and mask arithmetic, greedy output identical to
compiled plain decoding (two architectures, drafter and drafter-free), no graph compiled after the
warm-up, the target's exact law when sampling, and clear refusals."""

from __future__ import annotations

import pytest
import torch
from test_architectures import PROMPTS, build
from test_sampling_exactness import chi2_pvalue, empirical, exact_joint, sharp_drafter, small_target
from transformers import CompileConfig
from transformers.generation.logits_process import TemperatureLogitsWarper

from hf_jetspec import DraftingConfig, JetSpecDrafter
from hf_jetspec.assistant import DrafterFreeAssistant, DrafterFreeConfig
from hf_jetspec.generation.static_rounds import (RUNNERS_ATTRIBUTE, bucket_for, capacity_for, default_buckets, static_greedy,
                                                 static_target_for, static_verification_mask)
from hf_jetspec.generation.tree import DraftTree, tree_attention_mask

BACKEND = "aot_eager"  # traced and partitioned like inductor's input, without generating code: fast, same graphs


def compiled_plain(target, prompt, backend=BACKEND, **kwargs):
    """transformers' own plain decoding on a static cache with the forward compiled by ``backend``."""
    config = CompileConfig(fullgraph=False, dynamic=False, backend=backend, mode=None)
    config._compile_all_devices = True
    return target.generate(prompt, do_sample=False, cache_implementation="static", compile_config=config, **kwargs)


def runner_of(target):
    return next(iter(target.__dict__[RUNNERS_ATTRIBUTE].values()))


# ---------------------------------------------------------------------------- arithmetic
def test_buckets_hold_the_widest_round_and_the_cheapest_measured_one_wins():
    assert default_buckets(16) == (1, 8, 16) and default_buckets(33) == (1, 8, 16, 32, 64) and default_buckets(1) == (1,)
    assert [bucket_for(w, (1, 8, 16)) for w in (1, 2, 8, 9, 16)] == [1, 8, 8, 16, 16]
    # measured on a 2-core CPU in bf16 (SmolLM2-135M): 8 rows cost less than 1, so a plain step runs padded to 8
    seconds = {1: 0.048, 8: 0.038, 16: 0.045}
    assert [bucket_for(w, (1, 8, 16), seconds) for w in (1, 5, 9)] == [8, 8, 16]
    assert bucket_for(3, (1, 8, 16), {1: 0.01, 8: 0.02, 16: 0.02}) == 8  # a tie goes to the smaller bucket
    with pytest.raises(ValueError, match="fits no compiled bucket"):
        bucket_for(17, (1, 8, 16))
    assert capacity_for(1) == 512 and capacity_for(1024) == 1024 and capacity_for(1025) == 1536


def test_the_static_mask_hides_padding_and_stale_rows():
    # root 0, node 0 under it, node 1 a sibling of node 0: rows see the context, their ancestors and themselves
    tree = DraftTree(torch.tensor([5, 6]), torch.tensor([-1, -1]), torch.tensor([1, 1]))
    inner = tree_attention_mask(tree)
    mask = static_verification_mask(inner, context=3, bucket=4, capacity=10)[0, 0].int().tolist()
    assert mask == [[1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
                    [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
                    [1, 1, 1, 1, 0, 1, 0, 0, 0, 0],
                    [0, 0, 0, 0, 0, 0, 1, 0, 0, 0]]  # the padded row sees itself only
    with pytest.raises(ValueError, match="do not fit"):
        static_verification_mask(inner, context=8, bucket=4, capacity=10)


def test_options_are_validated():
    with pytest.raises(ValueError, match="tree rounds"):
        DraftingConfig(compiled_rounds=True)
    with pytest.raises(ValueError, match="chain rounds only"):
        DraftingConfig(compiled_rounds=True, tree="auto", foresight=True)
    with pytest.raises(ValueError, match="positive widths"):
        DraftingConfig(compile_buckets=[0, 8])
    with pytest.raises(ValueError, match="tree=True"):
        DrafterFreeConfig(compiled_rounds=True)
    options = DraftingConfig(compiled_rounds=True, tree="auto", tree_max_temperature=0.5, tree_max_context=4)
    sampled = type("G", (), {"do_sample": True, "temperature": 1.0})()
    assert options.tree_rounds_for(sampled, 100)  # every round goes through the compiled tree loop
    assert options.max_verify_width == 16 and options.replace(tree_nodes=32).max_verify_width == 33


# ---------------------------------------------------------------------------- greedy identity
@pytest.fixture(scope="module", params=["llama", "qwen2"])
def family_target(request):
    return build(request.param, seed=3)


def test_greedy_output_is_compiled_plain_decoding_and_nothing_compiles_after_warmup(family_target):
    target = family_target
    torch.manual_seed(1)
    drafter = JetSpecDrafter.for_target(target).eval()
    drafter.drafting_config = drafter.drafting_config.replace(budget=6, tree="auto", compiled_rounds=True, compile_backend=BACKEND)
    first = target.generate(PROMPTS[0], do_sample=False, max_new_tokens=40, assistant_model=drafter)
    runner = runner_of(target)
    graphs = runner.compiles
    assert graphs >= len(runner.buckets) and runner.buckets == (1, 8)  # budget 6: widths up to 6
    for prompt, new in ((PROMPTS[0], 40), (PROMPTS[1], 40), (PROMPTS[1], 25)):  # other lengths, the same graphs
        plain = target.generate(prompt, do_sample=False, max_new_tokens=new)
        assert torch.equal(compiled_plain(target, prompt, max_new_tokens=new), plain)
        out = target.generate(prompt, do_sample=False, max_new_tokens=new, assistant_model=drafter)
        assert torch.equal(out, plain)
    assert torch.equal(first, target.generate(PROMPTS[0], do_sample=False, max_new_tokens=40))
    assert runner.compiles == graphs and runner.calls > 0
    stats = drafter.generation_stats
    assert stats.rounds > 0 and stats.tree_nodes and max(stats.chosen_lengths) >= 1


def test_a_longer_call_builds_a_larger_cache_and_stays_exact():
    target = build("llama", seed=4)
    drafter = JetSpecDrafter.for_target(target).eval()
    drafter.drafting_config = drafter.drafting_config.replace(budget=6, tree="auto", compiled_rounds=True, compile_backend=BACKEND)
    assert torch.equal(target.generate(PROMPTS[1], do_sample=False, max_new_tokens=20, assistant_model=drafter),
                       target.generate(PROMPTS[1], do_sample=False, max_new_tokens=20))
    assert runner_of(target).capacity == 512
    long = target.generate(PROMPTS[1], do_sample=False, max_new_tokens=500, assistant_model=drafter)  # 24 + 500 + 8 > 512
    assert max(r.capacity for r in target.__dict__[RUNNERS_ATTRIBUTE].values()) == 1024
    assert torch.equal(long, target.generate(PROMPTS[1], do_sample=False, max_new_tokens=500))


def test_drafter_free_compiled_tree_rounds_are_exact(family_target):
    target = family_target
    free = DrafterFreeAssistant.for_target(target, DrafterFreeConfig(budget=6, tree=True, compiled_rounds=True, compile_backend=BACKEND))
    for prompt in PROMPTS:
        plain = target.generate(prompt, do_sample=False, max_new_tokens=40)
        for _ in range(2):  # the second call proposes from the first's output
            assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=40, assistant_model=free), plain)
    assert free.generation_stats.tree_nodes and sum(free.generation_stats.accepted_lengths) > 0


def test_accepted_rows_move_into_place_in_the_static_cache(llama_target):
    runner = static_target_for(llama_target, 64, 8, [1], backend=BACKEND)
    with torch.no_grad():
        runner.prefill(torch.tensor([[1, 2, 3, 4]]))
        for layer in runner.cache.layers:  # rows 4.. hold their own index
            layer.keys[:, :, 4:12] = torch.arange(8.0)[None, None, :, None] + 4
        runner.keep_rows(4, [0, 2, 5])
    keys = runner.cache.layers[0].keys[0, 0, :, 0]
    assert keys[4:7].tolist() == [4.0, 6.0, 9.0] and runner.length() == 7


def test_static_greedy_is_plain_greedy_decoding_and_stops_at_eos(family_target):
    target = family_target
    for prompt in PROMPTS:
        plain = target.generate(prompt, do_sample=False, max_new_tokens=30)
        assert torch.equal(static_greedy(target, prompt, 30, [], BACKEND), plain)
        eos = int(plain[0, prompt.shape[1] + 4])  # the fifth new token ends the answer
        stopped = target.generate(prompt, do_sample=False, max_new_tokens=30, eos_token_id=eos)
        assert torch.equal(static_greedy(target, prompt, 30, [eos], BACKEND), stopped)


# ---------------------------------------------------------------------------- real compiler, fp32
def test_inductor_rounds_write_what_inductor_plain_decoding_writes():
    """The real compiler (generated kernels, frozen weights): compiled rounds against transformers'
    compiled plain decoding, in fp32."""
    target = build("llama", seed=5)
    torch.manual_seed(2)
    drafter = JetSpecDrafter.for_target(target).eval()
    drafter.drafting_config = drafter.drafting_config.replace(budget=6, tree="auto", compiled_rounds=True)
    plain = compiled_plain(target, PROMPTS[1], backend="inductor", max_new_tokens=32)
    for _ in range(2):
        assert torch.equal(target.generate(PROMPTS[1], do_sample=False, max_new_tokens=32, assistant_model=drafter), plain)
    runner = runner_of(target)
    assert runner.compiles == len(runner.buckets) and set(runner.seconds) == set(runner.buckets)


# ---------------------------------------------------------------------------- sampling and refusals
@pytest.mark.parametrize("sampled_drafts", [False, True], ids=["point-masses", "drafts-from-q"])
def test_compiled_sampled_rounds_match_the_exact_law(sampled_drafts):
    target = small_target()
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(tree="auto", budget=4, tree_top_k=3, compiled_rounds=True,
                                                              compile_backend="eager", sampled_drafts=sampled_drafts)
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(target, drafter, temperature=1.0, top_k=0)
    assert drafter.generation_stats.tree_nodes and chi2_pvalue(law, counts) > 1e-3
    assert runner_of(target).compiles == len(runner_of(target).buckets)


def test_batched_drafter_free_calls_are_refused_in_compiled_mode(llama_target):
    free = DrafterFreeAssistant.for_target(llama_target, DrafterFreeConfig(tree=True, compiled_rounds=True, compile_backend=BACKEND))
    prompts = torch.cat([PROMPTS[0][:, :12], PROMPTS[1][:, :12]])
    with pytest.raises(ValueError, match="one sequence at a time"):
        llama_target.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False, max_new_tokens=4, assistant_model=free)


def test_sliding_window_targets_are_refused_by_name():
    target = build("mistral")
    drafter = JetSpecDrafter.for_target(target).eval()
    drafter.drafting_config = drafter.drafting_config.replace(budget=6, tree="auto", compiled_rounds=True, compile_backend=BACKEND)
    with pytest.raises(ValueError, match="MistralForCausalLM has sliding-window layers"):
        target.generate(PROMPTS[0], do_sample=False, max_new_tokens=8, assistant_model=drafter)
