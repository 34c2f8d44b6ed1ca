"""Training-block construction and label rules on hand-checkable numbers."""

import math

import torch

from hf_jetspec.training.blocks import build_block_inputs, clean_prefix_schedule, leading_matches, sample_anchor_positions, slot_weights
from hf_jetspec.training.labels import survival_gate
from hf_jetspec.training.losses import divergence


def test_clean_prefix_schedule_covers_every_length():
    assert clean_prefix_schedule(5, 3).tolist() == [0, 1, 2, 0, 1]
    assert clean_prefix_schedule(4, 4, offset=2).tolist() == [2, 3, 0, 1]
    assert set(clean_prefix_schedule(16, 15).tolist()) == set(range(15))


def test_slot_weights():
    w = slot_weights(3, 7.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-1 / 7), math.exp(-2 / 7)]))
    assert torch.equal(slot_weights(2, None), torch.ones(2))


def test_anchor_positions_stay_in_range():
    g = torch.Generator().manual_seed(0)
    a = sample_anchor_positions(torch.tensor([5, 0]), torch.tensor([40, 20]), 200, 4, g)
    assert a.shape == (2, 200)
    assert a[0].min() >= 5 and a[0].max() <= 40 - 4 - 1 and a[1].max() <= 20 - 5
    assert len(set(a[0].tolist())) > 20


def test_block_inputs_clean_prefix_then_context_noise():
    seq = torch.arange(100, 130)[None]  # tokens 100..129 at positions 0..29
    anchors = torch.tensor([[10, 20]])
    g = torch.Generator().manual_seed(0)
    inputs, noise = build_block_inputs(seq, anchors, torch.tensor([2, 0]), 5, g)
    assert inputs[0, 0, :3].tolist() == [110, 111, 112]  # anchor + 2 clean
    assert noise[0, 0].tolist() == [False, False, False, True, True]
    assert all(100 <= t < 110 for t in inputs[0, 0, 3:].tolist())  # noise from the context before the anchor
    assert inputs[0, 1, 0].item() == 120 and noise[0, 1].tolist() == [False, True, True, True, True]
    assert all(100 <= t < 120 for t in inputs[0, 1, 1:].tolist())


def test_survival_gate():
    # corpus tokens at slots 1..3 have target probability 0.5, 0.4, 0.9
    g = survival_gate(torch.tensor([0.5, 0.4, 0.9]))
    assert torch.allclose(g, torch.tensor([1.0, 0.5, 0.2]))


def test_divergences():
    p = torch.log(torch.tensor([[0.5, 0.5]]))
    q = torch.log(torch.tensor([[0.25, 0.75]]))
    fkl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    rkl = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert divergence(p, q, "forward_kl").item() == pytest_approx(fkl)
    assert divergence(p, q, "reverse_kl").item() == pytest_approx(rkl)
    assert divergence(torch.tensor([[0.0, 1.0]]), q, "cross_entropy").item() == pytest_approx(-math.log(0.75))
    assert divergence(p, p, "forward_kl").item() == pytest_approx(0.0)


def pytest_approx(x):
    import pytest

    return pytest.approx(x, abs=1e-6)


def test_leading_matches():
    pred = torch.tensor([[1, 2, 3, 4], [1, 9, 3, 4], [0, 2, 3, 4]])
    ref = torch.tensor([1, 2, 3, 4])
    assert leading_matches(pred, ref.expand(3, -1)).tolist() == [4, 1, 0]
