#!/usr/bin/env python3
"""How steady this machine's speed is: the same fixed piece of work, timed again and again.

    python benchmarks/bench_machine.py [--seconds 180] [--interval 0.5] [--json OUT.json]

One thread, pure Python (no BLAS, no threads of its own), about 30-60 ms of work a sample, a
pause between samples: on an idle machine every sample should take the same time. Printed:
the samples' spread (min, median, p90, max, each against the fastest), the share that took
more than ``SLOW`` x the fastest, and how many samples in a row stay slow or fast -- what a
benchmark's A/A control (``bench_colocation.py``'s ``vanilla-split-twin``) inherits. Run it
with nothing else running; the 1-minute load average before and after is printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from harness._figures import percentile  # noqa: E402

SLOW = 1.2
"""A sample taking more than this many times the fastest one counts as slow."""


def work(rounds: int = 300_000) -> float:
    """Seconds of one fixed piece of work (integer arithmetic and a small dict, in a loop)."""
    started = time.perf_counter()
    total, seen = 0, {}
    for i in range(rounds):
        total += (i * 7) ^ (total & 0xFFFF)
        seen[i & 1023] = total
    return time.perf_counter() - started


def steadiness(samples: list[float]) -> dict[str, Any]:
    """The spread of ``samples`` (seconds each) against the fastest, the slow share and the
    median length of the runs of slow and of fast samples."""
    if not samples:
        raise ValueError("no samples")
    fastest = min(samples)
    slow = [s > SLOW * fastest for s in samples]
    runs: dict[bool, list[int]] = {True: [], False: []}
    length = 1
    for before, now in itertools.pairwise(slow):
        if now == before:
            length += 1
        else:
            runs[before].append(length)
            length = 1
    runs[slow[-1]].append(length)
    return {
        "samples": len(samples),
        "fastest_ms": round(fastest * 1e3, 2),
        "median_x": round(statistics.median(samples) / fastest, 3),
        "p90_x": round(percentile(samples, 0.9) / fastest, 3),
        "slowest_x": round(max(samples) / fastest, 3),
        "slow_share": round(sum(slow) / len(slow), 3),
        "slow_run_median": statistics.median(runs[True]) if runs[True] else 0,
        "fast_run_median": statistics.median(runs[False]) if runs[False] else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--interval", type=float, default=0.5, help="pause between samples")
    parser.add_argument("--json", type=Path, help="write every sample here")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    samples: list[tuple[float, float]] = []
    end = time.time() + args.seconds
    while time.time() < end:
        samples.append((time.time(), work()))
        time.sleep(args.interval)
    summary = steadiness([s for _, s in samples])
    summary["load_before"] = round(load_before, 2)
    summary["load_after"] = round(os.getloadavg()[0], 2)
    print(
        f"{summary['samples']} samples, the fastest {summary['fastest_ms']} ms; against it the "
        f"median {summary['median_x']}x, p90 {summary['p90_x']}x, slowest "
        f"{summary['slowest_x']}x; slow (> {SLOW}x) {summary['slow_share']:.0%} of samples, "
        f"in runs of {summary['slow_run_median']} (fast: {summary['fast_run_median']}) at "
        f"{args.interval} s apart; load {summary['load_before']} before, "
        f"{summary['load_after']} after"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "samples": samples}) + "\n")


if __name__ == "__main__":
    main()
