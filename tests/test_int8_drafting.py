"""int8 drafting (``DraftingConfig(int8=True)``): hand-checked arithmetic, a reversible switch that leaves
the saved weights alone, and generation that stays the target's own."""

import pytest
import torch
from torch import nn

from helpers import verified_context
from hf_jetspec import DraftingConfig, JetSpecDrafter
from hf_jetspec.drafter.int8_drafting import (
    check_int8_device,
    int8_linear,
    is_quantized,
    pack_weight,
    quantize_activation_rows,
    quantize_linear,
    restore_linear,
)


def test_activation_rows_hand_checked():
    a, scale = quantize_activation_rows(torch.tensor([[254.0, -127.0, 0.5], [0.0, 0.0, 0.0]]))
    # row 0: scale 254 / 127 = 2; -127 / 2 = -63.5 rounds half to even (-64); 0.5 / 2 = 0.25 -> 0
    assert torch.equal(a, torch.tensor([[127, -64, 0], [0, 0, 0]], dtype=torch.int8))
    assert scale[0, 0] == 2.0 and scale[1, 0] > 0  # an all-zero row gets a tiny positive scale, not 0/0


def test_int8_linear_hand_checked():
    # x = [127, -127]: scale 1, a = x. w rows [1, 0] and [0.5, 1]: both scale 1/127; 0.5 * 127 = 63.5 -> 64.
    # acc = [127*127, 127*64 - 127*127] = [16129, -8001]; y = acc / 127 = [127, -63] (float: [127, -63.5]).
    x = torch.tensor([[127.0, -127.0]])
    q_t, scale = pack_weight(torch.tensor([[1.0, 0.0], [0.5, 1.0]]))
    assert torch.equal(q_t, torch.tensor([[127, 64], [0, 127]], dtype=torch.int8))
    assert torch.allclose(int8_linear(x, q_t, scale), torch.tensor([[127.0, -63.0]]))


def test_int8_linear_close_to_float_keeps_shape_and_dtype():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 64, generator=g)
    w = torch.randn(48, 64, generator=g) / 8
    y = int8_linear(x, *pack_weight(w))
    ref = x @ w.T
    assert y.shape == (2, 5, 48) and y.dtype == x.dtype
    assert ((y - ref).norm() / ref.norm()) < 0.02  # two 8-bit roundings: about 1% relative error
    assert int8_linear(x.bfloat16(), *pack_weight(w)).dtype == torch.bfloat16


def test_quantized_linear_switches_and_restores():
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    x = torch.randn(3, 16)
    ref = lin(x)
    state = {k: v.clone() for k, v in lin.state_dict().items()}
    quantize_linear(lin)
    assert is_quantized(lin)
    y = lin(x)
    assert not torch.equal(y, ref) and torch.allclose(y, ref, atol=0.05)  # int8 ran, bias included
    assert lin.state_dict().keys() == state.keys() and all(torch.equal(lin.state_dict()[k], v) for k, v in state.items())
    restore_linear(lin)
    assert not is_quantized(lin) and torch.equal(lin(x), ref)
    restore_linear(lin)  # a no-op on a floating-point linear


def test_int8_only_on_cpu_and_options_are_checked():
    check_int8_device(torch.device("cpu"))
    for device in ("cuda", "meta"):
        with pytest.raises(ValueError, match="CPU only"):
            check_int8_device(torch.device(device))
    with pytest.raises(ValueError, match="int8 must be True or False"):
        DraftingConfig(int8="yes")
    with pytest.raises(ValueError, match="compile must be True or False"):
        DraftingConfig(compile=1)


def _copy(drafter, target):
    other = JetSpecDrafter(drafter.config.__class__(**drafter.config.to_dict()))
    other.load_state_dict(drafter.state_dict())
    other.attach_target(target)
    return other


def test_int8_drafter_drafts_differently_saves_the_same_and_switches_back(trained_llama, tmp_path):
    target, drafter, prompts = trained_llama
    d = _copy(drafter, target)
    n = 14
    seq, _, cache = verified_context(target, d, prompts[:1], n, new_tokens=12)
    block = seq[n - 1 : n + 6]
    _, ref = d.draft_block(cache, block, n - 1, return_logits=True)
    d.set_int8_drafting(True)
    assert d.int8_drafting and all(is_quantized(m) for layer in d.layers for m in layer.modules() if isinstance(m, nn.Linear))
    assert not is_quantized(d.fc)  # the context projection reads raw target states: kept in floating point
    _, q = d.draft_block(cache, block, n - 1, return_logits=True)
    assert not torch.equal(q, ref) and torch.allclose(q, ref, atol=0.1 * ref.abs().max())
    summary = d.draft_block_summary(cache, block, n - 1)[1]  # the policy's path reads the int8 head too
    assert torch.equal(summary.ids, q.max(-1).indices)
    d.save_pretrained(tmp_path)  # floating-point weights, as before the switch
    saved = JetSpecDrafter.from_pretrained(tmp_path)
    assert all(torch.equal(saved.state_dict()[k], v) for k, v in drafter.state_dict().items())
    d.set_int8_drafting(False)
    assert not d.int8_drafting and torch.equal(d.draft_block(cache, block, n - 1, return_logits=True)[1], ref)


@pytest.mark.parametrize("changes", [{"policy": False}, {"policy": True}, {"tree": "auto", "policy": True},
                                     {"policy": False, "compile": True}])
def test_int8_generation_is_the_targets_greedy_output(trained_llama, changes):
    target, drafter, prompts = trained_llama
    d = _copy(drafter, target)
    d.drafting_config = DraftingConfig(budget=8, num_jacobi_passes=1, int8=True, **changes)
    ref = target.generate(prompts[:2], do_sample=False, max_new_tokens=24)
    for i in range(2):
        assert torch.equal(target.generate(prompts[i : i + 1], assistant_model=d, do_sample=False, max_new_tokens=24), ref[i : i + 1])
    assert d.int8_drafting and d.generation_stats.drafted_tokens > 0
    if changes.get("compile"):
        from torch._dynamo.utils import counters

        assert d.__dict__["_compiled_step"].calls > 0  # the int8 products ran inside the compiled step
        graphs = counters["stats"]["unique_graphs"]
        target.generate(prompts[:1], assistant_model=d, do_sample=False, max_new_tokens=24)
        assert counters["stats"]["unique_graphs"] == graphs  # a new generate call (attach_target again) compiles nothing
    d.drafting_config = d.drafting_config.replace(int8=False, compile=False)
    target.generate(prompts[:1], assistant_model=d, do_sample=False, max_new_tokens=4)
    assert not d.int8_drafting  # each generate call sets the mode from its options


def test_attach_keeps_the_head_until_it_changes(trained_llama):
    target, drafter, _ = trained_llama
    d = _copy(drafter, target)
    d.restrict_draft_vocab(range(0, 128, 2))
    d.attach_target(target)
    d.set_int8_drafting(True)
    head, packed = d._head(), d.__dict__["_int8_head"].packed
    d.attach_target(target)
    assert d._head() is head and d.__dict__["_int8_head"].packed is packed  # nothing recomputed
    d.draft_vocab[0] = 2  # an in-place change of the draft vocabulary is seen
    d.attach_target(target)
    assert d._head() is not head and d.__dict__["_int8_head"].packed is not packed
    assert torch.equal(d._head()[0], target.get_output_embeddings().weight[2])
