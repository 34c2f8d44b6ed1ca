"""The generation seam: narrow, reversible, and inert for other assistants."""

import torch
from transformers.generation.utils import GenerationMixin

from hf_jetspec import seam
from helpers import tiny_llama


def test_installed_on_import_and_reversible(llama_target):
    assert seam.is_installed()
    wrapped = GenerationMixin._get_candidate_generator
    seam.uninstall()
    try:
        assert not seam.is_installed()
        assert GenerationMixin._get_candidate_generator is not wrapped
        assert not hasattr(GenerationMixin._get_candidate_generator, "__wrapped__")
    finally:
        seam.install()
    assert seam.is_installed()
    seam.install()  # idempotent: no double wrapping
    assert not hasattr(GenerationMixin._get_candidate_generator.__wrapped__, "__wrapped__")


def test_other_assistants_untouched(llama_target):
    """Classic assisted decoding and prompt lookup still take transformers' own path."""
    small = tiny_llama(seed=9, layers=2)
    prompt = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    ref = llama_target.generate(prompt, do_sample=False, max_new_tokens=20)
    assert torch.equal(llama_target.generate(prompt, assistant_model=small, do_sample=False, max_new_tokens=20), ref)
    assert torch.equal(llama_target.generate(prompt, prompt_lookup_num_tokens=3, do_sample=False, max_new_tokens=20), ref)


def test_stats_reset_per_call(trained_llama):
    target, drafter, prompts = trained_llama
    target.generate(prompts[:1], assistant_model=drafter, do_sample=False, max_new_tokens=30)
    first = drafter.generation_stats
    target.generate(prompts[:1], assistant_model=drafter, do_sample=False, max_new_tokens=10)
    second = drafter.generation_stats
    assert second is not first and second.committed_tokens == 9
    assert second.draft_time_s > 0 and second.verify_time_s > 0
    assert sum(second.accept_length_hist) == second.rounds
