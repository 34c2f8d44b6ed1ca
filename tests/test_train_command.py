"""``hf-jetspec train`` end to end on a tiny target, and again to resume."""

from __future__ import annotations

import json

import pytest
import torch

from hf_jetspec.tools.cli import main
from hf_jetspec.tools.train import SizeDefaults, TrainCommandConfig, defaults_for, run_train_command


def test_defaults_by_target_size():
    assert defaults_for(135e6, 49152) == SizeDefaults(2, 8192, 32, 8, 1.5e-3)
    assert defaults_for(270e6, 262144) == SizeDefaults(2, 8192, 6, 8, 1.5e-3)  # a 262K head: draft vocabulary and batch cut
    assert defaults_for(1.5e9, 32000) == SizeDefaults(2, None, 16, 8, 1e-3)  # a 32K head is kept whole
    assert defaults_for(7e9, 128256).drafter_layers == 1
    with pytest.raises(ValueError, match="hours must be > 0"):
        TrainCommandConfig(target="x", output="y", hours=0)


@pytest.fixture(scope="module")
def tiny_target_folder(tmp_path_factory, smollm2):
    """A random 2-layer Llama with SmolLM2's tokenizer (and its chat template), saved as a user's folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tokenizer = smollm2
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    folder = tmp_path_factory.mktemp("user-target")
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_train_writes_a_calibrated_hub_ready_drafter_and_resumes(tiny_target_folder, tmp_path, capsys):
    from hf_jetspec import JetSpecDrafter, load_target
    from hf_jetspec.assistant import JetSpecAssistant

    out = tmp_path / "run"
    config = TrainCommandConfig(target=tiny_target_folder, output=str(out), hours=20 / 3600, dtype="float32", eval_prompts=1,
                                calibration_prompts=2, eval_new_tokens=16, max_new_tokens=24)
    record = run_train_command(config, progress=False, pipeline_overrides={"curve_points": 2, "warmup_steps": 2},
                               regeneration_overrides={"num_prompts": 24, "batch_size": 8, "shard_sequences": 8})
    folder = out / "drafter"
    assert {"config.json", "model.safetensors", "acceptance_calibration.json", "README.md"} <= {p.name for p in folder.iterdir()}
    assert record["regenerated_sequences"] > 0 and record["train_steps"] > 0 and len(record["curve"]) >= 1
    card = (folder / "README.md").read_text()
    assert f"{record['regenerated_sequences']} (" in card and "hf-jetspec train --target" in card
    assistant = JetSpecAssistant.from_pretrained(str(folder))
    assert assistant.acceptance_model.calibrated
    target, _ = load_target(tiny_target_folder)
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    drafter = JetSpecDrafter.from_pretrained(str(folder))
    assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=drafter),
                       target.generate(prompt, do_sample=False, max_new_tokens=12))

    # the same command again: every phase is done, so nothing is regenerated, trained or calibrated anew
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert main(["train", "--target", tiny_target_folder, "--output", str(out), "--hours", str(20 / 3600), "--dtype", "float32",
                 "--eval-prompts", "1", "--calibration-prompts", "2"]) == 0
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    again = json.loads((out / "train.json").read_text())
    assert again["train_steps"] == record["train_steps"] and again["wall_hours"] >= record["wall_hours"]
    assert "drafter and card in" in capsys.readouterr().out
