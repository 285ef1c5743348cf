"""Time to draw a plan as an HTML page (a plain script; prints a table, or --json).

    python benchmarks/bench_render.py [--json OUT] [--repeat 10]

For each plan: the median time of ``kvplan.render.plan_page`` (and ``diff_page`` against the
same input in the block-outermost BLHNC layout), the page size, and the ratio to writing the
same plan as canonical JSON (``kvplan.dumps``), measured in the same run. Then the renderer's
own cost per layer (process CPU time, best of 3, so other work on the machine counts less) at
2,500 and 10,000 layers: a ratio near 1 means linear.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import kvplan  # noqa: E402
from harness import _builders as b  # noqa: E402
from harness.render._pictures import gemma_blhnc_plan, gemma_plan  # noqa: E402
from kvplan.render import diff_page, plan_page  # noqa: E402
from kvplan.schemas.loading import dumps, parse_input  # noqa: E402
from kvplan.schemas.plan import BindingPlan  # noqa: E402


def big(num_layers: int, num_groups: int, layout: str) -> BindingPlan:
    names = [b.name(i) for i in range(num_layers)]
    groups = [
        (names[g::num_groups], b.attn_spec(heads=8, head_size=128)) for g in range(num_groups)
    ]
    return kvplan.plan(parse_input(b.document(groups, num_blocks=4096, layout=layout)))


def cpu_seconds(fn: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="write results as JSON here")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    cases = [
        ("gemma-4-E2B (15 views, 20 aliases)", gemma_plan(), gemma_blhnc_plan()),
        ("1024 layers / 1 group", big(1024, 1, "LBNHC"), big(1024, 1, "BLHNC")),
        ("1024 layers / 6 groups", big(1024, 6, "LBNHC"), big(1024, 6, "BLHNC")),
        ("10000 layers / 6 groups", big(10000, 6, "LBNHC"), big(10000, 6, "BLHNC")),
    ]
    rows = []
    for name, plan, other in cases:
        json_ms = median_ms(lambda plan=plan: dumps(plan), args.repeat)
        page_ms = median_ms(lambda plan=plan: plan_page(plan), args.repeat)
        diff_ms = median_ms(lambda p=plan, o=other: diff_page(p, o), args.repeat)
        rows.append(
            {
                "case": name,
                "page_ms": page_ms,
                "page_kb": len(plan_page(plan).encode()) / 1e3,
                "page_vs_json": page_ms / json_ms,
                "diff_ms": diff_ms,
                "diff_kb": len(diff_page(plan, other).encode()) / 1e3,
                "json_ms": json_ms,
            }
        )
    print(f"{'case':38} {'page ms':>8} {'page KB':>8} {'x JSON':>7} {'diff ms':>8} {'diff KB':>8}")
    for r in rows:
        print(
            f"{r['case']:38} {r['page_ms']:8.1f} {r['page_kb']:8.0f} {r['page_vs_json']:7.1f} "
            f"{r['diff_ms']:8.1f} {r['diff_kb']:8.0f}"
        )
    scaling = {}
    for groups in (1, 6):
        per_layer = {}
        for layers in (2500, 10000):
            plan = big(layers, groups, "LBNHC")
            per_layer[layers] = cpu_seconds(lambda plan=plan: plan_page(plan)) / layers * 1e6
        scaling[groups] = per_layer
        print(
            f"{groups} group(s): {per_layer[2500]:.1f} us/layer at 2,500 layers, "
            f"{per_layer[10000]:.1f} at 10,000 (ratio {per_layer[10000] / per_layer[2500]:.2f})"
        )
    if args.json:
        out = {"cases": rows, "us_per_layer": scaling}
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
