#!/usr/bin/env python3
"""What one ``/metrics`` scrape of kvplan's series costs when the dump directory is hostile.
(CPU only; no vLLM engine.)

    python benchmarks/bench_scrape.py [--scrapes 20] [--decoys 1025] [--json OUT.json]

Two dump directories, each with rank 0's stats file and plan:

* ``clean``: nothing else;
* ``hostile``: a 16 MiB ``rank7.plan.json`` that is one JSON string (a size the one reader
  accepts, and not a plan), ``--decoys`` valid stats files in a subdirectory that sorts
  before rank 0's file, and as many ``rank<N>.stats.json`` in the directory itself that each
  say rank 0.

Each directory is scraped in a fresh process (the collector's imports done first): the first
scrape, then ``--scrapes`` more; one scrape is what the API server does for kvplan's part of
``/metrics`` (the collector's samples, rendered by ``prometheus_client.generate_latest``).
Reported per directory: the first scrape's seconds, the later scrapes' median and max, the
process's peak RSS after the scrapes, and whether rank 0's series were there; then the
hostile peak RSS minus the clean one (the issue's bounds: 0.2 s a scrape, 50 MB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

MiB = 1 << 20

_SCRAPE = r"""
import json, resource, statistics, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/src"]
from pathlib import Path
from prometheus_client import CollectorRegistry, generate_latest
from kvplan.integrations.vllm.metrics import EngineSource, KVPlanCollector, Reader

def registry(directory):
    reader = Reader()
    reader.add(EngineSource("tiny", "0", directory))
    out = CollectorRegistry()
    out.register(KVPlanCollector(reader))
    return out

generate_latest(registry(Path(sys.argv[2]) / "missing"))  # the imports, nothing read
scraped = registry(Path(sys.argv[2]))
times, text = [], b""
for _ in range(1 + int(sys.argv[3])):
    t = time.perf_counter()
    text = generate_latest(scraped)
    times.append(time.perf_counter() - t)
later = times[1:] or times
print(json.dumps({
    "first_s": times[0], "median_s": statistics.median(later), "max_s": max(later),
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "rank0": b'kvplan_kv_mapped_bytes{engine="0",model_name="tiny",rank="0"}' in text,
    "bytes": len(text),
}))
"""


def build(base: Path, decoys: int) -> tuple[Path, Path]:
    from harness._builders import llama
    from harness._stats import make_stats
    from kvplan.elastic.files import write_stats
    from kvplan.planner import build_plan
    from kvplan.schemas.loading import dump, parse_input

    plan, _ = build_plan(parse_input(llama()))
    assert plan is not None
    dirs = []
    for name in ("clean", "hostile"):
        d = base / name
        d.mkdir(mode=0o700)
        dump(plan, d / "rank0.plan.json")
        dirs.append(d)
    hostile = dirs[1]
    (hostile / "rank7.plan.json").write_text('{"x": "' + "a" * (16 * MiB - 10) + '"}')
    sub = hostile / "a"
    sub.mkdir()
    forged = make_stats(rank=0, mapped_bytes=1).model_dump_json()
    for rank in range(1, decoys + 1):
        write_stats(sub, make_stats(rank=rank))
        (hostile / f"rank{rank}.stats.json").write_text(forged)
    import time

    for d in dirs:  # rank 0's snapshot after its plan: this run's
        write_stats(d, make_stats(rank=0, time=time.time()))
    return dirs[0], dirs[1]


def scrape(directory: Path, scrapes: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _SCRAPE, str(ROOT), str(directory), str(scrapes)],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    found: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--decoys", type=int, default=1025)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvplan-bench-scrape-") as tmp:
        clean, hostile = build(Path(tmp), args.decoys)
        results = {"clean": scrape(clean, args.scrapes), "hostile": scrape(hostile, args.scrapes)}
    results["extra_rss_bytes"] = (
        results["hostile"]["peak_rss_bytes"] - results["clean"]["peak_rss_bytes"]
    )
    for name in ("clean", "hostile"):
        r = results[name]
        print(
            f"{name:8} first {r['first_s'] * 1e3:7.1f} ms  later median {r['median_s'] * 1e3:6.1f}"
            f" ms max {r['max_s'] * 1e3:6.1f} ms  peak RSS {r['peak_rss_bytes'] / MiB:6.1f} MiB"
            f"  rank 0 {'present' if r['rank0'] else 'MISSING'}"
        )
    print(f"hostile - clean peak RSS: {results['extra_rss_bytes'] / MiB:.1f} MiB")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
