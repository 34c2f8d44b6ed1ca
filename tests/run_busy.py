"""Run pytest while other processes keep every core busy: no test's verdict may depend on machine speed.

    python tests/run_busy.py [--workers N] [pytest arguments ...]

Starts ``N`` (default: the number of cores) spinning processes, runs pytest with the remaining
arguments (by default the exactness and policy tests), stops the spinners whatever happens, and
exits with pytest's status.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys

DEFAULT_TESTS = [
    "tests/test_greedy_exactness.py",
    "tests/test_sampling_exactness.py",
    "tests/test_tree_decoding.py",
    "tests/test_policy.py",
    "tests/test_int8_drafting.py",
]


def _spin(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args, rest = parser.parse_known_args(argv)
    stop = mp.Event()
    spinners = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.workers)]
    for p in spinners:
        p.start()
    try:
        return subprocess.call([sys.executable, "-m", "pytest", "-q", *(rest or DEFAULT_TESTS)])
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()


if __name__ == "__main__":
    sys.exit(main())
