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


def test_the_budget_plan_on_hand_numbers():
    from hf_jetspec.training.budget import PhaseCosts, plan_budget
    from hf_jetspec.training.pipeline import plan_training

    # 3600 s: 360 s tail and 4 x 60 s of curve reserved; 3000 s buy answers at 1 s and 4 epochs of 2 s steps over batches of 8
    plan = plan_budget(3600, 0, PhaseCosts(answer_s=1.0, step_s=2.0, eval_s=60.0, tail_s=360.0), batch_size=8)
    assert (plan.answers, plan.steps, plan.epochs, plan.curve_points) == (1500, 750, 4.0, 4)
    assert (plan.regenerate_s, plan.train_s, plan.evaluate_s, plan.tail_s) == (1500.0, 1500.0, 240.0, 360.0)
    # 200 s cannot hold 4 curve points at 60 s: the curve keeps at most half of it, at least one point
    short = plan_budget(200, 0, PhaseCosts(1.0, 2.0, 60.0, 20.0), batch_size=8)
    assert short.curve_points == 1 and short.answers == 60 and short.steps == 30  # (200 - 80) / (1 + 4 * 2 / 8)
    # answers already made are kept and count in the epochs: 100 done, 60 more bought
    more = plan_budget(400, 100, PhaseCosts(1.0, 2.0, 60.0, 20.0), batch_size=8, curve_points=1)
    assert more.answers == (400 - 80 + 100) // 2 and more.regenerate_s == more.answers - 100
    # once regeneration is over, the rest buys steps, capped at max_epochs over the answers
    assert plan_training(1000, 100, PhaseCosts(1.0, 2.0, 50.0, 100.0), batch_size=8, max_epochs=4, curve_points=4).steps == 50
    assert plan_training(300, 1000, PhaseCosts(1.0, 2.0, 50.0, 100.0), batch_size=8, max_epochs=4, curve_points=1).steps == 75


def test_the_budget_modules_worked_examples_hold():
    import doctest

    from hf_jetspec.training import budget, pipeline

    for module in (budget, pipeline):
        assert doctest.testmod(module).failed == 0, module.__name__
