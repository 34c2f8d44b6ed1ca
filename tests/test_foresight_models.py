"""ForesightAdapter and ForesightDecoder on tiny targets."""

import pytest
import torch

from helpers import tiny_llama, tiny_qwen2

from hf_jetspec import JetSpecDrafter
from hf_jetspec.foresight.configuration_adapter import default_source_layers
from hf_jetspec.foresight.decoder import ForesightDecoder
from hf_jetspec.foresight.modeling_adapter import ForesightAdapter
from hf_jetspec.training.losses import gap_recovered, state_prediction_loss
from hf_jetspec.assistant import assistant_for


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_decoder_on_true_states_is_the_target(make):
    """Fed the target's true states, the decoder returns the target's own logits (a perfect decoder)."""
    target = make().eval()
    ids = torch.randint(0, target.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    deepest = 1
    dec = ForesightDecoder(target, deepest)
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    n = 12
    cache = dec.new_cache()
    dec.append_context(cache, [out.hidden_states[i][:, :n] for i in dec.state_indices], torch.arange(n))
    logits = dec.logits(cache, out.hidden_states[deepest + 1][:, n:], torch.tensor([n]))
    torch.testing.assert_close(logits, out.logits[:, n:], atol=1e-4, rtol=1e-4)


def test_adapter_inference_matches_training_path_and_round_trips(tmp_path):
    target = tiny_llama().eval()
    drafter = JetSpecDrafter.for_target(target)
    adapter = ForesightAdapter.for_drafter(drafter, layers_per_module=1).eval()
    assert adapter.config.source_layers == default_source_layers(drafter.config.target_layer_ids, 1)
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(1))
    layer_ids = drafter.config.target_layer_ids
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    states = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    n, length = 15, 6
    cache = adapter.new_cache()
    adapter.append_context(cache, states[:, :n], torch.arange(n))
    pred = adapter.predict(cache, ids[:, n : n + length], torch.tensor([n]))
    with torch.no_grad():
        train = adapter(states, ids[:, n : n + length][:, None], torch.tensor([[n]]))
    torch.testing.assert_close(pred, train[:, 0], atol=1e-5, rtol=1e-5)
    assert pred.shape == (1, length, len(layer_ids) * 64)
    # predicted context rows: a block that sees them equals a block run with those rows in the cache
    extra = adapter.extra_context(pred[:, :2], torch.tensor([n, n + 1]))
    with_extra = adapter.predict(cache, ids[:, n + 2 : n + 5], torch.tensor([n + 2]), (extra, torch.ones(1, 2, dtype=torch.bool)))
    cache2 = adapter.new_cache()
    adapter.append_context(cache2, torch.cat([states[:, :n], pred[:, :2]], dim=1), torch.arange(n + 2))
    torch.testing.assert_close(with_extra, adapter.predict(cache2, ids[:, n + 2 : n + 5], torch.tensor([n + 2])), atol=1e-5, rtol=1e-5)

    adapter.save_pretrained(tmp_path)
    again = ForesightAdapter.from_pretrained(tmp_path)
    again.attach_target(target)
    for a, b in zip(adapter.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    assert not any("embed" in k for k in again.state_dict())


def test_adapter_refuses_wrong_target_and_drafter():
    target = tiny_llama()
    adapter = ForesightAdapter.for_target(target, target_layer_ids=[1, 2])
    with pytest.raises(ValueError, match="ForesightAdapter was built for"):
        adapter.attach_target(tiny_qwen2())
    with pytest.raises(ValueError, match="predicts target layers"):
        adapter.check_drafter(JetSpecDrafter.for_target(target, target_layer_ids=[0, 2]))


def test_loss_and_gap_hand_numbers():
    true = torch.tensor([[1.0, 0.0]])
    assert state_prediction_loss(true, true).item() == pytest.approx(0.0)
    # smooth L1 of (0, 1) vs (1, 0): 0.5 per coordinate -> mean 0.5; cosine distance 1
    assert state_prediction_loss(torch.tensor([[0.0, 1.0]]), true).item() == pytest.approx(1.5)
    copy = torch.tensor([[0.0, 0.0]])
    assert gap_recovered(torch.tensor([[0.5, 0.0]]), true, copy) == pytest.approx(0.75)
    assert gap_recovered(true, true, copy) == pytest.approx(1.0)


def test_layer_ranges_and_read_layer_sources():
    from hf_jetspec.foresight.layer_skip import parse_layer_ranges, read_layer_sources

    assert parse_layer_ranges("0-2, 5,7-8") == [0, 1, 2, 5, 7, 8]
    assert parse_layer_ranges("3,1-3") == [1, 2, 3]
    with pytest.raises(ValueError):
        parse_layer_ranges("4-2")
    # read layers 1, 8, 14 with layers 0..2 and 12..14 kept: 2, 3 and 6 kept layers have run
    assert read_layer_sources([1, 8, 14], [0, 1, 2, 12, 13, 14]) == [2, 3, 6]
    assert read_layer_sources([1], [5]) == [0]  # nothing kept below: the embeddings


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_layer_skip_adapter_with_every_layer_is_exact(make, tmp_path):
    """Keeping every layer up to the deepest read layer, the predicted states are the true ones."""
    from hf_jetspec.foresight import LayerSkipAdapter

    target = make().eval()
    drafter = JetSpecDrafter.for_target(target)
    layer_ids = drafter.config.target_layer_ids
    adapter = LayerSkipAdapter.for_drafter(drafter, f"0-{max(layer_ids)}")
    ids = torch.randint(0, target.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    states = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    n = 15
    cache = adapter.new_cache()
    adapter.append_context(cache, states[:, :n], torch.arange(n), [out.hidden_states[i][:, :n] for i in adapter.state_indices])
    pred, inputs = adapter.predict(cache, ids[:, n:], torch.tensor([n]), return_layer_inputs=True)
    torch.testing.assert_close(pred, states[:, n:], atol=1e-4, rtol=1e-4)
    # predicted rows as extra context equal the same rows in the cache
    extra = adapter.extra_context(pred[:, :2], torch.tensor([n, n + 1]), [h[:, :2] for h in inputs])
    with_extra = adapter.predict(cache, ids[:, n + 2 :], torch.tensor([n + 2]), (extra, torch.ones(1, 2, dtype=torch.bool)))
    torch.testing.assert_close(with_extra, states[:, n + 2 :], atol=1e-4, rtol=1e-4)
    # skipping a layer changes the prediction (the test above can fail)
    skipped = LayerSkipAdapter.for_drafter(drafter, [i for i in range(max(layer_ids) + 1) if i != 0])
    c2 = skipped.new_cache()
    skipped.append_context(c2, states[:, :n], torch.arange(n), [out.hidden_states[i][:, :n] for i in skipped.state_indices])
    assert not torch.allclose(skipped.predict(c2, ids[:, n:], torch.tensor([n])), states[:, n:], atol=1e-3)
    # files: a config only, and a clear error for a corrupt one or another drafter
    adapter.save_pretrained(tmp_path)
    again = LayerSkipAdapter.from_pretrained(tmp_path)
    assert again.config == adapter.config
    assistant_for(drafter).attach_foresight(str(tmp_path))  # a folder of either kind of adapter
    assert isinstance(assistant_for(drafter).foresight[0], LayerSkipAdapter) and assistant_for(drafter).foresight[1] is None
    (tmp_path / "layer_skip_adapter.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid layer-skip adapter"):
        LayerSkipAdapter.from_pretrained(tmp_path)
    other = JetSpecDrafter.for_target(target, target_layer_ids=[0])
    with pytest.raises(ValueError, match="predicts target layers"):
        adapter.check_drafter(other)
    with pytest.raises(ValueError, match="keep_layers must lie"):
        LayerSkipAdapter.for_drafter(drafter, [0, max(layer_ids) + 1])
