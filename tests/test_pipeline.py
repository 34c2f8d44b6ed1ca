"""The time-budgeted pipeline: regenerate, train, evaluate, save (what the GPU check runs)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hf_jetspec import JetSpecDrafter
from hf_jetspec.training.pipeline import PipelineConfig, budget_cosine, run_pipeline, save_moments
from hf_jetspec.training.regenerate import RegenerationConfig, RegenerationPrompt


def test_budget_cosine_warms_up_by_step_then_decays_by_elapsed_share():
    assert budget_cosine(0, 0.0, 10, 100.0) == 0.0
    assert budget_cosine(5, 1.0, 10, 100.0) == 0.5
    assert budget_cosine(10, 0.0, 10, 100.0) == 1.0
    assert budget_cosine(20, 50.0, 10, 100.0) == pytest.approx(0.5)
    assert budget_cosine(20, 25.0, 10, 100.0) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert budget_cosine(20, 100.0, 10, 100.0) == pytest.approx(0.0)
    assert budget_cosine(20, 250.0, 10, 100.0, floor=0.1) == pytest.approx(0.1)  # past the budget: the floor


def test_save_moments_are_evenly_spaced_and_end_at_the_budget():
    assert save_moments(60.0, 3) == [20.0, 40.0, 60.0]
    assert save_moments(10.0, 1) == [10.0]


def test_config_refuses_a_budget_with_no_time_to_train():
    with pytest.raises(ValueError, match="max_epochs"):
        PipelineConfig(max_epochs=0)
    with pytest.raises(ValueError, match="minutes"):
        PipelineConfig(minutes=0)


class CharTokenizer:
    pad_token_id = 0


def test_pipeline_regenerates_trains_evaluates_and_saves_within_its_budget(llama_target, tmp_path):
    prompts = [RegenerationPrompt("sharegpt", [(7 * i + j) % 100 + 3 for j in range(6)], f"h{i}") for i in range(24)]
    eval_items = [(f"e{i}", torch.tensor([[(11 * i + j) % 90 + 5 for j in range(5)]])) for i in range(2)]
    config = PipelineConfig(minutes=0.25, draft_vocab=None, batch_size=2,
                            blocks_per_sequence=4, curve_points=2, eval_new_tokens=12,
                            regeneration=RegenerationConfig(num_prompts=24, max_new_tokens=10, batch_size=4, top_k=4, shard_sequences=8))
    result = run_pipeline(llama_target, CharTokenizer(), tmp_path, config, eval_items, "tiny", prompts=prompts, progress=False)
    assert result.regenerated_sequences >= 4 and result.train_steps >= 1
    assert 1 <= len(result.curve) <= 2 and all(row["identical_to_plain"] for row in result.curve)  # fp32: verification keeps every output exact
    assert [row["step"] for row in result.curve][-1] == result.train_steps  # the last checkpoint is the end of training
    drafter = JetSpecDrafter.from_pretrained(tmp_path / "drafter")
    assert drafter.config.num_hidden_layers == 2
    curve = json.loads((tmp_path / "learning_curve.json").read_text())
    assert curve["curve"] == result.curve and curve["eval_items"] == ["e0", "e1"]
    saved = json.loads((tmp_path / "pipeline.json").read_text())
    assert all(0 < row["train_cpu_hours"] < 0.25 / 60 * 2 for row in result.curve)  # this run's training only, not the process
    assert saved["config"]["minutes"] == 0.25 and saved["result"]["train_steps"] == result.train_steps
    assert (tmp_path / "regenerated" / "regeneration.json").is_file()
