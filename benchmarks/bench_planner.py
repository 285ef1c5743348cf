"""Plan time by layer count and group count (a plain script; prints a table, or --json).

    python benchmarks/bench_planner.py [--json OUT] [--repeat 20]

Configs are vLLM-shaped: N layers split round-robin into G same-page groups overlaying one
pool, LBNHC; plus the gemma-4-E2B shape (15 tensor-backed layers, 20 aliases). The vanilla
path has no planning step, so planning is reported in absolute ms and as a ratio of the
gemma-4-E2B case; executor ratios against vanilla vLLM live in bench_executor.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import kvplan  # noqa: E402
from harness import _builders as b  # noqa: E402
from kvplan.schemas.loading import parse_input  # noqa: E402


def config(num_layers: int, num_groups: int) -> dict[str, Any]:
    names = [b.name(i) for i in range(num_layers)]
    groups = [
        (names[g::num_groups], b.attn_spec(heads=8, head_size=128)) for g in range(num_groups)
    ]
    return b.document(groups, num_blocks=4096)


def time_plan(data: dict[str, Any], repeat: int) -> tuple[float, float]:
    """(median, min) milliseconds of parse + plan (validation included)."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        kvplan.plan(parse_input(data))
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), min(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="write results as JSON here")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rows = []
    base, _ = time_plan(b.gemma4_e2b(num_blocks=2730), args.repeat)
    rows.append(
        {
            "case": "gemma-4-E2B (35 layers, 5 groups, 20 aliases)",
            "layers": 35,
            "groups": 5,
            "median_ms": base,
            "ratio_to_gemma": 1.0,
        }
    )
    for layers in (35, 128, 1024):
        for groups in (1, 2, 4, 6):
            med, _ = time_plan(config(layers, groups), args.repeat)
            rows.append(
                {
                    "case": f"{layers} layers / {groups} groups",
                    "layers": layers,
                    "groups": groups,
                    "median_ms": med,
                    "ratio_to_gemma": med / base,
                }
            )
    print(f"{'case':48} {'median ms':>10} {'x gemma':>8} {'us/layer':>9}")
    for row in rows:
        print(
            f"{row['case']:48} {row['median_ms']:10.2f} {row['ratio_to_gemma']:8.2f} "
            f"{1e3 * row['median_ms'] / row['layers']:9.1f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
