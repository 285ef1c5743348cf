"""One real vLLM engine in this process, serving a trace (run by the engine venv).

``python _coloc_driver.py JOB.json RESULT.json``: the co-location tests and benchmark start one
such process per engine, so that several engines share the machine (and a kvplan group) as
separate processes do in production. The job names the model folder, the engine arguments and
the requests; the process environment (``KVPLAN_*``) is the engine's.

**serve** (``"mode": "serve"``): requests carry a *phase* and an arrival time ``at`` (seconds
after the phase starts). The process writes ``CONTROL/<name>.ready`` once the engine is built,
starts phase ``P`` when ``CONTROL/go-P`` appears (it holds the phase's start, unix seconds),
adds each request when its time comes and steps the engine while it has requests (as a
server's busy loop does: an idle engine does not step), and writes
``CONTROL/<name>.done-P`` when every request of phase ``P`` finished. ``CONTROL/stop`` ends
it early (the unfinished requests are aborted). After the trace, ``"then": "replay"`` replays it
in a vanilla engine in the same process (below).

**replay** (``"mode": "replay"``, or ``"then"``): vanilla vLLM (kvplan's plugin off) given the
schedule's inputs of a served run: each request is added before the same scheduler step
(``arrival_step``) as in the served run, and at every free-block count the scheduler takes while
scheduling, vanilla's own ``BlockPool`` holds as many blocks as the served engine's pool said
were free (the elastic pool counts only the blocks its limit or group grant lets it back). The
difference is held by *ballast*: blocks taken and given back through vLLM's own
``get_new_blocks``/``free_blocks``, so vLLM's count is its own. Then vLLM makes the same
decisions (admission, preemption, the same batches), which the result records per step for the
test to compare.

Recorded per step (scheduler call): the wall time, every request's scheduled tokens, the
preempted requests, the free-block counts vLLM took, and in elastic mode what the engine maps
and what its group grants it. Per request: arrival (time and step), first-token and finish
times, tokens. ``"profile": PATH``: every engine step runs under ``cProfile``, its stats
written to ``PATH`` when the serve loop ends (a diagnosis: the profiler slows Python code). This
file imports only vLLM, torch, kvplan and ``driver.py``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import driver  # the engine tests' weight re-draw, preemption counter and error chain

REPLAY_KV_BYTES = 16 << 20
"""The KV size a replay engine is told (its block count is the served engine's)."""
POLL_SECONDS = 0.002
"""How long the idle loop sleeps between looks at the clock while a phase's requests are due."""
IDLE_POLL_SECONDS = 0.02
"""How long it sleeps while no opened phase has a request left to add (engines waiting for
their next phase cost the machine next to nothing)."""


class Recorder:
    """What the scheduler did, step by step (test instrumentation around vLLM's own methods)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.in_schedule = False
        self.in_new_blocks = 0
        self.counts: list[int] = []
        self.free: list[int] = []
        """vLLM's own count at each of :attr:`counts` (free blocks of the whole pool)."""
        self.applies: list[list[float]] = []
        """Elastic mode: every change of what the worker maps in a step (or between steps),
        ``[t0, t1, before, after]`` (unix seconds around the worker's unmap+map, bytes before
        and after)."""
        self.aheads: list[list[float]] = []
        """The same for the busy engine's maps ahead, on the worker's mapping thread (off the
        step)."""
        self.preempted: list[str] = []
        self.forced: list[str] = []
        """Requests preempted in this step before vLLM took any count: kvplan's own
        preemptions (blocks in use above the effective limit), which the replay repeats."""
        self.replay: list[list[int]] | None = None
        self.replay_forced: list[list[str]] = []
        """Replay: the served run's :attr:`forced` preemptions, per step."""
        """Replay: the free-block counts to reproduce, per step."""
        self.ballast: list[Any] = []
        self.mismatches: list[str] = []
        self.side: Any = None
        """Elastic mode: kvplan's scheduler side (ledger, group membership)."""

    @property
    def step(self) -> int:
        return len(self.steps)

    def install(self) -> None:
        """Make this the recorder vLLM's scheduler (and kvplan's worker side) report to."""
        _CURRENT[:] = [self]
        if not _INSTALLED:
            _install()
            _INSTALLED.append(True)

    def watch(self, scheduler: Any) -> None:
        """Record what ``scheduler`` does each step, through attributes of the instance (the
        class's methods, which kvplan's plugin wraps, stay as they are): its steps, its
        preemptions and — recorded (serve) or reproduced (replay) — the free-block counts vLLM
        takes while it schedules; counts inside ``get_new_blocks`` (its own sanity check) and
        outside ``schedule`` (statistics) decide nothing and are left out."""
        schedule, preempt = scheduler.schedule, scheduler._preempt_request
        recorder = self

        def recorded_schedule(*args: Any, **kwargs: Any) -> Any:
            recorder.in_schedule = True
            recorder.counts, recorder.free, recorder.preempted = [], [], []
            recorder.forced = []
            if recorder.replay is not None:
                recorder.force_preemptions(scheduler)
            t0 = time.perf_counter()
            try:
                out = schedule(*args, **kwargs)
            finally:
                recorder.in_schedule = False
            recorder.end_step(out, time.perf_counter() - t0)
            return out

        def recorded_preempt(request: Any, *args: Any, **kwargs: Any) -> Any:
            recorder.preempted.append(request.request_id)
            if recorder.in_schedule and not recorder.counts:
                recorder.forced.append(external(request.request_id))
            return preempt(request, *args, **kwargs)

        scheduler.schedule = recorded_schedule
        scheduler._preempt_request = recorded_preempt
        pool = scheduler.kv_cache_manager.block_pool
        count, new_blocks = pool.get_num_free_blocks, pool.get_new_blocks

        def get_new_blocks(n: int) -> Any:
            recorder.in_new_blocks += 1
            try:
                return new_blocks(n)
            finally:
                recorder.in_new_blocks -= 1

        def get_num_free_blocks() -> int:
            if not recorder.in_schedule or recorder.in_new_blocks:
                return int(count())
            if recorder.replay is not None:
                recorder.reproduce(pool, count, get_new_blocks)
            found = int(count())
            recorder.counts.append(found)
            recorder.free.append(int(pool.free_block_queue.num_free_blocks))
            return found

        pool.get_new_blocks = get_new_blocks
        pool.get_num_free_blocks = get_num_free_blocks
        side = getattr(pool, "_kvplan", None)
        self.side = side

    def force_preemptions(self, scheduler: Any) -> None:
        """Replay: preempt what kvplan preempted before this step was scheduled when served
        (the same requests, in the same order), as kvplan does it."""
        wanted = self.replay_forced[self.step] if self.step < len(self.replay_forced) else []
        for rid in wanted:
            found = [r for r in scheduler.running if external(r.request_id) == rid]
            if not found:
                self.mismatches.append(f"step {self.step}: {rid} is not running to preempt")
                continue
            scheduler.running.remove(found[0])
            scheduler._preempt_request(found[0], time.monotonic())
            scheduler.prev_step_scheduled_req_ids.discard(found[0].request_id)

    def reproduce(self, pool: Any, count: Any, get_new_blocks: Any) -> None:
        assert self.replay is not None
        index = len(self.counts)
        wanted = self.replay[self.step] if self.step < len(self.replay) else []
        if index >= len(wanted):
            self.mismatches.append(f"step {self.step}: count #{index} was not taken when served")
            return
        target, real = wanted[index], int(count())
        if real > target:
            self.ballast.extend(get_new_blocks(real - target))
        elif real < target:
            back = min(len(self.ballast), target - real)
            if back:
                pool.free_blocks([self.ballast.pop() for _ in range(back)])
            if back < target - real:
                self.mismatches.append(f"step {self.step}: {target} free wanted, {real} free")

    def end_step(self, out: Any, seconds: float) -> None:
        entry: dict[str, Any] = {
            "t": time.time(),
            "schedule_s": round(seconds, 6),
            "scheduled": {external(k): int(v) for k, v in sorted(out.num_scheduled_tokens.items())},
            "preempted": [external(r) for r in self.preempted],
            "forced": list(self.forced),
            "counts": list(self.counts),
            "free": list(self.free),
        }
        if self.replay is not None:
            served = self.replay[self.step] if self.step < len(self.replay) else []
            if len(served) != len(self.counts):
                self.mismatches.append(
                    f"step {self.step}: {len(self.counts)} counts taken, {len(served)} when served"
                )
        side = self.side
        if side is not None:
            entry["mapped"] = int(side.ledger.mapped_bytes)
            entry["limit"] = int(side.effective_limit())
            group = side.group
            if group is not None:
                entry["granted"] = int(group.granted)
                entry["group_ops"] = int(getattr(group, "group_ops", 0))
                entry["group_limit"] = int(group.effective_limit)
                entry["asked"] = int(getattr(side, "asked", 0))  # older kvplan: no asks
                entry["claim"] = int(group.claim)
        self.steps.append(entry)


_CURRENT: list[Recorder] = []
_INSTALLED: list[bool] = []


def _install() -> None:
    """Wrap kvplan's ``WorkerSide.apply`` and its map ahead on the worker's mapping thread once
    (they report to the current :class:`Recorder`): every change of what the worker maps, with
    the time around it (elastic mode). An ``apply`` that joins a map ahead is logged from
    before it waits for that map, its ``before`` read once the map ended: over the wait the
    logged bound is what the map ahead reached, never less than what was mapped."""
    from kvplan.integrations.vllm.elastic import _worker

    apply = _worker.WorkerSide.apply
    map_ahead = getattr(_worker.WorkerSide, "_map_ahead", None)  # None: a kvplan without it

    def logged(into: str, change: Any, side: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        ahead = getattr(side, "_ahead", None) if into == "applies" else None
        if ahead is not None:  # apply joins it first: wait here (nothing is consumed), so
            ahead[1].exception()  # ``before`` is after it and the interval covers the wait
        before = int(side.cache.mapped_bytes)
        try:
            return change(side, *args, **kwargs)
        finally:
            after = int(side.cache.mapped_bytes)
            if after != before or ahead is not None:
                getattr(_CURRENT[0], into).append([t0, time.time(), before, after])

    def logged_apply(side: Any, ops: Any, **kwargs: Any) -> None:
        logged("applies", apply, side, ops, **kwargs)

    def logged_map_ahead(side: Any, blocks: Any, inject: bool) -> Any:
        return logged("aheads", map_ahead, side, blocks, inject)

    _worker.WorkerSide.apply = logged_apply  # type: ignore[method-assign]
    if map_ahead is not None:
        _worker.WorkerSide._map_ahead = logged_map_ahead  # type: ignore[method-assign]


def external(request_id: str) -> str:
    """The id a request was added with (vLLM appends ``-`` and 8 random characters)."""
    head, _, tail = str(request_id).rpartition("-")
    return head if head and len(tail) == 8 else str(request_id)


def build(job: dict[str, Any]) -> tuple[Any, Any]:
    """The engine (``LLMEngine``) and its scheduler (``None`` when the engine core runs in a
    process of its own, ``"multiprocess"``)."""
    from vllm import LLM

    llm = LLM(model=job["model"], **job["engine"])
    if job.get("multiprocess"):
        return llm, None
    core = llm.llm_engine.engine_core.engine_core
    return llm, core.scheduler


def params(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def prompt_of(tokens: list[int]) -> Any:
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(tokens))


class Requests:
    """Per request: arrival, first token, finish, tokens."""

    def __init__(self, requests: list[dict[str, Any]]) -> None:
        self.spec = {r["id"]: r for r in requests}
        self.state: dict[str, dict[str, Any]] = {}

    def added(self, rid: str, step: int) -> None:
        self.state[rid] = {
            "arrival": time.time(),
            "arrival_step": step,
            "order": len(self.state),
            "tokens": [],
        }

    def outputs(self, outs: list[Any]) -> list[str]:
        done = []
        now = time.time()
        for out in outs:
            state = self.state[external(out.request_id)]
            tokens = list(out.outputs[0].token_ids) if out.outputs else []
            if tokens and "first_token" not in state:
                state["first_token"] = now
            state["tokens"] = tokens
            if out.finished:
                state["finished"] = now
                done.append(external(out.request_id))
        return done


def serve(
    job: dict[str, Any], llm: Any, recorder: Recorder, control: Path, flush: Any
) -> dict[str, Any]:
    """Serve the job's requests as their phases open (see the module doc); ``flush(state)``
    after each phase is done (a process killed later leaves the record up to there)."""
    engine = llm.llm_engine
    scheduler = None if job.get("multiprocess") else engine.engine_core.engine_core.scheduler
    name = job["name"]
    requests = Requests(job["requests"])
    like_generate = bool(job.get("like_generate"))

    def busy() -> bool:
        """vLLM's engine core steps while its scheduler has requests: unfinished ones, or
        finished ones not yet reported (that step carries the last unmaps). ``like_generate``
        (and an engine core in a process of its own, which steps itself): only while
        requests are unfinished, as ``LLM.generate`` steps an in-process engine."""
        if like_generate or scheduler is None:
            return bool(engine.has_unfinished_requests())
        return bool(engine.has_unfinished_requests() or scheduler.has_requests())

    phases: list[str] = list(dict.fromkeys(r["phase"] for r in job["requests"]))
    starts: dict[str, float] = {}
    pending = sorted(job["requests"], key=lambda r: (phases.index(r["phase"]), r["at"], r["id"]))
    waiting: dict[str, set[str]] = {p: set() for p in phases}
    for r in job["requests"]:
        waiting[r["phase"]].add(r["id"])
    closed: set[str] = set()
    finished_phases: set[str] = set()
    stopped = False
    next_look = 0.0

    def state() -> dict[str, Any]:
        return {"requests": requests.state, "phase_starts": starts, "closed": sorted(closed)}

    def check_done() -> None:
        for phase in phases:
            if phase in finished_phases or phase not in starts or waiting[phase]:
                continue
            finished_phases.add(phase)
            flush(state())
            (control / f"{name}.done-{phase}").write_text(f"{time.time()}\n")

    linger = bool(job.get("linger"))
    profiler = None
    if job.get("profile"):  # every engine step, dumped when the engine stops (``profile``)
        import cProfile

        profiler = cProfile.Profile()
    while pending or busy() or (linger and not stopped):
        now = time.time()
        if now >= next_look:
            next_look = now + 0.02
            for phase in phases:
                if phase not in starts and (control / f"go-{phase}").is_file():
                    text = (control / f"go-{phase}").read_text().strip()
                    if text:
                        starts[phase] = float(text)
                if phase not in closed and (control / f"close-{phase}").is_file():
                    closed.add(phase)  # its requests not added yet are dropped
                    for r in [r for r in pending if r["phase"] == phase]:
                        pending.remove(r)
                        waiting[phase].discard(r["id"])
            if (control / "stop").exists():
                stopped = True
                break
            if linger and (control / "end").exists():
                linger = False
            check_done()
        while pending and pending[0]["phase"] in starts:
            r = pending[0]
            if now < starts[r["phase"]] + float(r["at"]):
                break
            pending.pop(0)
            engine.add_request(r["id"], prompt_of(r["prompt"]), params(int(r["max_tokens"])))
            requests.added(r["id"], recorder.step)
        if busy():
            stepped = engine.step() if profiler is None else profiler.runcall(engine.step)
            for rid in requests.outputs(stepped):
                waiting[requests.spec[rid]["phase"]].discard(rid)
            check_done()
        elif pending and pending[0]["phase"] in starts:
            time.sleep(POLL_SECONDS)  # the next request is due soon
        else:
            time.sleep(IDLE_POLL_SECONDS)  # no open phase: look at the control folder only
    check_done()
    if profiler is not None:
        profiler.dump_stats(job["profile"])
    if stopped:
        unfinished = [rid for rid, s in requests.state.items() if "finished" not in s]
        if unfinished:
            engine.abort_request(unfinished)
    return {**state(), "stopped": stopped}


def replay(
    job: dict[str, Any], llm: Any, recorder: Recorder, served: dict[str, Any]
) -> dict[str, Any]:
    """Replay ``served`` (a serve result) in this (vanilla) engine, step by step."""
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    requests = Requests(job["requests"])
    arrivals: dict[int, list[str]] = {}
    for rid, state in served["requests"].items():
        arrivals.setdefault(int(state["arrival_step"]), []).append(rid)
    recorder.replay = [list(s["counts"]) for s in served["steps"]]
    recorder.replay_forced = [list(s.get("forced", [])) for s in served["steps"]]
    steps = len(served["steps"])
    while recorder.step < steps:
        due = arrivals.pop(recorder.step, [])
        for rid in sorted(due, key=lambda r: served["requests"][r]["order"]):
            spec = requests.spec[rid]
            engine.add_request(rid, prompt_of(spec["prompt"]), params(int(spec["max_tokens"])))
            requests.added(rid, recorder.step)
        if not (engine.has_unfinished_requests() or scheduler.has_requests()):
            recorder.mismatches.append(f"step {recorder.step}: nothing to schedule")
            break
        before = recorder.step
        requests.outputs(engine.step())
        if recorder.step != before + 1:
            recorder.mismatches.append(f"step {before}: the engine did not schedule once")
            break
    return {"requests": requests.state}


def blocks_of(scheduler: Any) -> int:
    return int(scheduler.kv_cache_manager.block_pool.num_gpu_blocks)


def run_serve(job: dict[str, Any], control: Path, write: Any) -> dict[str, Any]:
    from kvplan.integrations.vllm import plugin

    recorder = Recorder()
    recorder.install()
    started = time.time()
    if job.get("expect_refusal"):
        return refused(job, started)
    llm, scheduler = build(job)
    if scheduler is not None:
        recorder.watch(scheduler)
    result: dict[str, Any] = {
        "name": job["name"],
        "pid": os.getpid(),
        "active": plugin.is_active(),
        "num_blocks": None if scheduler is None else blocks_of(scheduler),
        "started": started,
        "startup_s": time.time() - started,
        "redrawn_parameters": driver._REDRAWN.pop() if driver._REDRAWN else 0,
    }
    (control / f"{job['name']}.ready").write_text(json.dumps({"pid": os.getpid()}) + "\n")

    def flush(state: dict[str, Any]) -> None:
        flushed = {
            "steps": recorder.steps, "applies": recorder.applies, "aheads": recorder.aheads,
            "flushed_at": time.time(),
        }  # fmt: skip
        write({"serve": {**result, **state, **flushed}})

    served = serve(job, llm, recorder, control, flush)
    result.update(
        served,
        steps=recorder.steps,
        applies=recorder.applies,
        aheads=recorder.aheads,
        preemptions=driver._PREEMPTIONS[0],
        ended=time.time(),
    )
    result["kvplan_stats"] = plugin.stats()
    llm.llm_engine.engine_core.shutdown()  # leaves the group before anything else runs here
    del llm, scheduler
    gc.collect()
    return result


def refused(job: dict[str, Any], started: float) -> dict[str, Any]:
    """Start an engine that should refuse to start; every diagnostic of the error chain."""
    result: dict[str, Any] = {"name": job["name"], "started": started, "refused": False}
    try:
        llm, _ = build(job)
    except Exception as exc:  # the refusal under test
        result.update(refused=True, error=driver.error_chain(exc))
    else:
        llm.llm_engine.engine_core.shutdown()
    result["ended"] = time.time()
    return result


def vanilla_here() -> None:
    """From here on this process runs vanilla vLLM (kvplan's plugin off)."""
    from kvplan.integrations.vllm import plugin

    for key in [k for k in os.environ if k.startswith("KVPLAN_")]:
        del os.environ[key]
    plugin.unregister()
    plugin.register()  # KVPLAN_ENABLE is unset: vanilla vLLM


def run_reference(job: dict[str, Any], served: dict[str, Any]) -> dict[str, Any]:
    """Vanilla vLLM given the served requests at once, in the order they were added, with the
    served engine's arguments: their tokens. Comparable where the served engine's batches did
    not depend on its memory: one request at a time (``max_num_seqs`` 1), or a burst that
    arrived at once and was admitted whole (the test checks which)."""
    from kvplan.integrations.vllm import plugin

    vanilla_here()
    engine_args = {**job["engine"], "kv_cache_memory_bytes": REPLAY_KV_BYTES}
    llm, _ = build({**job, "engine": engine_args})
    spec = {r["id"]: r for r in job["requests"]}
    order = sorted(served["requests"], key=lambda rid: served["requests"][rid]["order"])
    outs = llm.generate(
        [prompt_of(spec[rid]["prompt"]) for rid in order],
        [params(int(spec[rid]["max_tokens"])) for rid in order],
        use_tqdm=False,
    )
    result = {
        "active": plugin.is_active(),
        "requests": {
            rid: {"tokens": list(o.outputs[0].token_ids)}
            for rid, o in zip(order, outs, strict=True)
        },
    }
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return result


def run_replay(job: dict[str, Any], served: dict[str, Any]) -> dict[str, Any]:
    from kvplan.integrations.vllm import plugin

    vanilla_here()
    recorder = Recorder()
    recorder.install()
    engine_args = {**job["engine"], "num_gpu_blocks_override": int(served["num_blocks"])}
    # an explicit size: vLLM's own (total x utilization - this process's resident set, which
    # the served engine grew) could leave nothing; the override sets the block count anyway
    engine_args.setdefault("kv_cache_memory_bytes", REPLAY_KV_BYTES)
    before = driver._PREEMPTIONS[0]
    llm, scheduler = build({**job, "engine": engine_args})
    recorder.watch(scheduler)
    replayed = replay(job, llm, recorder, served)
    result = {
        "active": plugin.is_active(),
        "num_blocks": blocks_of(scheduler),
        "steps": recorder.steps,
        "mismatches": recorder.mismatches,
        "preemptions": driver._PREEMPTIONS[0] - before,
        **replayed,
    }
    del llm, scheduler
    gc.collect()
    return result


def main(argv: list[str]) -> int:
    job_path, result_path = Path(argv[1]), Path(argv[2])
    job = json.loads(job_path.read_text())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if job.get("multiprocess") else "0"
    if job.get("redraw", True):  # a checkpoint with real weights is loaded as it is
        driver.install_redraw(int(job.get("seed", 0)), float(job.get("gain", 1.0)))
    driver.count_preemptions()
    control = Path(job["control"])

    def write(result: dict[str, Any]) -> None:
        temporary = result_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(result))
        temporary.replace(result_path)

    if job["mode"] == "replay":
        served = json.loads(Path(job["served"]).read_text())["serve"]
        write({"replay": run_replay(job, served)})
        return 0
    served = run_serve(job, control, write)
    write({"serve": served})
    if job.get("then") == "replay":
        write({"serve": served, "replay": run_replay(job, served)})
    elif job.get("then") == "reference":
        write({"serve": served, "reference": run_reference(job, served)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
