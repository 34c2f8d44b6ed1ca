"""bf16 exactness, measured: tie margins, divergence scoring, and the teacher-forced check that fails on corruption."""

import pytest
import torch

from hf_jetspec import JetSpecDrafter
from hf_jetspec.tools.numerics import (
    Divergence,
    first_divergence,
    logit_noise,
    score_divergence,
    teacher_forced_gaps,
    tie_explained,
    tie_margin_from_noise,
)
from helpers import tiny_llama


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_tie_margin_quantile_and_explained_share():
    assert tie_margin_from_noise([0.0] * 999 + [10.0], 0.5) == 0.0
    assert tie_margin_from_noise(list(range(11)), 1.0) == 10.0
    divs = [Divergence(0, 3, 1, 2, 0.05), Divergence(1, 7, 4, 5, -0.2), Divergence(2, 9, 6, 7, 1.5)]
    assert tie_explained(divs, 0.25) == pytest.approx(2 / 3)
    assert tie_explained([], 0.25) == 1.0


def test_fp32_has_no_noise_in_exact_terms_and_bf16_has_some():
    target = tiny_llama(layers=2)
    ids = torch.randint(0, 128, (1, 40))
    fp32_noise = logit_noise(target, ids, 8, block=16)
    bf16_noise = logit_noise(target.to(torch.bfloat16), ids, 8, block=16)
    assert fp32_noise.shape == (32,)
    assert float(fp32_noise.max()) < 1e-4
    assert float(bf16_noise.max()) > float(fp32_noise.max())


def test_bf16_speculative_output_is_argmax_or_tie_and_corruption_is_caught():
    fp32_target = tiny_llama(seed=3)
    target = tiny_llama(seed=3).to(torch.bfloat16)
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(fp32_target).eval()
    prompt = torch.randint(0, 128, (1, 8))
    out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=40)
    tokens = out[0, 8:].tolist()
    reference = target.generate(prompt, do_sample=False, max_new_tokens=40)
    noise = torch.cat([logit_noise(target, reference, 8, block=16), logit_noise(target, out, 8, block=16)])
    margin = tie_margin_from_noise(noise, 0.999)
    gaps = teacher_forced_gaps(target, prompt, tokens)
    assert float(gaps.max()) <= margin + 1e-6  # every committed token is the argmax or within the tie margin
    corrupt = list(tokens)
    logits = target(out).logits[0, 8 + 9].float()
    corrupt[10] = int(logits.argmin())  # the least likely token at position 10
    assert float(teacher_forced_gaps(target, prompt, corrupt)[10]) > margin
    d = score_divergence(fp32_target, prompt, tokens, corrupt, 0)
    assert d.position == 10 and d.fp32_margin > margin


def test_upcast_head_gives_fp32_logits_and_keeps_generation_working():
    from hf_jetspec.tools.numerics import upcast_head

    target = tiny_llama(seed=5).to(torch.bfloat16)
    ids = torch.randint(0, 128, (1, 10))
    before = target(ids).logits
    upcast_head(target)
    upcast_head(target)  # idempotent
    after = target(ids).logits
    assert before.dtype == torch.bfloat16 and after.dtype == torch.float32
    assert float((after - before.float()).abs().max()) < 0.1  # the same logits, with fp32 resolution
    drafter = JetSpecDrafter.for_target(tiny_llama(seed=5)).eval()
    out = target.generate(ids, assistant_model=drafter, do_sample=False, max_new_tokens=16)
    assert out.shape[1] == 26
