"""The repository itself: small enough to travel to a GPU machine."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUDGET_BYTES = 48 * 10**6


def test_tracked_tree_is_under_48_mb():
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    total = sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file())
    assert total < BUDGET_BYTES, f"tracked tree is {total / 1e6:.1f} MB; the budget is {BUDGET_BYTES / 1e6:.0f} MB"
