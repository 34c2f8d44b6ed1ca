"""Foresight drafting inside generate: token-exact greedy output whatever the predictions are."""

import pytest
import torch

from hf_jetspec import DraftingConfig, JetSpecDrafter
from hf_jetspec.foresight import ForesightAdapter, ForesightEngine, LayerSkipAdapter, SpeculationCache
from hf_jetspec.foresight.cache import CachedBlock
from hf_jetspec.assistant import assistant_for


@pytest.fixture(params=["trained", "layer-skip"])
def setup(trained_llama, request):
    target, drafter, prompts = trained_llama
    saved = drafter.drafting_config
    if request.param == "trained":
        adapter = ForesightAdapter.for_drafter(drafter, layers_per_module=2).eval()
    else:  # every layer but the first: exact context, one skipped layer
        adapter = LayerSkipAdapter.for_drafter(drafter, list(range(1, max(drafter.config.target_layer_ids) + 1)))
    assistant_for(drafter).attach_foresight(adapter)
    yield target, drafter, prompts
    drafter.drafting_config = saved
    assistant_for(drafter).foresight = None


def run(target, drafter, prompts, n=3, max_new_tokens=40, **options):
    drafter.drafting_config = DraftingConfig(**options)
    stats = []
    for i in range(n):
        prompt = prompts[i : i + 1]
        ref = target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens)
        out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens)
        assert torch.equal(ref, out), f"prompt {i}: foresight changed the output"
        stats.append(drafter.generation_stats)
    return stats


@pytest.mark.parametrize("pipeline", ["off", "thread"])
@pytest.mark.parametrize("passes,refreshes,cache_size", [(0, 0, 1), (1, 0, 4), (2, 1, 4), (1, 1, 16)])
def test_foresight_is_exact(setup, pipeline, passes, refreshes, cache_size):
    target, drafter, prompts = setup
    stats = run(target, drafter, prompts, budget=8, num_jacobi_passes=passes, num_context_refreshes=refreshes,
                foresight=True, cache_size=cache_size, pipeline=pipeline, record_rounds=True)
    s = stats[0]
    # every round but the first (and a last one with no room to draft) looks its outcome up
    assert s.rounds - 2 <= s.cache_lookups <= s.rounds - 1
    assert len(s.outcomes) == s.cache_lookups
    assert all(r.realized is not None for r in s.foresight_records)
    assert all(len(r.selected) <= cache_size for r in s.foresight_records)
    assert s.worker_failures == 0


def test_some_outcomes_are_pre_drafted(setup):
    target, drafter, prompts = setup
    stats = run(target, drafter, prompts, n=4, budget=8, num_jacobi_passes=1, foresight=True, cache_size=16, pipeline="off")
    assert sum(s.cache_hits for s in stats) > 0  # hits really happen, so the hit path is exercised


@pytest.mark.parametrize("replacement", [True, False])
def test_context_refresh_without_foresight_is_exact(setup, replacement):
    target, drafter, prompts = setup
    stats = run(target, drafter, prompts, budget=8, num_jacobi_passes=2, num_context_refreshes=2, anchor_replacement=replacement)
    assert stats[0].refreshes > 0
    assert stats[0].cache_lookups == 0
    if not replacement:
        assert stats[0].anchor_replacements == 0


def test_forced_misses_and_garbage_hits_stay_exact(setup, monkeypatch):
    target, drafter, prompts = setup
    monkeypatch.setattr(SpeculationCache, "lookup", lambda self, k, a: None)
    stats = run(target, drafter, prompts, budget=8, foresight=True, pipeline="thread")
    assert all(s.cache_hits == 0 for s in stats)
    monkeypatch.undo()

    def garbage(self, k, a):
        self.lookups += 1
        return CachedBlock(k=k, anchor=a, tokens=torch.randint(0, 128, (7,)), logits=torch.randn(7, 128))

    monkeypatch.setattr(SpeculationCache, "lookup", garbage)
    stats = run(target, drafter, prompts, budget=8, foresight=True, pipeline="thread")
    assert all(s.cache_hits == s.cache_lookups > 0 for s in stats)


@pytest.mark.parametrize("pipeline", ["off", "thread"])
def test_failing_worker_never_changes_output(setup, monkeypatch, pipeline):
    target, drafter, prompts = setup

    def boom(self, *args, **kwargs):
        raise RuntimeError("draft worker failed")

    monkeypatch.setattr(ForesightEngine, "predraft", boom)
    stats = run(target, drafter, prompts, budget=8, foresight=True, pipeline=pipeline)
    assert all(s.worker_failures > 0 and s.cache_hits == 0 for s in stats)


@pytest.mark.parametrize("tree", ["auto", [2, 1]])
def test_foresight_with_trees_falls_back_to_chains_with_one_log_line(setup, tree):
    """Trees are the shipped default; asking for foresight runs chain rounds (with foresight) instead of an error."""
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    from hf_jetspec.generation import seam

    target, drafter, prompts = setup
    config = DraftingConfig(budget=8, num_jacobi_passes=1, foresight=True, cache_size=4, pipeline="off", tree=tree)
    assert not config.runs_tree_rounds and "foresight" in config.tree_fallback_reason
    assert DraftingConfig(tree=tree).runs_tree_rounds
    seam.logger.warning_once.cache_clear()
    with CaptureLogger(logging.get_logger(seam.__name__)) as captured:
        stats = run(target, drafter, prompts, n=2, budget=8, num_jacobi_passes=1, foresight=True, cache_size=4, pipeline="off",
                    tree=tree)
    assert captured.out.count("falls back to chain rounds: foresight run in chain rounds only") == 1
    assert all(s.cache_lookups > 0 for s in stats)  # foresight really ran


def test_foresight_needs_an_adapter(llama_target):
    drafter = JetSpecDrafter.for_target(llama_target)
    drafter.drafting_config = DraftingConfig(foresight=True)
    with pytest.raises(ValueError, match="attach_foresight"):
        llama_target.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, do_sample=False, max_new_tokens=5)


def test_drafting_options_are_validated():
    with pytest.raises(ValueError, match="num_context_refreshes"):
        DraftingConfig(num_jacobi_passes=1, num_context_refreshes=2)
    with pytest.raises(ValueError, match="cache_size"):
        DraftingConfig(cache_size=0)
    with pytest.raises(ValueError, match="pipeline"):
        DraftingConfig(pipeline="gpu")


def test_record_fit_and_serve_calibrated_rule(setup, tmp_path):
    """Rounds recorded on some prompts fit a calibration that then serves other prompts, exactly."""
    from hf_jetspec.foresight import ForesightCalibration
    from hf_jetspec.foresight.calibrate import fit_calibration, record_rounds

    target, drafter, prompts = setup
    drafter.drafting_config = DraftingConfig(budget=8, num_jacobi_passes=1)
    items = [(str(i), prompts[i : i + 1]) for i in range(4, 10)]
    records = record_rounds(target, assistant_for(drafter), items, max_new_tokens=40, progress=False)
    assert len(records) > 20 and all(r.realized is not None for r in records)
    cal = fit_calibration(records, miscoverage=0.2, budget=8)
    cal.save(tmp_path)
    assistant_for(drafter).attach_foresight(assistant_for(drafter).foresight[0], ForesightCalibration.load(tmp_path))
    for conformal in (False, True):
        stats = run(target, drafter, prompts, budget=8, foresight=True, cache_size=4, conformal=conformal, record_rounds=True)
        assert all(len(r.selected) <= 4 for s in stats for r in s.foresight_records)
