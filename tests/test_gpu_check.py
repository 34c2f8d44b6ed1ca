"""The prepared GPU check runs end to end on CPU with tiny sizes (``--dry-run``), so it cannot rot."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {"environment", "exactness", "bf16_ties", "system_timing", "compiled_rounds", "smollm2", "long_prompts", "ctmc_cost", "kernels", "train_pipeline"}


def test_gpu_check_dry_run(tmp_path):
    import torch

    # as many threads as this process has: one under `pytest -n 2`, where two threads would contend for the other worker's core
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--dry-run", "--output", str(tmp_path),
                           "--threads", str(torch.get_num_threads())], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["dry_run"] and set(data["sections"]) == SECTIONS
    assert not any("error" in s for s in data["sections"].values())
    assert data["sections"]["exactness"]["all_exact"]
    raising = [c for c in data["sections"]["exactness"]["cases"] if "raising worker" in c["case"]]
    assert raising and all(c["worker_raised"] and c["exact"] for c in raising)
    timing = {r["method"]: r for r in data["sections"]["system_timing"]["rows"]}
    assert timing["oracle tau=4"]["tau"] > timing["oracle tau=2"]["tau"]  # the oracle controls acceptance
    assert all(r.get("exact", True) for r in timing.values())
    long = data["sections"]["long_prompts"]  # fp32 in the dry run: every method writes plain decoding's tokens
    assert "skipped" in long or (long["ar_prefill_share"] > 0 and all(r["identical_to_ar"] in ("-", "1/1") for r in long["rows"]))
    compiled = data["sections"]["compiled_rounds"]  # fp32: compiled rounds write compiled plain decoding's tokens, compiling nothing after warm-up
    assert compiled["all_identical"] and compiled["no_recompiles"] and len(compiled["rows"]) == 2
    pipeline = data["sections"]["train_pipeline"]  # regenerate, train, evaluate within the budget
    assert pipeline["regenerated_sequences"] > 0 and pipeline["train_steps"] > 0 and pipeline["curve"] and pipeline["all_identical"]  # fp32
    assert (tmp_path / "gpu_check.md").read_text().startswith("# GPU check (dry run")
