"""Tree rounds inside generate: token-exact greedy output (shapes, budgets, EOS inside a branch,
stopping criteria, logits processors, max_new_tokens), the target's exact law when sampling, and a
wrong tree verifier that the same test rejects."""

from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import tiny_llama
from test_sampling_exactness import NEW, PROMPT, chi2_pvalue, count_top_p_rows, empirical, exact_joint, sharp_drafter, small_target
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

import hf_jetspec.generation.tree_decoding as td
from hf_jetspec import DraftingConfig, JetSpecDrafter
from hf_jetspec.assistant import assistant_for

SHAPES = ["auto", [3, 2, 1, 1], [1, 1, 1, 1, 1, 1, 1]]


@contextlib.contextmanager
def tree_options(drafter, **changes):
    saved = drafter.drafting_config
    drafter.drafting_config = saved.replace(**changes)
    try:
        yield drafter
    finally:
        drafter.drafting_config = saved


def greedy_pair(target, drafter, prompt, **kwargs):
    return target.generate(prompt, do_sample=False, **kwargs), target.generate(prompt, assistant_model=drafter, do_sample=False, **kwargs)


@pytest.mark.parametrize("rows", [[0], [0, 1, 2], [0, 2, 5], [0, 1, 4, 6]])
def test_cache_compaction_keeps_the_accepted_rows_in_order(rows):
    from transformers import DynamicCache

    from hf_jetspec.tools.testing import tiny_llama

    cache = DynamicCache(config=tiny_llama().config)
    gen = torch.Generator().manual_seed(0)
    for i in range(len(cache.layers)):
        cache.update(torch.randn(1, 2, 12, 4, generator=gen), torch.randn(1, 2, 12, 4, generator=gen), i)
    expected = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    td.keep_cache_rows(cache, 5, rows)
    keep = list(range(5)) + [5 + r for r in rows]
    for layer, (k, v) in zip(cache.layers, expected):
        assert torch.equal(layer.keys, k[:, :, keep]) and torch.equal(layer.values, v[:, :, keep])
    assert cache.get_seq_length() == 5 + len(rows)


def test_tree_option_is_validated():
    assert DraftingConfig(tree="off").tree is None and DraftingConfig(tree=(2, 1)).tree == [2, 1]
    with pytest.raises(ValueError, match="more than budget"):
        DraftingConfig(tree=[4, 4], budget=8)
    with pytest.raises(ValueError, match="widths"):
        DraftingConfig(tree="wide")
    with pytest.raises(ValueError, match="tree_max_temperature"):
        DraftingConfig(tree="auto", tree_max_temperature=-1)


def test_tree_rounds_run_up_to_the_temperature_limit(trained_llama):
    from transformers import GenerationConfig

    config = DraftingConfig(tree="auto", tree_max_temperature=0.5)
    assert config.tree_rounds_for(GenerationConfig(do_sample=False)) and config.tree_rounds_for(None)
    assert config.tree_rounds_for(GenerationConfig(do_sample=True, temperature=0.5))
    assert not config.tree_rounds_for(GenerationConfig(do_sample=True, temperature=0.7))
    assert DraftingConfig(tree="auto").tree_rounds_for(GenerationConfig(do_sample=True, temperature=1.5))
    assert not DraftingConfig().tree_rounds_for(GenerationConfig(do_sample=False))
    # the seam dispatches on it: chain rounds above the limit, tree rounds below
    target, drafter, prompts = trained_llama
    saved = drafter.drafting_config
    try:
        drafter.drafting_config = DraftingConfig(budget=8, tree="auto", tree_max_temperature=0.5)
        for temperature, trees in ((0.3, True), (0.9, False)):
            torch.manual_seed(0)
            target.generate(prompts[:1], assistant_model=drafter, do_sample=True, temperature=temperature, max_new_tokens=24)
            assert bool(drafter.generation_stats.tree_nodes) == trees, temperature
    finally:
        drafter.drafting_config = saved


def test_tree_rounds_run_up_to_the_context_limit(trained_llama):
    with pytest.raises(ValueError, match="tree_max_context"):
        DraftingConfig(tree="auto", tree_max_context=0)
    config = DraftingConfig(tree="auto", tree_max_context=8)
    assert config.tree_rounds_for(None, 8) and not config.tree_rounds_for(None, 9) and config.tree_rounds_for(None)
    assert DraftingConfig(tree="auto").tree_rounds_for(None, 10_000)
    # the seam dispatches on the prompt's length: chain rounds past the limit, tree rounds within it
    target, drafter, prompts = trained_llama
    saved = drafter.drafting_config
    try:
        for limit, trees in ((prompts.shape[1], True), (prompts.shape[1] - 1, False)):
            drafter.drafting_config = DraftingConfig(budget=8, tree="auto", tree_max_context=limit)
            ref = target.generate(prompts[:1], do_sample=False, max_new_tokens=24)
            out = target.generate(prompts[:1], assistant_model=drafter, do_sample=False, max_new_tokens=24)
            assert torch.equal(ref, out) and bool(drafter.generation_stats.tree_nodes) == trees, limit
    finally:
        drafter.drafting_config = saved


@pytest.mark.parametrize("policy", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("budget", [8, 16])
def test_tree_rounds_with_an_often_accepting_drafter_are_exact(trained_llama, shape, budget, policy, fixed_costs):
    target, drafter, prompts = trained_llama
    with tree_options(drafter, tree=shape, budget=budget, num_jacobi_passes=1, policy=policy):
        for p in range(4):
            ref, out = greedy_pair(target, drafter, prompts[p : p + 1], max_new_tokens=48)
            assert torch.equal(ref, out)
        stats = drafter.generation_stats
        assert stats.tau > 1.5 and len(stats.tree_nodes) == stats.rounds  # drafts really were accepted
        assert max(stats.tree_nodes) <= budget - 1


@pytest.mark.parametrize("tree_passes, expected", [(None, 2), (0, 0), (1, 1)])
def test_tree_rounds_run_their_own_jacobi_passes(trained_llama, fixed_costs, monkeypatch, tree_passes, expected):
    target, drafter, prompts = trained_llama
    seen, draft_topk = [], td.draft_topk

    def recording(*args):
        seen.append(args[6])  # passes
        return draft_topk(*args)

    monkeypatch.setattr(td, "draft_topk", recording)
    with tree_options(drafter, tree="auto", budget=8, num_jacobi_passes=2, tree_jacobi_passes=tree_passes, policy=False):
        assert drafter.drafting_config.tree_passes == expected
        ref, out = greedy_pair(target, drafter, prompts[:1], max_new_tokens=24)
        assert torch.equal(ref, out)
    assert seen and set(seen) == {expected}
    with pytest.raises(ValueError, match="tree_jacobi_passes"):
        DraftingConfig(tree_jacobi_passes=-1)


@pytest.mark.parametrize("policy", [False, True])
@pytest.mark.parametrize("budget", [8, 16])
def test_redrafted_branches_are_exact(trained_llama, budget, policy, fixed_costs):
    target, drafter, prompts = trained_llama
    with tree_options(drafter, tree="auto", budget=budget, tree_branches=3, num_jacobi_passes=1, policy=policy):
        for p in range(4):
            ref, out = greedy_pair(target, drafter, prompts[p : p + 1], max_new_tokens=48)
            assert torch.equal(ref, out)
        assert drafter.generation_stats.tau > 1.5


@pytest.mark.parametrize("target_fixture", ["llama_target", "qwen_target"])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 33])
def test_random_drafter_tree_rounds_are_exact_for_any_length(request, target_fixture, max_new_tokens):
    target = request.getfixturevalue(target_fixture)
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(target).eval()
    with tree_options(drafter, tree="auto", budget=9, num_jacobi_passes=2, tree_branches=max_new_tokens % 3, policy=max_new_tokens % 2 == 1):
        prompt = torch.randint(0, 100, (1, 7), generator=torch.Generator().manual_seed(max_new_tokens))
        ref, out = greedy_pair(target, drafter, prompt, max_new_tokens=max_new_tokens)
        assert torch.equal(ref, out) and out.shape[1] == 7 + max_new_tokens


def test_the_policy_grafts_ngram_branches_from_earlier_outputs(llama_target, fixed_costs):
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(llama_target).eval()  # an untrained drafter: only the n-gram branch can be right
    prompt = torch.randint(0, 100, (1, 7), generator=torch.Generator().manual_seed(5))
    with tree_options(drafter, tree="auto", budget=9, policy=True, ngram_seed=False):
        assistant_for(drafter).output_memory.clear()
        # n-gram positions priced at 1/9 before any is verified (later positions follow the first): the drafter's
        # nodes are verified beside them
        assistant_for(drafter).output_memory.prior = (1.0, 8.0)
        ref, first = greedy_pair(llama_target, drafter, prompt, max_new_tokens=40)
        first_tau = drafter.generation_stats.tau
        assert torch.equal(ref, first)
        again = llama_target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=40)
        stats = drafter.generation_stats
    assert torch.equal(ref, again)
    assert stats.tau > first_tau + 1.0  # the second call's continuation comes from the first call's output
    assert len(stats.chosen_lengths) == stats.rounds and stats.cost_model["verify_ms"]
    assert stats.cost_model["node_calibration"].get("drafter")  # verified drafter nodes were scored against the outcome


def test_eos_inside_a_branch_and_stopping_criteria(trained_llama, fixed_costs):
    target, drafter, prompts = trained_llama

    class EndsWith(StoppingCriteria):
        def __init__(self, pair):
            self.pair = torch.tensor(pair)

        def __call__(self, input_ids, scores, **kwargs):
            return (input_ids[:, -2:] == self.pair).all(-1)

    with tree_options(drafter, tree="auto", budget=16, num_jacobi_passes=1):
        for p in range(3):
            prompt = prompts[p : p + 1]
            free = target.generate(prompt, do_sample=False, max_new_tokens=40)[0, 8:]
            eos = int(free[9])
            ref, out = greedy_pair(target, drafter, prompt, max_new_tokens=40, eos_token_id=eos)
            assert torch.equal(ref, out) and int(out[0, -1]) == eos
            ref, out = greedy_pair(target, drafter, prompt, max_new_tokens=40, stopping_criteria=StoppingCriteriaList([EndsWith(free[12:14].tolist())]))
            assert torch.equal(ref, out)
        assert drafter.generation_stats.tau > 1.5  # tokens after the stop were in flight


def test_logits_processors_see_each_nodes_own_prefix():
    target = tiny_llama(seed=3)
    drafter = JetSpecDrafter.for_target(target).eval()
    prompt = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(3))
    with tree_options(drafter, tree=[3, 2, 1], budget=8):
        ref, out = greedy_pair(target, drafter, prompt, max_new_tokens=40, repetition_penalty=1.3, no_repeat_ngram_size=3)
        assert torch.equal(ref, out)


def test_streamer_gets_every_token_once(trained_llama):
    target, drafter, prompts = trained_llama

    class Collect:
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            pass

    streamer = Collect()
    with tree_options(drafter, tree="auto", budget=16):
        out = target.generate(prompts[:1], assistant_model=drafter, do_sample=False, max_new_tokens=30, streamer=streamer)
    assert streamer.chunks[0] == prompts[0].tolist()
    assert sum(streamer.chunks[1:], []) == out[0, 8:].tolist() and len(streamer.chunks) - 1 < 30


def test_unsupported_outputs_are_refused(llama_target):
    drafter = JetSpecDrafter.for_target(llama_target).eval()
    with tree_options(drafter, tree="auto"), pytest.raises(ValueError, match="output_scores"):
        llama_target.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, do_sample=False, max_new_tokens=4,
                              return_dict_in_generate=True, output_scores=True)


# ---------------------------------------------------------------------------- sampling
@pytest.fixture(scope="module")
def vocab4_target():
    return small_target()


def _tree_drafter(target):
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(tree="auto", budget=4, tree_top_k=3, tree_branches=1)
    return drafter


@pytest.mark.parametrize("policy", [False, True])
def test_tree_sampling_matches_the_exact_law(vocab4_target, policy):
    """Top-k trees of point masses (``sampled_drafts=False``), verified by the point-mass rule."""
    drafter = _tree_drafter(vocab4_target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=policy, sampled_drafts=False)
    law = exact_joint(vocab4_target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(vocab4_target, drafter, temperature=1.0, top_k=0)
    stats = drafter.generation_stats
    assert stats.rounds >= 1 and (policy or max(stats.tree_nodes) == 3)
    assert chi2_pvalue(law, counts) > 1e-3


def accept_an_undrawn_sibling(tree, probs, generator=None):
    """Deliberately wrong tree walk: it descends into the first child whichever token the target drew."""
    accepted, node = [], -1
    while True:
        v = int(torch.multinomial(probs[node + 1], 1))
        kids = tree.children(node)
        if v not in kids:
            return accepted, v
        node = next(iter(kids.values()))
        accepted.append(node)


def test_a_tree_verifier_that_accepts_an_undrawn_sibling_is_detected(vocab4_target, monkeypatch):
    monkeypatch.setattr(td, "accept_sampled", accept_an_undrawn_sibling)
    drafter = _tree_drafter(vocab4_target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=False)  # full top-k trees
    law = exact_joint(vocab4_target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(vocab4_target, drafter, temperature=1.0, top_k=0)
    assert chi2_pvalue(law, counts) < 1e-3


@pytest.mark.parametrize("kwargs", [{"temperature": 1.0, "top_k": 0}, {"temperature": 0.7, "top_k": 0, "top_p": 0.8}])
@pytest.mark.parametrize("policy", [False, True])
def test_sampled_tree_rounds_match_the_exact_law(vocab4_target, policy, kwargs):
    """Drafter nodes drawn from q, verified by multi-draft rejection in our own loop."""
    drafter = _tree_drafter(vocab4_target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=policy, sampled_drafts=True)
    processors = [TemperatureLogitsWarper(kwargs["temperature"])]
    if "top_p" in kwargs:
        processors.append(TopPLogitsWarper(kwargs["top_p"]))
    law = exact_joint(vocab4_target, processors)
    sources = {}
    counts = empirical(vocab4_target, drafter, sources=sources, **kwargs)
    if policy:  # drafted trees with n-gram point masses grafted in among the nodes drawn from q
        assert sources.get("drafter", 0) > 100 and sources.get("grafted", 0) > 100, sources
    else:
        assert drafter.generation_stats.sampled_drafts >= 1
    assert chi2_pvalue(law, counts) > 1e-3


def test_a_multidraft_verifier_without_the_residual_is_detected(vocab4_target, monkeypatch):
    import hf_jetspec.generation.tree as tree_mod

    monkeypatch.setattr(tree_mod, "_residual", lambda p, token, q: p)  # keeps verifying against p after a rejection
    drafter = _tree_drafter(vocab4_target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=True)
    law = exact_joint(vocab4_target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(vocab4_target, drafter, temperature=1.0, top_k=0)
    assert chi2_pvalue(law, counts) < 1e-3


def test_the_vocab4_law_covers_the_committed_length():
    assert NEW == 4 and PROMPT.shape == (1, 4)


@pytest.mark.slow
def test_real_smollm2_tree_rounds_with_the_shipped_drafter_are_exact(smollm2):
    from hf_jetspec.tools.targets import load_drafter_for

    model, tok = smollm2
    drafter, _ = load_drafter_for(model, "smollm2-135m", None)
    prompts = [
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
        "Write a Python function that checks whether a number is prime.",
    ]
    encoded = [tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
               for text in prompts]
    references = [model.generate(**enc, do_sample=False, max_new_tokens=48) for enc in encoded]  # plain decoding, once per prompt
    for shape, budget, policy in (("auto", 8, False), ("auto", 16, False), ("auto", 16, True), ([4, 2, 2, 1, 1], 16, False)):
        with tree_options(drafter, tree=shape, budget=budget, policy=policy):
            for text, enc, ref in zip(prompts, encoded, references):
                out = model.generate(**enc, assistant_model=drafter, do_sample=False, max_new_tokens=48)
                assert torch.equal(ref, out), (shape, budget, policy, text)
            assert drafter.generation_stats.tau > 1.0
    enc = tok.apply_chat_template([{"role": "user", "content": "Count from 1 to 30, separated by commas."}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    kwargs = dict(do_sample=False, max_new_tokens=60, stop_strings=["5. 5"], tokenizer=tok)
    with tree_options(drafter, tree="auto", budget=16):
        ref = model.generate(**enc, **kwargs)
        out = model.generate(**enc, assistant_model=drafter, **kwargs)
    assert torch.equal(ref, out) and tok.decode(out[0]).endswith("5. 5")


def test_sampled_tree_rounds_from_a_restricted_draft_vocabulary_match_the_exact_law(vocab4_target):
    drafter = _tree_drafter(vocab4_target)
    drafter.restrict_draft_vocab([0, 2, 3])
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=True)
    law = exact_joint(vocab4_target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(vocab4_target, drafter, temperature=1.0, top_k=0)
    assert drafter.generation_stats.sampled_drafts >= 1
    assert chi2_pvalue(law, counts) > 1e-3


@pytest.mark.parametrize("sampled_drafts", [False, True])
def test_sampled_tree_rounds_process_only_the_rows_they_read(vocab4_target, monkeypatch, sampled_drafts):
    """Same seeds, same tokens with each row processed when verification first reads it as with every
    node's row processed up front, and fewer rows processed: the nodes off the accepted path are never
    (the prefixes each row is processed with: the next test)."""
    calls = count_top_p_rows(monkeypatch)
    drafter = _tree_drafter(vocab4_target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=sampled_drafts)
    prompt = torch.tensor([[1, 3, 1, 3]])

    def run():
        outs, calls["n"] = [], 0
        for seed in range(12):
            torch.manual_seed(seed)
            out = vocab4_target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=drafter, do_sample=True,
                                         max_new_tokens=8, min_new_tokens=8, temperature=0.7, top_p=0.95, top_k=0,
                                         repetition_penalty=3.0)
            outs.append(out[0].tolist())
        assert drafter.generation_stats.tree_nodes  # tree rounds ran
        return outs, calls["n"]

    lazy, lazy_rows = run()
    monkeypatch.setattr(td, "row_pure", lambda processors: False)
    eager, eager_rows = run()
    assert lazy == eager
    assert lazy_rows < eager_rows


def test_processed_rows_are_the_rows_choose_gives():
    """Tree: root -> 5 (node 0) -> 7 (node 2), root -> 6 (node 1). Row r + 1 is processed with the
    sequence and node r's path: a recording processor sees exactly those prefixes, only for the rows
    read, and each row equals _choose's row bit for bit (a repetition penalty that reads the path)."""
    from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    from hf_jetspec.generation.tree import DraftTree

    tree = DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 0]), torch.tensor([1, 1, 2]))
    sequence = torch.tensor([1, 2, 3])
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 3
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(2.0), TemperatureLogitsWarper(0.7)])
    seen = []

    class Record:
        def __call__(self, input_ids, scores):
            seen.append(input_ids[0].tolist())
            return processors(input_ids, scores)

        def __len__(self):
            return len(processors)

    rows = td.ProcessedRows(logits, tree, sequence, Record())
    assert rows[3].shape == (16,)
    assert seen == [[1, 2, 3, 5, 7]]  # node 2's row only: the sequence, then 5, 7
    rows[0], rows[3]
    assert seen == [[1, 2, 3, 5, 7], [1, 2, 3]]  # each row processed once
    prefixes = [sequence, torch.tensor([1, 2, 3, 5]), torch.tensor([1, 2, 3, 6]), torch.tensor([1, 2, 3, 5, 7])]
    _, eager = td._choose(logits, prefixes, processors, do_sample=True)
    for r in range(4):
        assert torch.equal(rows[r], eager[r])
    _, flat = td._choose(logits, [sequence] * 4, processors, do_sample=True)
    assert any(not torch.equal(eager[r], flat[r]) for r in (1, 2, 3))  # the path matters here
