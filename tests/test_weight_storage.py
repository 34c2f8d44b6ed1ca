"""int8 weight storage: per-channel quantisation on hand numbers, pack/unpack, and a drafter saved
as int8 that loads back (within half a scale step per entry) and still generates exactly."""

from __future__ import annotations

import json

import pytest
import torch

from hf_jetspec import JetSpecDrafter
from hf_jetspec.drafter.weight_storage import SCALE_SUFFIX, dequantize_rows, pack_int8, quantize_rows, unpack_int8


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
    packed = pack_int8(state)
    assert packed["big"].dtype == torch.int8 and packed["big" + SCALE_SUFFIX].shape == (64,)
    assert torch.equal(packed["small"], state["small"]) and torch.equal(packed["ids"], state["ids"])
    back = unpack_int8(packed)
    step = packed["big" + SCALE_SUFFIX][:, None]
    assert ((back["big"] - state["big"]).abs() <= step / 2 + 1e-6).all()
    with pytest.raises(ValueError, match="no int8 matrix"):
        unpack_int8({"x" + SCALE_SUFFIX: torch.ones(2)})


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
        drafter.save_pretrained(tmp_path / "x", weight_storage="int4")
