"""The repository itself: small enough to travel to a GPU machine."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUDGET_BYTES = 56 * 10**6
FRONT_PAGE_LINES, GUIDE_PAGE_LINES = 250, 300


def test_tracked_tree_is_under_56_mb():
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    total = sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file())
    assert total < BUDGET_BYTES, f"tracked tree is {total / 1e6:.1f} MB; the budget is {BUDGET_BYTES / 1e6:.0f} MB"


def test_front_page_and_guide_pages_stay_short_and_the_guide_is_linked():
    import re

    front = (ROOT / "README.md").read_text()
    assert len(front.splitlines()) <= FRONT_PAGE_LINES, f"README.md is a front page: at most {FRONT_PAGE_LINES} lines; move the rest to docs/"
    pages = sorted((ROOT / "docs").glob("*.md"))
    long = {p.name: len(p.read_text().splitlines()) for p in pages if len(p.read_text().splitlines()) > GUIDE_PAGE_LINES}
    assert not long, f"guide pages over {GUIDE_PAGE_LINES} lines (split them by concept): {long}"
    linked = set(re.findall(r"\]\(docs/([a-z0-9-]+\.md)", front))
    assert {p.name for p in pages} - {"README.md"} <= linked, "every guide page is linked from README.md's guide table"
    assert "make demo" in front and "make test" in front  # the quickstart's two commands


def test_package_map_module_tables_point_to_existing_files():
    import re

    section = (ROOT / "docs" / "package-map.md").read_text()
    paths = [p for cell in re.findall(r"^\| (`[^|]+`) \|", section, flags=re.M) for p in re.findall(r"`([^`]+)`", cell) if p != "module"]
    assert len(paths) > 30
    missing = [p for p in paths if not (ROOT / "src" / "hf_jetspec" / p).exists()]
    assert not missing, f"the package map names files that do not exist: {missing}"
    listed = {p.rstrip("/").split("/")[0] for p in paths}
    packages = {d.name for d in (ROOT / "src" / "hf_jetspec").iterdir() if d.is_dir() and (d / "__init__.py").exists()}
    assert packages <= listed, f"subpackages missing from the package map: {packages - listed}"


def test_public_api_is_pinned():
    import hf_jetspec

    assert sorted(hf_jetspec.__all__) == ["DrafterFreeAssistant", "DrafterFreeConfig", "DraftingConfig", "GenerationStats", "JetSpecAssistant", "JetSpecDrafter", "JetSpecDrafterConfig",
                                          "OnlineLearner", "OnlineLearningConfig", "ReplayBuffer", "default_target_layer_ids", "load_target", "seam"]
    assert all(getattr(hf_jetspec, name) is not None for name in hf_jetspec.__all__)


def test_current_results_page_matches_the_result_files():
    import importlib.util

    spec = importlib.util.spec_from_file_location("current_results", ROOT / "benchmarks" / "current_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "run python benchmarks/current_results.py"
    for _, rows in module.CURRENT:
        for _, name, method in rows:
            assert method in __import__("json").loads((module.RESULTS / name).read_text())["methods"], (name, method)


def test_benchmarks_readme_is_a_page_and_a_guide_and_reports_are_indexed():
    import re

    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert len(readme.splitlines()) < 300, "dated investigations belong in docs/reports/, one file each"
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    guided = set(re.findall(r"^\| `([a-z0-9_]+\.py)` \|", readme, flags=re.M))
    assert scripts == guided, f"scripts without a line in benchmarks/README.md: {scripts - guided}; lines without a script: {guided - scripts}"
    index = (ROOT / "docs" / "reports" / "README.md").read_text()
    linked = set(re.findall(r"\]\(([0-9]{4}-[0-9]{2}-[0-9]{2}-[a-z0-9-]+\.md)\)", index))
    reports = {p.name for p in (ROOT / "docs" / "reports").glob("2*.md")}
    assert linked == reports, f"reports not in the index: {reports - linked}; index entries without a file: {linked - reports}"
    named = set(re.findall(r"`([A-Za-z0-9_./-]+\.(?:json|png|md))`", index)) | set(re.findall(r"results/([A-Za-z0-9_./-]+)", readme))
    results = {p.relative_to(ROOT / "benchmarks" / "results").as_posix() for p in (ROOT / "benchmarks" / "results").rglob("*") if p.is_file()}
    unnamed = sorted(results - named)
    assert not unnamed, f"result files that no report and no current-results row names: {unnamed}"
