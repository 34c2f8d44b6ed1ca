"""DFlash interop: conversions to and from transformers' MuseGlimmerAssistantModel and the DFlash release
layout, loading those folders as JetSpecDrafters, and exact generation with converted weights."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_llama
from safetensors.torch import save_file
from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel
from transformers.cache_utils import DFlashCache
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from hf_jetspec import JetSpecDrafter
from hf_jetspec.drafter.dflash_format import (
    checkpoint_format,
    dflash_layout_errors,
    dflash_to_jetspec,
    jetspec_to_dflash,
    jetspec_to_muse_glimmer,
    muse_glimmer_assistant,
    muse_glimmer_to_jetspec,
)
from hf_jetspec.drafter.masks import sliding_window_mask
from hf_jetspec.drafter.target_info import target_signature

MASK_ID = 3
DFLASH_LAYOUT = dict(
    attention="bidirectional", block_inputs="mask", mask_token_id=MASK_ID, qk_norm=True, context_input_norm=False,
    row_predicts="self", target_layer_ids=[0, 2], block_size=8,
)


@pytest.fixture(scope="module")
def target():
    return tiny_llama()


def dflash_drafter(target, seed: int = 0, **overrides) -> JetSpecDrafter:
    """A DFlash-layout drafter with random weights, norms included (so a misplaced norm shows)."""
    torch.manual_seed(seed)
    drafter = JetSpecDrafter.for_target(target, **{**DFLASH_LAYOUT, **overrides})
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return drafter.eval()


def context_states(target, drafter, ids):
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1)


def muse_glimmer_logits(mg, target, states, anchor: int, rows: int) -> torch.Tensor:
    """What transformers' DFlash generator computes: the assistant over anchor + masks after the context,
    rows 1.. through the target's LM head."""
    c = states.shape[1]
    block = torch.tensor([anchor] + [mg.config.mask_token_id] * (rows - 1))
    cache = DFlashCache(config=mg.config)
    cache.set_previous_accepted_tokens(c)
    with torch.no_grad():
        out = mg(noise_embeds=target.get_input_embeddings()(block)[None], context_hidden_states=states,
                 position_ids=torch.arange(c + rows)[None], cache=cache)
        return target.lm_head(out.last_hidden_state[:, 1:])[0]


def jetspec_logits(drafter, states, anchor: int, rows: int) -> torch.Tensor:
    """The same drafts through our engine: a block of ``rows - 1`` inputs (a "self" drafter adds the last mask row)."""
    c = states.shape[1]
    cache = drafter.new_cache()
    drafter.append_context(cache, states, torch.arange(c))
    block = torch.tensor([anchor] + [MASK_ID] * (rows - 2))
    _, logits = drafter.draft_block(cache, block, c, torch.arange(rows - 1) > 0, return_logits=True)
    return logits


# ---------------------------------------------------------------------------- pure conversions
def test_checkpoint_format_is_read_from_the_config():
    assert checkpoint_format({"model_type": "jetspec_drafter"}) == "jetspec"
    assert checkpoint_format({"model_type": "muse_glimmer_assistant"}) == "muse_glimmer"
    assert checkpoint_format({"architectures": ["DFlashDraftModel"], "model_type": "qwen3"}) == "dflash"
    assert checkpoint_format({"model_type": "qwen3", "dflash_config": {}}) == "dflash"
    with pytest.raises(ValueError, match="candidate selector"):
        checkpoint_format({"architectures": ["DFlash2DraftModel"]})


def test_a_jetspec_layout_drafter_says_what_keeps_it_from_converting(target):
    drafter = JetSpecDrafter.for_target(target)
    errors = " ".join(dflash_layout_errors(drafter.config))
    for field in ("block_inputs", "qk_norm", "context_input_norm", "row_predicts", "mask_token_id"):
        assert field in errors
    with pytest.raises(ValueError, match="--dflash-layout"):
        jetspec_to_muse_glimmer(drafter.state_dict(), drafter.config)
    assert dflash_layout_errors(dflash_drafter(target).config) == []
    causal = dflash_drafter(target, attention="causal")
    with pytest.raises(ValueError, match="bidirectional"):
        jetspec_to_muse_glimmer(causal.state_dict(), causal.config)


def _same_architecture(a, b):
    fields = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
              "rms_norm_eps", "rope_theta", "attention", "block_inputs", "block_size", "mask_token_id", "qk_norm",
              "context_input_norm", "row_predicts", "sliding_window", "target_layer_ids")
    assert {f: getattr(a, f) for f in fields} == {f: getattr(b, f) for f in fields}


@pytest.mark.parametrize("window", [None, 6])
def test_muse_glimmer_round_trip_gives_back_the_same_state_dict(target, window):
    drafter = dflash_drafter(target, sliding_window=window)
    state, kwargs = jetspec_to_muse_glimmer(drafter.state_dict(), drafter.config)
    mg = MuseGlimmerAssistantModel(MuseGlimmerAssistantConfig(**kwargs))
    mg.load_state_dict(state, strict=True)  # the names and shapes are transformers' own
    back, config = muse_glimmer_to_jetspec(mg.state_dict(), mg.config.to_dict())
    assert back.keys() == drafter.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in drafter.state_dict().items())
    _same_architecture(config, drafter.config)
    assert config.unset_target_fields() == ["target_model_type", "target_num_hidden_layers", "target_vocab_size"]


def test_dflash_round_trip_gives_back_the_same_state_dict(target):
    drafter = dflash_drafter(target)
    state, dflash_config = jetspec_to_dflash(drafter.state_dict(), drafter.config)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.k_norm.weight"} <= state.keys()
    assert dflash_config["dflash_config"] == {"mask_token_id": MASK_ID, "target_layer_ids": [0, 2]}
    back, config = dflash_to_jetspec(state, json.loads(json.dumps(dflash_config)))
    assert all(torch.equal(back[k], v) for k, v in drafter.state_dict().items()) and back.keys() == drafter.state_dict().keys()
    _same_architecture(config, drafter.config)
    assert (config.target_num_hidden_layers, config.target_vocab_size) == (4, 128)


def test_dflash_configs_the_drafter_cannot_express_are_refused(target):
    drafter = dflash_drafter(target)
    state, cfg = jetspec_to_dflash(drafter.state_dict(), drafter.config)
    for change, message in (
        ({"dflash_config": {**cfg["dflash_config"], "output_multiplier": 0.2}}, "output_multiplier"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "rope_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 4}, "differ"),
        ({"dflash_config": {"mask_token_id": MASK_ID}}, "target_layer_ids"),
    ):
        with pytest.raises(ValueError, match=message):
            dflash_to_jetspec(state, {**cfg, **change})
    with pytest.raises(ValueError, match="missing"):
        dflash_to_jetspec({k: v for k, v in state.items() if k != "hidden_norm.weight"}, cfg)


def test_sliding_window_mask_by_hand():
    q = torch.tensor([[5, 6]])
    k = torch.tensor([0, 1, 2, 3, 4, 5, 6])
    # |q - k| < 3: position 5 sees 3..6 (and 7 would it exist), position 6 sees 4..6
    expected = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(sliding_window_mask(q, k, 3)[0, 0], expected)


# ---------------------------------------------------------------------------- same drafts as transformers
@pytest.mark.parametrize("window", [None, 6])
def test_converted_drafter_drafts_what_transformers_assistant_drafts(target, window):
    """Block logits of the converted weights in transformers' MuseGlimmerAssistantModel equal ours, with
    a context longer than the sliding window where there is one."""
    drafter = dflash_drafter(target, sliding_window=window)
    mg = muse_glimmer_assistant(drafter)
    ids = torch.randint(0, 128, (1, 21), generator=torch.Generator().manual_seed(1))
    states = context_states(target, drafter, ids[:, :20])
    ours = jetspec_logits(drafter, states, int(ids[0, 20]), rows=8)
    theirs = muse_glimmer_logits(mg, target, states, int(ids[0, 20]), rows=8)
    assert ours.shape == theirs.shape == (7, 128)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_training_view_matches_the_inference_view_for_a_self_row_drafter(target):
    """The training forward (packed blocks, extra trailing mask row) gives the inference path's logits."""
    drafter = dflash_drafter(target, sliding_window=6)
    ids = torch.randint(0, 128, (1, 21), generator=torch.Generator().manual_seed(2))
    states = context_states(target, drafter, ids)
    block = torch.tensor([[[int(ids[0, 20])] + [MASK_ID] * 6]])
    noise = torch.arange(7)[None, None] > 0
    with torch.no_grad():
        packed = drafter(states, block, torch.tensor([[20]]), noise_mask=noise).logits[0, 0]
    torch.testing.assert_close(packed, jetspec_logits(drafter, states[:, :20], int(ids[0, 20]), rows=8), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------- loading foreign folders
def _save_dflash_folder(drafter, path):
    state, cfg = jetspec_to_dflash(drafter.state_dict(), drafter.config)
    path.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_from_pretrained_converts_dflash_and_muse_glimmer_folders_and_says_so(target, tmp_path):
    drafter = dflash_drafter(target)
    folders = {"DFlash": _save_dflash_folder(drafter, tmp_path / "dflash")}
    muse_glimmer_assistant(drafter).save_pretrained(tmp_path / "mg")
    folders["muse_glimmer"] = tmp_path / "mg"
    logger = logging.get_logger("hf_jetspec.drafter.modeling_drafter")
    for fmt, folder in folders.items():
        with CaptureLogger(logger) as captured:
            loaded = JetSpecDrafter.from_pretrained(folder, num_jacobi_passes=2)
        assert captured.out.count("converting") == 1 and ("dflash" in captured.out or "muse_glimmer" in captured.out)
        assert loaded.drafting_config.num_jacobi_passes == 2 and not loaded.training
        assert all(torch.equal(loaded.state_dict()[k], v) for k, v in drafter.state_dict().items())
        loaded.attach_target(target)  # a MuseGlimmerAssistant folder does not record its target: adopted here
        assert {k: getattr(loaded.config, k) for k in target_signature(target)} == target_signature(target)


def test_a_converted_drafter_refuses_a_target_of_another_shape(target, tmp_path):
    folder = _save_dflash_folder(dflash_drafter(target), tmp_path / "dflash")
    other = tiny_llama(vocab_size=96)
    with pytest.raises(ValueError, match="vocab_size"):
        JetSpecDrafter.from_pretrained(folder).attach_target(other)


def test_corrupt_dflash_weights_are_reported(target, tmp_path):
    folder = _save_dflash_folder(dflash_drafter(target), tmp_path / "dflash")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError, match="corrupt"):
        JetSpecDrafter.from_pretrained(folder)


# ---------------------------------------------------------------------------- exact generation
@pytest.mark.parametrize("passes", [0, 1, 2])
def test_greedy_generation_with_a_converted_drafter_is_exact(target, tmp_path, passes):
    drafter = dflash_drafter(target)
    muse_glimmer_assistant(drafter).save_pretrained(tmp_path / "mg")
    loaded = JetSpecDrafter.from_pretrained(tmp_path / "mg", num_jacobi_passes=passes, budget=7)
    prompts = torch.randint(0, 128, (3, 9), generator=torch.Generator().manual_seed(3))
    for prompt in prompts:
        plain = target.generate(prompt[None], max_new_tokens=40, do_sample=False)
        fast = target.generate(prompt[None], max_new_tokens=40, do_sample=False, assistant_model=loaded)
        assert torch.equal(plain, fast)


def test_transformers_dflash_path_runs_the_converted_weights_exactly(target):
    """The bench's hf-dflash method: transformers' own DFlash generation with our weights."""
    mg = muse_glimmer_assistant(dflash_drafter(target))
    prompt = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(4))
    plain = target.generate(prompt, max_new_tokens=40, do_sample=False)
    assert torch.equal(plain, target.generate(prompt, max_new_tokens=40, do_sample=False, assistant_model=mg, speculation_type="dflash"))


# ---------------------------------------------------------------------------- the bench's hf-dflash method
@pytest.mark.slow
def test_bench_runs_hf_dflash_beside_jetspec_on_the_same_weights(tmp_path):
    """hf-dflash and jetspec J0 (policy off, budget = block_size - 1) draft with the same arithmetic:
    same drafts, so the same acceptance; both exact in fp32."""
    from hf_jetspec.tools.bench import BenchConfig, markdown_table, run_bench
    from hf_jetspec.tools.targets import load_target

    target, _ = load_target("smollm2-135m", dtype="float32")
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(target, **{**DFLASH_LAYOUT, "mask_token_id": 16, "target_layer_ids": None, "block_size": 6})
    drafter.save_pretrained(tmp_path / "drafter")
    cfg = BenchConfig(prompts="gsm8k", limit=1, max_new_tokens=16, methods=("ar", "hf-dflash", "jetspec-fixed", "jetspec-j1"),
                      drafter=str(tmp_path / "drafter"), budget=5, jacobi_passes=0, warmup_tokens=4, dtype="float32")
    result = run_bench(cfg, progress=False)
    methods = result["methods"]
    assert all(m["exact_match_vs_ar"] == 1.0 for m in methods.values())
    assert methods["hf-dflash"]["block_size"] == 6 and methods["hf-dflash"]["assistant"] == "MuseGlimmerAssistantModel"
    assert methods["hf-dflash"]["accept_length_hist"] == methods["jetspec-fixed"]["accept_length_hist"]
    assert methods["jetspec-j1"]["drafting_config"]["num_jacobi_passes"] == 1
    assert "| hf-dflash |" in markdown_table(result)


def test_bench_hf_dflash_names_what_a_jetspec_layout_drafter_lacks(tmp_path, target, monkeypatch):
    from hf_jetspec.tools import bench

    monkeypatch.setattr("hf_jetspec.tools.targets.load_target", lambda *a, **k: (target, None))
    monkeypatch.setattr("hf_jetspec.data.load_eval_prompts", lambda *a, **k: [])
    monkeypatch.setattr(bench, "build_items", lambda *a, **k: [])
    JetSpecDrafter.for_target(target).save_pretrained(tmp_path / "jetspec-layout")
    with pytest.raises(ValueError, match="row_predicts"):
        bench.load_bench(bench.BenchConfig(methods=("ar", "hf-dflash"), drafter=str(tmp_path / "jetspec-layout")))


def test_markdown_table_reports_a_method_that_could_not_run():
    from hf_jetspec.tools.bench import markdown_table

    table = markdown_table({"methods": {"hf-dflash": {"unavailable": "transformers' DFlash generation failed on this target: X"}}})
    assert "| hf-dflash | not run: transformers' DFlash generation failed on this target: X |" in table
