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


def test_train_holds_a_60_second_budget_shows_the_plan_and_writes_a_verdict(tiny_target_folder, tmp_path, capsys, monkeypatch):
    """The whole command, verdict included, within its budget plus one batch; one bar whose total is
    the budget, whose training counts are the plan's; a verdict in the record, the card and the
    terminal; the same command again repeats nothing, and --resume continues with more answers."""
    import time

    from hf_jetspec import JetSpecDrafter, load_target
    from hf_jetspec.assistant import JetSpecAssistant
    from hf_jetspec.training import budget

    shown, bars = [], []
    real_show, real_init = budget.BudgetBar.show, budget.BudgetBar.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        bars.append(self)

    def show(self, phase, counts=""):
        shown.append((phase, counts))
        real_show(self, phase, counts)

    monkeypatch.setattr(budget.BudgetBar, "__init__", init)
    monkeypatch.setattr(budget.BudgetBar, "show", show)
    out = tmp_path / "run"
    config = TrainCommandConfig(target=tiny_target_folder, output=str(out), hours=60 / 3600, dtype="float32", eval_prompts=1,
                                calibration_prompts=2, verdict_prompts=2, eval_new_tokens=16, max_new_tokens=24)
    t0 = time.perf_counter()
    record = run_train_command(config, progress=False, pipeline_overrides={"curve_points": 2, "warmup_steps": 2},
                               regeneration_overrides={"batch_size": 8, "shard_sequences": 8})
    wall = time.perf_counter() - t0
    plan = record["plan"]
    one_batch = plan["rates"]["answer_s"] * 8 + plan["rates"]["step_s"]
    assert wall <= 60 + one_batch + 2, (wall, plan)  # the budget holds, to the batch that was running
    assert bars[0].total == 60 and record["budget_hours"] == config.hours
    steps = [c for phase, c in shown if phase == "train" and c.startswith("step ")]
    assert steps and all(c.split(",")[0].endswith(f"/{plan['steps']}") for c in steps)  # the bar counts the plan's steps
    assert record["train_steps"] <= plan["steps"] and record["epochs"] <= 4.0 + 1e-9  # epochs capped by the plan
    assert {"regenerate", "train", "evaluate", "calibrate", "verdict"} <= {phase for phase, _ in shown}
    verdict = record["verdict"]
    assert verdict["use"] in ("drafter", "drafter-free") and verdict["items"] >= 1
    assert verdict["drafter"]["identical_to_plain"] == 1.0 and verdict["drafter_free"]["identical_to_plain"] == 1.0  # fp32: exact
    folder = out / "drafter"
    card = (folder / "README.md").read_text()
    assert "## Verdict" in card and f"{verdict['drafter']['speedup_vs_plain']:.2f}x" in card
    if verdict["use"] == "drafter-free":
        assert "--resume" in card
    assert {"config.json", "model.safetensors", "acceptance_calibration.json"} <= {p.name for p in folder.iterdir()}
    assert JetSpecAssistant.from_pretrained(str(folder)).acceptance_model.calibrated
    target, _ = load_target(tiny_target_folder)
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    drafter = JetSpecDrafter.from_pretrained(str(folder))
    assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=drafter),
                       target.generate(prompt, do_sample=False, max_new_tokens=12))

    # the same command again: every phase is done, so nothing is regenerated, trained, calibrated or judged anew
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["train", "--target", tiny_target_folder, "--output", str(out), "--hours", str(60 / 3600), "--dtype", "float32",
                 "--eval-prompts", "1", "--calibration-prompts", "2", "--verdict-prompts", "2"]) == 0
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    again = json.loads((out / "train.json").read_text())
    assert again["train_steps"] == record["train_steps"] and again["verdict"] == verdict and again["wall_hours"] >= record["wall_hours"]
    printed = capsys.readouterr().out
    assert "drafter and card in" in printed and "held-out drafter-alone tau" in printed and "Use " in printed

    # --resume: 30 more seconds continue the drafter on the answers so far (and more, where the plan buys them)
    more = run_train_command(TrainCommandConfig(**{**config.__dict__, "hours": 30 / 3600}), progress=False, resume=True,
                             pipeline_overrides={"curve_points": 1, "warmup_steps": 2},
                             regeneration_overrides={"batch_size": 8, "shard_sequences": 8})
    assert more["regenerated_sequences"] >= record["regenerated_sequences"] and more["train_steps"] > 0
    assert (out / "stints" / "stint-0" / "drafter" / "model.safetensors").is_file() and more["verdict"]["items"] >= 1
    assert [s["resume"] for s in more["stints"]] == [False, False, True]
