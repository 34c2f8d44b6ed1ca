"""The data-scaling curve of SmolLM2-135M drafters: drafter-alone tau against target-written answers.

    python benchmarks/data_scaling.py --cache runs/regen-smollm2-30k \
        --point 2x1536:3000 --point 2x1536:6000 --point 2x1536:12000 --point 2x1536:30000 --point 4x1536:30000 \
        --reference hub_cards/jetspec-smollm2-135m --output benchmarks/results/data_scaling_smollm2.json

Every point trains a drafter of one size (LAYERSxMLP_WIDTH) from the target's top layers on the
first N answers of one regeneration (``examples/regenerate.py``), with one recipe: Jacobi-forcing
inputs, the cache's top-64 labels, the 8,192 most frequent answer tokens as draft vocabulary,
batch 4, 32 blocks per sequence, AdamW at 1e-3 with cosine decay, bf16 autocast, ``--epochs``
epochs. Training is ``examples/train_drafter.py`` (the command is recorded per point; rerunning
resumes from its last checkpoint). Each finished drafter is then measured alone (chains, one
Jacobi pass, budget 16, round policy off, bf16 target) on held-out prompts that neither
regeneration (the overlap rule) nor policy calibration touched, every output checked against
the target's own greedy output; every bf16 divergence is scored in fp32 (the logit margin of the two
tokens on the target's own prefix) against the target's measured bf16 noise (1-token steps against
16-token forwards on GSM8K prompts far from the measured ones): a point records how many outputs
diverged and the share that are numerical ties. The target's own outputs and the tie margin are kept
in ``RUNS_DIR/references-*.pt`` and reused by later runs of the same prompts.

The command is idempotent: a point whose drafter is trained is not retrained, a point already in
``--output`` is not re-measured, a point whose answers are not regenerated yet is skipped. So the
same command, rerun, carries the campaign on. Each point records its CPU-hours (the regeneration's
measured CPU time prorated to its answers, plus the trainer's logged CPU time). The plot
(``OUTPUT.png``) draws tau against answers on a log axis, a line per drafter size, each point
labelled with its CPU-hours, and the least-squares line of the main size
(:func:`hf_jetspec.training.scaling.fit_log_linear`) extended to the answers that would reach
``--goal``.

With ``--reference`` and no ``--point``, the command measures one drafter folder (e.g. a candidate
to ship) on the curve's prompts and protocol, reusing the kept outputs, and records it alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_point(spec: str) -> tuple[int, int, int]:
    """``"2x1536:3000"`` -> (layers, mlp width, answers)."""
    try:
        size, answers = spec.split(":")
        layers, width = size.lower().split("x")
        return int(layers), int(width), int(answers)
    except ValueError:
        raise SystemExit(f"--point takes LAYERSxMLP_WIDTH:ANSWERS (e.g. 2x1536:3000), got {spec!r}") from None


def train_command(cache: str, run_dir: Path, layers: int, width: int, answers: int, epochs: float, target: str) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / "train_drafter.py"), "--target", target, "--feature-cache", cache,
            "--cache-sequences", str(answers), "--layers", str(layers), "--intermediate-size", str(width), "--init-layers-from-target",
            "--draft-vocab-from-cache", "8192", "--labels", "corpus", "--inputs", "jacobi", "--batch-size", "4",
            "--blocks-per-sequence", "32", "--lr", "1e-3", "--num-epochs", str(epochs), "--save-steps", "250", "--save-total-limit", "2",
            "--bf16", "--dtype", "bfloat16", "--output-dir", str(run_dir)]


def train_cpu_hours(run_dir: Path) -> float | None:
    """The trainer's CPU-hours (all threads, every stint): from the finished run's ``train_metrics.json``,
    else as logged at its last checkpoint."""
    finished = run_dir / "train_metrics.json"
    if finished.is_file():
        return float(json.loads(finished.read_text())["cpu_hours"])
    states = sorted(run_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]))
    if not states:
        return None
    rows = [r for r in json.loads(states[-1].read_text())["log_history"] if "cpu_hours" in r]
    return rows[-1]["cpu_hours"] if rows else None


def plot(result: dict, path: Path, goal: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hf_jetspec.training.scaling import answers_for_tau, fit_log_linear, tau_at

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    sizes = sorted({p["size"] for p in result["points"]})
    for size in sizes:
        pts = sorted((p["answers"], p["tau"], p["cpu_hours"]) for p in result["points"] if p["size"] == size)
        ax.plot([a for a, _, _ in pts], [t for _, t, _ in pts], "o-", label=f"{size} drafter")
        for a, t, h in pts:
            ax.annotate(f"{h:.1f} CPU-h", (a, t), textcoords="offset points", xytext=(4, -12), fontsize=7)
    ref = result.get("reference")
    if ref:
        ax.axhline(ref["tau"], color="black", lw=0.8, ls="-.", label=f"{Path(ref['drafter']).name}: {ref['tau']:.3f}")
    fit = result.get("fit")
    if fit:
        line = fit_log_linear([a for a, _ in fit["points"]], [t for _, t in fit["points"]])
        lo = min(a for a, _ in fit["points"])
        hi = max(max(a for a, _ in fit["points"]), min(answers_for_tau(line, goal), 1e6))
        xs = [lo * (hi / lo) ** (i / 40) for i in range(41)]
        ax.plot(xs, [tau_at(line, x) for x in xs], "--", color="grey", lw=1, label=f"fit {fit['size']}: {line.slope:+.3f} per tenfold")
        ax.axhline(goal, color="red", lw=0.8, ls=":", label=f"goal {goal}")
    ax.set_xscale("log")
    ax.set_xlabel("target-written answers (log)")
    ax.set_ylabel("drafter-alone tau (chains, J1, budget 16)")
    ax.set_title(result.get("title", "drafter tau against data"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


TIE_PROMPTS = ("gsm8k", 1000, 8)  # set, first prompt, count: the prompts the bf16 noise is measured on


class Measurer:
    """The bf16 target, the held-out items of ``--prompts``, the target's own outputs (cached), and,
    once some output diverges, the fp32 target and the bf16 tie margin to score it with."""

    def __init__(self, args):
        import torch

        from hf_jetspec import load_target
        from hf_jetspec.data import load_eval_prompts
        from hf_jetspec.tools.bench import build_items

        self.args = args
        self.target, self.tokenizer = load_target(args.target, dtype="bfloat16")
        self.items = {}
        for s in args.prompts.split(","):
            name, _, offset = s.partition(":")
            self.items[s] = build_items(self.tokenizer, self.target, load_eval_prompts(name, limit=args.limit, offset=int(offset or 0)),
                                        args.max_new_tokens)
        # the target's own outputs and its tie margin, kept beside the runs: the same for every point
        key = f"{args.target}-bf16-{args.prompts}-{args.limit}-{args.max_new_tokens}".replace(":", "_").replace(",", "+")
        self.store = Path(args.runs_dir) / f"references-{key}.pt"
        saved = torch.load(self.store) if self.store.is_file() else {}
        self.refs: dict = saved.get("refs", {})
        self.tie_margin = saved.get("tie_margin")
        self.fp32 = None

    def _tie_margin(self) -> float:
        from hf_jetspec import load_target
        from hf_jetspec.tools.bench import BenchConfig, measure_tie_margin

        if self.tie_margin is None:
            name, offset, count = TIE_PROMPTS  # the bench's rule takes them 100 past offset + limit
            self.tie_margin = measure_tie_margin(self.target, self.tokenizer, BenchConfig(
                target=self.args.target, prompts=name, offset=offset - 100, limit=None, max_new_tokens=128, tie_margin_items=count))
            self.save()
        if self.fp32 is None:
            self.fp32, _ = load_target(self.args.target, dtype="float32")
        return self.tie_margin["tie_margin"]

    def save(self) -> None:
        import torch

        self.store.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"refs": self.refs, "tie_margin": self.tie_margin}, self.store)

    def measure(self, folder: str) -> dict:
        """A drafter alone (chains, J1, budget 16, policy off) on every set: ``{set: {"tau", "exact",
        "divergences", "tie_explained", ...}}``."""
        from hf_jetspec import JetSpecDrafter
        from hf_jetspec.tools.numerics import score_item_divergences
        from hf_jetspec.training.drafter_tau import acceptance_on_items

        drafter = JetSpecDrafter.from_pretrained(folder)
        out = {}
        for s, its in self.items.items():
            r = acceptance_on_items(self.target, drafter, its, self.args.max_new_tokens, self.refs, num_jacobi_passes=1, budget=16,
                                    policy=False)
            scored = None
            if not r["exact"]:
                margin = self._tie_margin()  # loads the fp32 target on first use
                scored = score_item_divergences(self.fp32, its, r["divergent"], margin)
            del r["divergent"]
            r["divergences"] = scored["divergences"] if scored else []
            r["tie_explained"] = scored["tie_explained"] if scored else 1.0
            out[s] = r
        self.save()
        return out


def record_measurement(result: dict, args, measurer: Measurer) -> None:
    """What every measurement in ``result`` shares: the prompts, the machine and the bf16 tie margin."""
    from hf_jetspec.tools.environment import describe_environment

    result["prompts"], result["limit"], result["max_new_tokens"] = args.prompts, args.limit, args.max_new_tokens
    result["environment"] = describe_environment(measurer.target.device)
    result["tie_margin"] = measurer.tie_margin  # tools.bench.measure_tie_margin's record, None while nothing diverged


def summary(per_set: dict) -> dict:
    """What a point (or the reference) records of its measurement."""
    divergences = [d for r in per_set.values() for d in r["divergences"]]
    ties = sum(r["tie_explained"] * len(r["divergences"]) for r in per_set.values())
    return {"tau": round(sum(r["tau"] for r in per_set.values()) / len(per_set), 4),
            "tau_per_set": {s: round(r["tau"], 4) for s, r in per_set.items()},
            "exact": all(r["exact"] for r in per_set.values()),
            "divergences": len(divergences),
            "tie_explained": round(ties / len(divergences), 4) if divergences else 1.0,
            "max_fp32_margin": max((abs(d["fp32_margin"]) for d in divergences if d["fp32_margin"] is not None), default=None)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True, help="a regeneration folder (examples/regenerate.py)")
    ap.add_argument("--point", action="append", default=[], metavar="LAYERSxMLP:ANSWERS")
    ap.add_argument("--epochs", type=float, default=4.0)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--runs-dir", default="runs/data-scaling")
    ap.add_argument("--prompts", default="gsm8k:120,humaneval:120,mt-bench:20", help="held-out SET:OFFSET list")
    ap.add_argument("--limit", type=int, default=20, help="prompts per set (MT-Bench: both turns of each)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--goal", type=float, default=2.0)
    ap.add_argument("--no-train", action="store_true", help="measure and plot what is trained; start no training")
    ap.add_argument("--reference", default=None, metavar="FOLDER",
                    help="a drafter measured once on the same prompts and drawn as a level line (e.g. the shipped drafter)")
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)
    if not args.point and not args.reference:
        ap.error("give at least one --point, or a --reference to measure alone")

    from hf_jetspec.training.regenerate import MANIFEST_NAME
    from hf_jetspec.training.scaling import answers_for_tau, fit_log_linear, manifest_record, regeneration_cpu_hours, tau_at

    output = Path(args.output)
    result = json.loads(output.read_text()) if output.is_file() else {"points": []}
    result["command"] = "python benchmarks/data_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result["title"] = f"{args.target} drafters: tau against answers ({args.epochs:g} epochs each)"
    manifest = json.loads((Path(args.cache) / MANIFEST_NAME).read_text())
    result["regeneration"] = manifest_record(manifest)
    measured = {(p["size"], p["answers"]) for p in result["points"] if "tie_explained" in p}  # older points: measured again, scored
    measurer = None
    for spec in args.point:
        layers, width, answers = parse_point(spec)
        size = f"{layers}x{width}"
        if (size, answers) in measured:
            continue
        if answers > int(manifest["num_sequences"]):
            print(f"{spec}: {manifest['num_sequences']} answers regenerated so far, skipped", flush=True)
            continue
        run_dir = Path(args.runs_dir) / f"{size}-{answers}"
        command = train_command(args.cache, run_dir, layers, width, answers, args.epochs, args.target)
        trained_here = not (run_dir / "final" / "config.json").is_file()
        if trained_here:
            if args.no_train:
                print(f"{spec}: not trained yet", flush=True)
                continue
            print(" ".join(command), flush=True)
            subprocess.run(command, check=True, cwd=ROOT)
        measurer = measurer or Measurer(args)
        t0 = time.perf_counter()
        per_set = measurer.measure(str(run_dir / "final"))
        earlier = next((p for p in result["points"] if (p["size"], p["answers"]) == (size, answers)), {})
        # a drafter measured again keeps the cost priced when it was made (the manifest's records then); one
        # trained again (its folder gone with the cache it was trained on) is priced from this cache's manifest
        regen_h = (None if trained_here else earlier.get("regeneration_cpu_hours")) or regeneration_cpu_hours(manifest, answers)
        train_h = train_cpu_hours(run_dir) or 0.0
        point = {"size": size, "layers": layers, "mlp_width": width, "answers": answers, "epochs": args.epochs, **summary(per_set),
                 "regeneration_cpu_hours": round(regen_h, 3), "train_cpu_hours": round(train_h, 3),
                 "cpu_hours": round(regen_h + train_h, 3), "train_command": " ".join(["python", "examples/train_drafter.py", *command[2:]]),
                 "eval_seconds": round(time.perf_counter() - t0, 1), "drafter": str(run_dir / "final")}
        print(point, flush=True)
        result["points"] = [p for p in result["points"] if (p["size"], p["answers"]) != (size, answers)] + [point]
        result["points"].sort(key=lambda p: (p["size"], p["answers"]))
        main_size = parse_point(args.point[0])
        main_pts = [(p["answers"], p["tau"]) for p in result["points"] if (p["layers"], p["mlp_width"]) == main_size[:2]]
        if len({a for a, _ in main_pts}) >= 2:
            line = fit_log_linear([a for a, _ in main_pts], [t for _, t in main_pts])
            result["fit"] = {"size": f"{main_size[0]}x{main_size[1]}", "points": main_pts, "intercept": round(line.intercept, 4),
                             "slope_per_tenfold": round(line.slope, 4), "per_doubling": round(line.per_doubling, 4),
                             "answers_for_goal": answers_for_tau(line, args.goal), "goal": args.goal,
                             "tau_at_800k": round(tau_at(line, 800_000), 3)}
        record_measurement(result, args, measurer)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=1) + "\n")
        plot(result, output.with_suffix(".png"), args.goal)
    old_reference = result.get("reference", {})
    if args.reference and (old_reference.get("drafter") != args.reference or "tie_explained" not in old_reference):
        measurer = measurer or Measurer(args)
        result["reference"] = {"drafter": args.reference, **summary(measurer.measure(args.reference))}
        print({"reference": result["reference"]}, flush=True)
        record_measurement(result, args, measurer)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=1) + "\n")
        if result["points"]:
            plot(result, output.with_suffix(".png"), args.goal)
    if not result["points"]:
        print("no point measured yet")


if __name__ == "__main__":
    main()
