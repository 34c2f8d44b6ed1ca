"""int8 weight storage: per-channel quantisation on hand numbers, pack/unpack, and a drafter saved
as int8 that loads back (within half a scale step per entry) and still generates exactly."""

from __future__ import annotations

import json

import pytest
import torch

from hf_jetspec import JetSpecDrafter
from hf_jetspec.drafter.weight_storage import (
    INT4_SCALE_SUFFIX,
    SCALE_SUFFIX,
    dequantize_groups,
    dequantize_rows,
    pack_weights,
    quantize_groups,
    quantize_rows,
    unpack_weights,
)


def test_quantize_rows_by_hand():
    q, scale = quantize_rows(torch.tensor([[1.27, -0.635, 0.0], [0.0, 0.0, 0.0]]))
    assert scale.tolist() == pytest.approx([0.01, 1.0])  # max |w| / 127; an all-zero row gets scale 1
    assert q.tolist() == [[127, -64, 0], [0, 0, 0]]  # -0.635 / 0.01 = -63.5 rounds to even: -64
    assert dequantize_rows(q, scale).tolist()[0] == pytest.approx([1.27, -0.64, 0.0])
    with pytest.raises(ValueError, match="matrix"):
        quantize_rows(torch.ones(3))


def test_pack_keeps_vectors_and_small_matrices_and_round_trips():
    gen = torch.Generator().manual_seed(0)
    state = {"big": torch.randn(64, 128, generator=gen), "small": torch.randn(4, 4, generator=gen), "norm": torch.ones(64),
             "ids": torch.arange(5)}
    packed = pack_weights(state)
    assert packed["big"].dtype == torch.int8 and packed["big" + SCALE_SUFFIX].shape == (64,)
    assert torch.equal(packed["small"], state["small"]) and torch.equal(packed["ids"], state["ids"])
    back = unpack_weights(packed)
    step = packed["big" + SCALE_SUFFIX][:, None]
    assert ((back["big"] - state["big"]).abs() <= step / 2 + 1e-6).all()
    with pytest.raises(ValueError, match="no int8 matrix"):
        unpack_weights({"x" + SCALE_SUFFIX: torch.ones(2)})


def test_an_int8_drafter_loads_back_and_generates_exactly(tmp_path, llama_target):
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(llama_target).eval()
    drafter.save_pretrained(tmp_path / "fp32")
    drafter.save_pretrained(tmp_path / "int8", weight_storage="int8")
    assert json.loads((tmp_path / "int8" / "config.json").read_text())["weight_storage"] == "int8"
    size = {k: (tmp_path / k / "model.safetensors").stat().st_size for k in ("fp32", "int8")}
    assert size["int8"] < 0.4 * size["fp32"]
    loaded = JetSpecDrafter.from_pretrained(tmp_path / "int8", target=llama_target)
    assert loaded.dtype == drafter.dtype
    w, w8 = drafter.fc.weight, loaded.fc.weight
    assert not torch.equal(w, w8) and ((w - w8).abs() <= w.abs().amax(1, keepdim=True) / 254 + 1e-6).all()
    prompt = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(1))
    ref = llama_target.generate(prompt, do_sample=False, max_new_tokens=24)
    out = llama_target.generate(prompt, assistant_model=loaded, do_sample=False, max_new_tokens=24)
    assert torch.equal(ref, out)
    with pytest.raises(ValueError, match="weight_storage"):
        drafter.save_pretrained(tmp_path / "x", weight_storage="int2")


def test_quantize_groups_by_hand():
    # one row, two groups of 2: scales max|w| / 7 = 0.1 and 1/7 (float16), entries -7..7 stored as q + 8
    w = torch.tensor([[0.7, -0.35, 0.0, 1.0]])
    packed, scale = quantize_groups(w, group_size=2)
    assert scale.dtype == torch.float16 and scale.shape == (1, 2)
    assert scale.float().tolist()[0] == pytest.approx([0.1, 1 / 7], rel=1e-3)
    # q = [7, -0.35 / 0.09998 (0.1 in float16) = -3.5009 -> -4, 0, 7] + 8 = [15, 4, 8, 15]; low nibble: even column
    assert packed.tolist() == [[15 | (4 << 4), 8 | (15 << 4)]]
    assert dequantize_groups(packed, scale)[0].tolist() == pytest.approx([0.7, -0.4, 0.0, 1.0], rel=1e-3)
    with pytest.raises(ValueError, match="divid"):
        quantize_groups(torch.ones(2, 6), group_size=4)


def test_int4_packing_round_trips_within_half_a_step_and_falls_back_to_int8():
    gen = torch.Generator().manual_seed(0)
    state = {"big": torch.randn(64, 128, generator=gen), "odd": torch.randn(64, 96, generator=gen), "norm": torch.ones(64)}
    packed = pack_weights(state, storage="int4")
    assert packed["big"].dtype == torch.uint8 and packed["big"].shape == (64, 64)
    assert packed["big" + INT4_SCALE_SUFFIX].shape == (64, 2)  # groups of 64 columns
    assert packed["odd"].dtype == torch.int8 and ("odd" + SCALE_SUFFIX) in packed  # 96 columns: not a multiple of 64
    back = unpack_weights(packed)
    step = packed["big" + INT4_SCALE_SUFFIX].float().repeat_interleave(64, dim=1)
    assert ((back["big"] - state["big"]).abs() <= step / 2 + 1e-5).all()
    assert torch.equal(back["norm"], state["norm"])
    with pytest.raises(ValueError, match="no int4 matrix"):
        unpack_weights({"x" + INT4_SCALE_SUFFIX: torch.ones(2, 1)})
    with pytest.raises(ValueError, match="expected a packed uint8"):
        unpack_weights({"x": torch.ones(2, 4), "x" + INT4_SCALE_SUFFIX: torch.ones(2, 1)})
    with pytest.raises(ValueError, match="weight storage"):
        pack_weights(state, storage="int2")


def test_an_int4_drafter_is_smaller_than_int8_and_generates_exactly(tmp_path, llama_target):
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(llama_target).eval()
    drafter.save_pretrained(tmp_path / "int8", weight_storage="int8")
    drafter.save_pretrained(tmp_path / "int4", weight_storage="int4")
    assert json.loads((tmp_path / "int4" / "config.json").read_text())["weight_storage"] == "int4"
    size = {k: (tmp_path / k / "model.safetensors").stat().st_size for k in ("int8", "int4")}
    assert size["int4"] < 0.7 * size["int8"]
    loaded = JetSpecDrafter.from_pretrained(tmp_path / "int4", target=llama_target)
    assert not torch.equal(drafter.fc.weight, loaded.fc.weight)
    prompt = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(1))
    ref = llama_target.generate(prompt, do_sample=False, max_new_tokens=24)
    assert torch.equal(ref, llama_target.generate(prompt, assistant_model=loaded, do_sample=False, max_new_tokens=24))
