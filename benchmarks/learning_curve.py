"""Acceptance length (tau) of saved training checkpoints on held-out prompts: the learning curve.

    python benchmarks/learning_curve.py --checkpoints runs/smollm2-corpus-jacobi --steps 100,200,300,400 \
        --prompts gsm8k --limit 6 --offset 200 --max-new-tokens 128 --output benchmarks/results/learning_curve.json

tau needs no timing, so this can run on a busy machine. tau is the drafter's alone: a full block
every round (chain rounds), the round policy off; ``--rounds tree`` measures tree rounds of the
same budget instead (the first curve of recipe (d), 2026-12-02, was measured that way).
``--tokens-per-step`` (batch size x mean sequence length of the run) adds the tokens seen;
``--append`` merges a new stint's checkpoints into an existing curve.

Each row carries ``cpu_hours``: the training CPU time logged up to that checkpoint (the trainer's
``cpu_hours``, all threads) plus ``--data-cpu-hours``, the cost of making the training data (a
regeneration's ``cpu_seconds``, a feature cache) or of the drafter the run started from. A
``--label`` names the variant on the plot (``benchmarks/recipe_curves.py`` draws several).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.tools.bench import build_items, dump_json
from hf_jetspec.training.drafter_tau import acceptance_on_items
from hf_jetspec.data import load_eval_prompts


def checkpoint_cpu_hours(folder: Path, step: int) -> float | None:
    """The training CPU-hours logged at or before ``step`` in a checkpoint's ``trainer_state.json``
    (0 for the starting point, checkpoint-0); None when the run did not log them."""
    if step == 0:
        return 0.0
    state = folder / "trainer_state.json"
    if not state.is_file():
        return None
    rows = [r for r in json.loads(state.read_text())["log_history"] if "cpu_hours" in r and r.get("step", 0) <= step]
    return rows[-1]["cpu_hours"] if rows else None


def checkpoint_step(folder: Path) -> int:
    return int(re.findall(r"\d+", folder.name)[-1])


def evaluate(target, items, refs, folder: Path, args, data_cpu_hours: float) -> dict:
    """One checkpoint's row: drafter-alone tau per Jacobi setting, exactness, CPU-hours."""
    step = checkpoint_step(folder)
    drafter = JetSpecDrafter.from_pretrained(str(folder), dtype=torch.float32).eval()
    row = {"step": step, "checkpoint": str(folder)}
    if args.tokens_per_step:
        row["tokens_seen"] = int(step * args.tokens_per_step)
    trained = checkpoint_cpu_hours(folder, step)
    if trained is not None:
        row["train_cpu_hours"] = round(trained, 4)
        row["cpu_hours"] = round(trained + data_cpu_hours, 4)
    for j in [int(x) for x in args.jacobi_passes.split(",")]:
        # the drafter alone: full blocks every round (no round policy, no n-gram proposals)
        r = acceptance_on_items(target, drafter, items, args.max_new_tokens, refs, num_jacobi_passes=j, budget=args.budget, policy=False,
                                tree="auto" if args.rounds == "tree" else None)
        row[f"tau_J{j}"] = r["tau"]
        row[f"exact_J{j}"] = r["exact"]
    print(row, flush=True)
    return row


def save(output: Path, rows: list[dict], args, label: str | None, append: bool) -> None:
    config = vars(args) | {"label": label}
    stints = [config]
    if append and output.is_file():
        old = json.loads(output.read_text())
        mine = {r["checkpoint"] for r in rows}
        rows = [r for r in old["curve"] if r["checkpoint"] not in mine] + rows
        stints = old.get("stints", [old["config"]]) + stints
    rows.sort(key=lambda r: (r.get("tokens_seen", 0), r["step"], r["checkpoint"]))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(dump_json({"config": config, "stints": stints, "curve": rows}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoints", default=None, help="folder of checkpoint-N drafter folders")
    ap.add_argument("--run", action="append", default=[], metavar="LABEL,DIR,OUTPUT[,DATA_CPU_HOURS]",
                    help="several runs in one process (one target load, one set of references); repeatable")
    ap.add_argument("--watch", type=float, default=None, metavar="SECONDS",
                    help="keep evaluating checkpoints as they appear, polling every SECONDS, until each run has its final/ "
                         "folder and every checkpoint is measured (rows are appended to each output as they come)")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prompts", default="gsm8k")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--jacobi-passes", default="0,1")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--rounds", default="chain", choices=["chain", "tree"],
                    help="chain: a full block every round (the drafter alone); tree: tree rounds of the same budget")
    ap.add_argument("--steps", default=None, help="comma list of checkpoint steps to evaluate (default: all)")
    ap.add_argument("--every", type=int, default=1, help="evaluate every n-th checkpoint (plus checkpoint-0 and a finished run's last)")
    ap.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float32"], help="the target's dtype")
    ap.add_argument("--tokens-per-step", type=float, default=None,
                    help="training tokens per optimizer step (batch size x mean sequence length): adds tokens_seen to each row")
    ap.add_argument("--data-cpu-hours", type=float, default=0.0,
                    help="CPU-hours spent before training (data generation, the starting drafter): added to every row's cpu_hours")
    ap.add_argument("--label", default=None, help="the variant's name in plots")
    ap.add_argument("--append", action="store_true",
                    help="merge into an existing --output: rows of other checkpoints are kept, a re-measured checkpoint is replaced")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()

    runs = []
    if args.checkpoints:
        if not args.output:
            ap.error("--checkpoints needs --output")
        runs.append((args.label, Path(args.checkpoints), Path(args.output), args.data_cpu_hours))
    for spec in args.run:
        parts = spec.split(",")
        if len(parts) not in (3, 4):
            ap.error(f"--run takes LABEL,DIR,OUTPUT[,DATA_CPU_HOURS], got {spec!r}")
        runs.append((parts[0], Path(parts[1]), Path(parts[2]), float(parts[3]) if len(parts) == 4 else 0.0))
    if not runs:
        ap.error("give --checkpoints and --output, or --run")

    target, tok = load_target(args.target, dtype=args.dtype)
    items = build_items(tok, target, load_eval_prompts(args.prompts, limit=args.limit, offset=args.offset), args.max_new_tokens)
    refs: dict = {}
    wanted = None if not args.steps else {int(x) for x in args.steps.split(",")}
    append = args.append or args.watch is not None
    while True:
        evaluated = unfinished = False
        for label, folder, output, data_hours in runs:
            done = set()
            if append and output.is_file():
                done = {r["checkpoint"] for r in json.loads(output.read_text())["curve"]}
            folders = sorted(folder.glob("checkpoint-*"), key=checkpoint_step)
            folders = [f for f in folders if wanted is None or checkpoint_step(f) in wanted]
            finished = (folder / "final").is_dir()
            if args.every > 1:  # every n-th checkpoint, the starting point (checkpoint-0) and a finished run's last
                keep = set(folders[args.every - 1 :: args.every]) | ({folders[-1]} if finished and folders else set())
                folders = [f for f in folders if f in keep or checkpoint_step(f) == 0]
            todo = [f for f in folders if str(f) not in done]
            unfinished |= args.watch is not None and not finished
            for i, f in enumerate(todo):
                save(output, [evaluate(target, items, refs, f, args, data_hours)], args, label, append or i > 0)
                evaluated = True
                if args.watch is not None:
                    break  # one checkpoint, then look at every run again
        if args.watch is None or not (evaluated or unfinished):
            return
        if not evaluated:
            time.sleep(args.watch)


if __name__ == "__main__":
    main()
