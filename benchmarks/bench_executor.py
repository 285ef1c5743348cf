#!/usr/bin/env python3
"""Executor benchmark (CPU): apply time against vLLM's vanilla path, host-vmm map throughput.

    python benchmarks/bench_executor.py [--repeats 5] [--json OUT.json]

1. Apply time of a gemma-4-E2B-sized plan (35 layers: 15 bf16 views + 20 aliases, ~256 MiB)
   and a Llama-3.1-8B-sized plan (32 layers, 8 KV heads, head 128, bf16, bs 16, 1 GiB)
   against the vanilla path (one ``torch.zeros`` int8 buffer plus ``as_strided`` views, as
   vLLM's ``allocate_kv_cache`` does), in the same process, runs interleaved; ratios of
   medians. Backends: ``torch``; ``host-vmm`` (fresh memfd pages are zero, faulted lazily);
   ``host-vmm+populate`` (pages pre-faulted at map, the cost of committing memory);
   ``host-vmm+memset`` (explicit zeroing, the CUDA-like path).
2. host-vmm map throughput (GiB/s of the map phase) by chunk size (2, 8, 32, 128 MiB).

Works from a checkout without installing kvplan (``src/`` is put on ``sys.path``).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

import torch  # noqa: E402

from harness.executor import _plans as plans  # noqa: E402
from harness.executor._patterns import vanilla  # noqa: E402
from kvplan.executor import apply  # noqa: E402
from kvplan.executor.backends.host_vmm import HostVmmBackend  # noqa: E402
from kvplan.schemas.plan import BindingPlan  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def time_once(fn: Callable[[], Callable[[], None]]) -> float:
    """Seconds ``fn`` takes; ``fn`` returns a cleanup that runs untimed."""
    gc.collect()
    t0 = time.perf_counter()
    cleanup = fn()
    elapsed = time.perf_counter() - t0
    cleanup()
    return elapsed


def variants(plan: BindingPlan) -> dict[str, Callable[[], Callable[[], None]]]:
    def run_vanilla() -> Callable[[], None]:
        raw, views = vanilla(plan)
        return lambda: (raw.clear(), views.clear(), None)[-1]

    def run(backend: str, **opts: Any) -> Callable[[], Callable[[], None]]:
        def go() -> Callable[[], None]:
            be = HostVmmBackend(**opts) if backend == "host-vmm" else backend
            cache = apply(plan, backend=be)  # type: ignore[arg-type]
            return cache.close

        return go

    return {
        "vanilla": run_vanilla,
        "torch": run("torch"),
        "host-vmm": run("host-vmm"),
        "host-vmm+populate": run("host-vmm", populate=True),
        "host-vmm+memset": run("host-vmm", assume_zeroed=False),
    }


def bench_apply(name: str, plan: BindingPlan, repeats: int) -> dict[str, Any]:
    fns = variants(plan)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up round
        time_once(fn)
    for _ in range(repeats):
        for key, fn in fns.items():
            samples[key].append(time_once(fn))
    med = {k: statistics.median(v) for k, v in samples.items()}
    result = {
        "pool_bytes": sum(p.size_bytes for p in plan.pools),
        "views": len(plan.views),
        "aliases": len(plan.aliases),
        "median_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "ratio_vs_vanilla": {
            k: round(v / med["vanilla"], 3) for k, v in med.items() if k != "vanilla"
        },
    }
    print(f"{name}: {json.dumps(result)}", flush=True)
    return result


def bench_throughput(repeats: int, size: int) -> dict[str, Any]:
    plan = plans.whole_pool_plan(size=size, num_blocks=1)
    out: dict[str, Any] = {}
    for chunk_mib in (2, 8, 32, 128):
        row: dict[str, Any] = {}
        for label, opts in (("lazy", {}), ("populate", {"populate": True})):
            maps = []
            for _ in range(repeats):
                cache = apply(plan, backend=HostVmmBackend(**opts), chunk_size=chunk_mib * MiB)
                maps.append(cache.timings_ms["map"] / 1e3)
                cache.close()
            m = statistics.median(maps)
            row[f"{label}_map_ms"] = round(m * 1e3, 3)
            row[f"{label}_GiBps"] = round(size / GiB / m, 2)
        out[f"{chunk_mib}MiB"] = row
        print(f"host-vmm map {chunk_mib} MiB chunks: {json.dumps(row)}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per variant")
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--throughput-bytes", type=int, default=GiB, help="pool size, bytes")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "apply": {
            "gemma-4-e2b-256MiB": bench_apply("gemma-4-e2b", plans.gemma_e2b_plan(), args.repeats),
            "llama-3.1-8b-1GiB": bench_apply("llama-3.1-8b", plans.llama_8b_plan(), args.repeats),
        },
        "host_vmm_map_throughput": bench_throughput(args.repeats, args.throughput_bytes),
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
