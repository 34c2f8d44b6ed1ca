"""Drafter-alone tau against CPU-hours for several training recipes, on one plot.

    python benchmarks/recipe_curves.py --curves benchmarks/results/recipe_smollm2_{a,b,c,d}.json \
        --title "SmolLM2-135M drafters" --output benchmarks/results/recipe_curves_smollm2.png

Each input is a ``benchmarks/learning_curve.py`` result run with ``--data-cpu-hours`` and
``--label``: its rows carry ``cpu_hours`` (data generation plus training) and ``tau_J<n>``. The
plot has one line per recipe; a table of the same points goes to stdout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def curve_points(result: dict, key: str) -> list[tuple[float, float]]:
    """(cpu_hours, tau) of every row that has both, ordered by cost."""
    return sorted((r["cpu_hours"], r[key]) for r in result["curve"] if "cpu_hours" in r and key in r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--curves", nargs="+", required=True, help="learning_curve.py result files")
    ap.add_argument("--tau", default="tau_J1", help="the row key to plot")
    ap.add_argument("--title", default="")
    ap.add_argument("--output", required=True, help="PNG path")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for path in args.curves:
        result = json.loads(Path(path).read_text())
        label = result["config"].get("label") or Path(path).stem
        pts = curve_points(result, args.tau)
        if not pts:
            print(f"{path}: no rows with cpu_hours and {args.tau}")
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        print(f"{label}: " + ", ".join(f"{h:.2f} h -> {t:.3f}" for h, t in pts))
    ax.set_xlabel("CPU-hours (data generation + training)")
    ax.set_ylabel(f"drafter-alone tau ({args.tau.replace('tau_', '')}, full blocks, policy off)")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
