"""Helpers of the co-location tests and benchmark: engines as separate processes, a seeded
trace of bursts, a sampler of the stats files and the group ledger, and the checks.

One engine per process (``_coloc_driver.py`` in the engine venv); the caller (the test
process) starts them, opens the trace's phases (``go``), waits for them to finish, samples
every engine's ``rank0.stats.json`` and the group's snapshot while they run, and can
``kill -9`` one. Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engine.harness import engine_env, kvplan_env

COLOC_DRIVER = Path(__file__).resolve().parent / "_coloc_driver.py"

ENGINE = {
    "load_format": "dummy",
    "skip_tokenizer_init": True,
    "enforce_eager": True,
    "block_size": 32,
    "max_model_len": 128,
    "max_num_seqs": 4,
    "enable_prefix_caching": False,
    "seed": 0,
    "gpu_memory_utilization": 0.05,
}
"""Engine arguments of every co-located engine. No prefix caching (as kvcached's co-location
benchmark runs): what a cached block holds then depends only on the request, and the vanilla
replay reproduces the schedule exactly (an elastic engine evicts cached pages its limit cannot
keep, which vanilla vLLM would keep)."""

CAPACITY = 16 << 20
"""The KV reservation of every engine, per rank (``KVPLAN_CAPACITY``, or the size vLLM is told)."""


# -- the trace --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Burst:
    """``count`` requests of one engine, the first ``start`` seconds after the phase opens, then
    one every ``gap`` seconds on average (each gap drawn from 0.5-1.5 ``gap``), prompts of
    ``prompt`` tokens (a range), ``new`` generated."""

    engine: str
    phase: str
    count: int
    prompt: tuple[int, int] = (40, 90)
    new: tuple[int, int] = (24, 36)
    start: float = 0.0
    gap: float = 0.05


def trace(bursts: list[Burst], seed: int, vocab: int = 512) -> dict[str, list[dict[str, Any]]]:
    """Requests per engine from ``bursts``: token ids, lengths and arrival jitter drawn from
    ``seed`` (the same seed gives the same trace)."""
    rng = random.Random(seed)
    out: dict[str, list[dict[str, Any]]] = {}
    for burst in bursts:
        items = out.setdefault(burst.engine, [])
        at = burst.start
        for i in range(burst.count):
            length = rng.randint(*burst.prompt)
            items.append(
                {
                    "id": f"{burst.engine}{burst.phase}{i}",
                    "phase": burst.phase,
                    "at": round(at, 4),
                    "prompt": [rng.randrange(3, vocab) for _ in range(length)],
                    "max_tokens": rng.randint(*burst.new),
                }
            )
            at += burst.gap * rng.uniform(0.5, 1.5)
    return out


# -- engines as processes ---------------------------------------------------------------------


@contextmanager
def group_directory(fallback: Path) -> Iterator[Path]:
    """A fresh group directory on a tmpfs (``/dev/shm``: a grant change there costs a fraction
    of a millisecond, against milliseconds of fsync on a disk, see docs/elastic.md), removed
    afterwards; under ``fallback`` where there is no ``/dev/shm``."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        directory = Path(tempfile.mkdtemp(prefix="kvplan-group-", dir=shm))
    else:
        directory = fallback / "group"
        directory.mkdir(parents=True)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def group_env(
    name: str,
    dump: Path,
    group: Path,
    *,
    budget: int | None = None,
    capacity: int | None = CAPACITY,
    **extra: str,
) -> dict[str, str]:
    """An elastic host-vmm engine in ``group``, poisoned (an unbacked block a step used would
    fault), named ``name``, dumping into ``dump``."""
    env = kvplan_env(
        "host-vmm",
        "elastic",
        dump,
        KVPLAN_POISON="1",
        KVPLAN_GROUP=str(group),
        KVPLAN_ENGINE_NAME=name,
        **extra,
    )
    if budget is not None:
        env["KVPLAN_GROUP_BUDGET"] = str(budget)
    if capacity is not None:
        env["KVPLAN_CAPACITY"] = str(capacity)
    return env


@dataclass
class Engine:
    """One engine process (``_coloc_driver.py``)."""

    name: str
    process: subprocess.Popen[bytes]
    workdir: Path
    control: Path
    log_path: Path
    result_path: Path
    killed_at: float | None = None

    def ready(self) -> bool:
        return (self.control / f"{self.name}.ready").is_file()

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def kill(self) -> float:
        """``kill -9``; the time it was sent."""
        self.killed_at = time.time()
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        return self.killed_at

    def result(self, timeout: float) -> dict[str, Any]:
        """Wait for the process to end; its result (raises with the log tail if it failed)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
            raise AssertionError(
                f"{self.name}: timed out after {timeout:.0f} s\n{self.tail()}"
            ) from None
        if code != 0 or not self.result_path.is_file():
            raise AssertionError(f"{self.name}: exit {code}\n{self.tail()}")
        found: dict[str, Any] = json.loads(self.result_path.read_text())
        return found

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


def start_engine(
    python: Path,
    name: str,
    model: Path,
    workdir: Path,
    control: Path,
    env: dict[str, str],
    requests: list[dict[str, Any]],
    *,
    engine: dict[str, Any] | None = None,
    then_replay: bool = False,
    linger: bool = False,
    expect_refusal: bool = False,
    seed: int = 1234,
    gain: float = 2.0,
    **options: Any,
) -> Engine:
    """Start one engine process (it serves ``requests`` as the phases open; ``linger``: then
    it idles until ``CONTROL/end`` appears; ``expect_refusal``: it records why it could not
    start). ``options``: more of the driver's job keys (``multiprocess``, ``like_generate``,
    ``redraw``, ``then``; see ``_coloc_driver.py``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    control.mkdir(parents=True, exist_ok=True)
    job = {
        "name": name,
        "mode": "serve",
        "model": str(model),
        "engine": engine or ENGINE,
        "requests": requests,
        "control": str(control),
        "seed": seed,
        "gain": gain,
        "then": "replay" if then_replay else None,
        "linger": linger,
        "expect_refusal": expect_refusal,
        **options,
    }
    return _launch(python, name, job, workdir, control, env)


def _launch(
    python: Path,
    name: str,
    job: dict[str, Any],
    workdir: Path,
    control: Path,
    env: dict[str, str],
) -> Engine:
    """Write ``job`` and start the co-location driver on it (``env`` over a clean base)."""
    job_path, result_path = workdir / "job.json", workdir / "result.json"
    job_path.write_text(json.dumps(job))
    log_path = workdir / "engine.log"
    process_env = engine_env()
    process_env.update(env)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(python), str(COLOC_DRIVER), str(job_path), str(result_path)],
            stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=process_env,
        )  # fmt: skip
    return Engine(name, process, workdir, control, log_path, result_path)


def replay_engine(
    python: Path,
    name: str,
    model: Path,
    workdir: Path,
    served_result: Path,
    requests: list[dict[str, Any]],
    *,
    engine: dict[str, Any] | None = None,
    seed: int = 1234,
    gain: float = 2.0,
) -> Engine:
    """Start a vanilla process replaying a served run's schedule inputs (see the driver)."""
    workdir.mkdir(parents=True, exist_ok=True)
    job = {
        "name": name,
        "mode": "replay",
        "model": str(model),
        "engine": engine or ENGINE,
        "requests": requests,
        "control": str(workdir),
        "served": str(served_result),
        "seed": seed,
        "gain": gain,
    }
    return _launch(python, name, job, workdir, workdir, {})


def wait_for(what: str, check: Any, timeout: float, engines: list[Engine]) -> None:
    """Wait until ``check()``; fail with the engines' log tails when one died or time ran out."""
    deadline = time.monotonic() + timeout
    while not check():
        for e in engines:
            if not e.alive() and e.killed_at is None and not e.result_path.is_file():
                raise AssertionError(f"{e.name} died waiting for {what}:\n{e.tail()}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {e.name}\n{e.tail(20)}" for e in engines)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")
        time.sleep(0.05)


def go(control: Path, phase: str, delay: float = 0.0) -> float:
    """Open ``phase`` for every engine watching ``control`` (atomically); its start time."""
    start = time.time() + delay
    temporary = control / f".go-{phase}.tmp"
    temporary.write_text(f"{start}\n")
    temporary.replace(control / f"go-{phase}")
    return start


def done(control: Path, name: str, phase: str) -> bool:
    return (control / f"{name}.done-{phase}").is_file()


def end(control: Path) -> None:
    """Let every lingering engine watching ``control`` (``start_engine(linger=True)``) end."""
    (control / "end").write_text("")


# -- sampling what the engines map ------------------------------------------------------------


@dataclass
class Samples:
    stats: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per dump directory, every distinct stats snapshot seen (by its ``time``), in order."""
    ledger: list[dict[str, Any]] = field(default_factory=list)
    """Group snapshots: (time, budget, granted, members' grants and liveness)."""


class Sampler:
    """Reads every engine's ``rank0.stats.json`` and the group snapshot every ``period``
    seconds in a thread, until :meth:`stop` (a stats file is rewritten at most every half
    second, so every snapshot is seen)."""

    def __init__(self, dumps: dict[str, Path], group: Path, period: float = 0.05) -> None:
        self.dumps = dict(dumps)
        self.group = group
        self.period = period
        self.samples = Samples()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, name: str, dump: Path) -> None:
        self.dumps[name] = dump

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> Samples:
        self._stop.set()
        self._thread.join(10)
        self._once()
        return self.samples

    def _run(self) -> None:
        while not self._stop.is_set():
            self._once()
            self._stop.wait(self.period)

    def _once(self) -> None:
        from kvplan.elastic.files import ElasticStats, read_stats_tree
        from kvplan.elastic.group import read_snapshot
        from kvplan.schemas.errors import KVPlanError

        for name, dump in list(self.dumps.items()):
            if not (dump / "rank0.stats.json").is_file():
                continue
            for _, item in read_stats_tree(dump):
                if not isinstance(item, ElasticStats):
                    continue
                seen = self.samples.stats.setdefault(name, [])
                if not seen or seen[-1]["time"] != item.time:
                    seen.append(item.model_dump())
        try:
            snap = read_snapshot(self.group)
        except KVPlanError:
            return
        self.samples.ledger.append(
            {
                "t": time.time(),
                "revision": snap.revision,
                "budget": snap.budget_bytes,
                "granted": snap.granted_bytes,
                "members": {
                    m.name: {
                        "granted": m.granted_bytes,
                        "effective": m.effective_limit_bytes,
                        "pid": m.pid,
                        "liveness": str(getattr(m.liveness, "value", m.liveness)),
                    }
                    for m in snap.members
                },
            }
        )


# -- checks -----------------------------------------------------------------------------------


def replay_problems(served: dict[str, Any], replayed: dict[str, Any]) -> list[str]:
    """How vanilla's replay differs from the served run: the step-by-step schedule (which
    requests, how many tokens each, which were preempted), then the tokens. Empty: the same."""
    problems = list(replayed.get("mismatches", []))
    if replayed.get("active"):
        problems.append("kvplan's plugin was active in the vanilla replay")
    ours, theirs = served["steps"], replayed["steps"]
    if len(ours) != len(theirs):
        problems.append(f"{len(ours)} steps served, {len(theirs)} replayed")
    for k, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if (a["scheduled"], a["preempted"]) != (b["scheduled"], b["preempted"]):
            problems.append(f"step {k}: served {a['scheduled']} {a['preempted']}, replayed "
                            f"{b['scheduled']} {b['preempted']}")  # fmt: skip
            break
    for rid, state in served["requests"].items():
        other = replayed["requests"].get(rid)
        if other is None:
            problems.append(f"{rid}: not replayed")
        elif other["tokens"] != state["tokens"]:
            problems.append(f"{rid}: tokens {state['tokens']} served, {other['tokens']} replayed")
    return problems


def budget_bound(served: dict[str, Any]) -> bool:
    """Whether the engine's limit (its grant) ever bound: a count it gave vLLM was smaller
    than vLLM's own count of free blocks."""
    return any(c < f for s in served["steps"] for c, f in zip(s["counts"], s["free"], strict=True))


@dataclass
class MappedLog:
    """One engine's mapped bytes over time from its step log (``applies``): exact outside
    the intervals in which its worker mapped or unmapped, and over them the larger of the
    values before and after (an upper bound that is exact as soon as the change is done)."""

    applies: list[list[float]]
    start: float
    end: float
    """Unix seconds the process started and ended (killed: died); 0 bytes outside."""
    known_until: float
    """The log covers the engine up to here (a killed engine: its last flush)."""

    def __post_init__(self) -> None:
        self.applies = sorted(self.applies)
        self._starts = [a[0] for a in self.applies]

    def known(self, t: float) -> bool:
        return t < self.start or t > self.end or t <= self.known_until

    def upper(self, t: float) -> int:
        if t < self.start or t > self.end:
            return 0
        import bisect

        i = bisect.bisect_right(self._starts, t) - 1
        if i < 0:
            return int(self.applies[0][2]) if self.applies else 0
        _, t1, before, after = self.applies[i]
        return int(max(before, after)) if t <= t1 else int(after)

    def rises(self) -> list[float]:
        """The instants at which the upper bound can rise (where a sum can peak)."""
        return [self.start, *(a[0] for a in self.applies)]


def log_of(served: dict[str, Any], died: float | None = None) -> MappedLog:
    """An engine's :class:`MappedLog`: its steps' maps and its maps ahead (the worker's
    mapping thread). A step's interval may start while a map ahead still runs (it waits for
    it); its ``before`` is read once that map ended, so the bound holds over both."""
    end = died if died is not None else float(served.get("ended") or served["steps"][-1]["t"])
    known = float(served.get("ended") or served.get("flushed_at") or 0.0)
    changes = served["applies"] + served.get("aheads", [])
    return MappedLog(changes, float(served["started"]), end, known or end)


def peak_sum(logs: dict[str, MappedLog]) -> tuple[int, float, int]:
    """The most the engines' mapped bytes summed to (by their logs), when, and at how many
    instants it was checked (every rise of any engine where every log is known)."""
    best, when, checked = 0, 0.0, 0
    for log in logs.values():
        for t in log.rises():
            if not all(other.known(t) for other in logs.values()):
                continue
            checked += 1
            total = sum(other.upper(t) for other in logs.values())
            if total > best:
                best, when = total, t
    return best, when, checked


def stats_sums(
    stats: dict[str, list[dict[str, Any]]], logs: dict[str, MappedLog]
) -> tuple[int, int, int]:
    """Every stats snapshot's mapped bytes plus, at its time, the other engines' (from their
    logs): the largest sum, the snapshots summed and those skipped (another engine's log did
    not cover that instant: a killed engine between its last flush and its death)."""
    best, summed, skipped = 0, 0, 0
    for name, snaps in stats.items():
        for snap in snaps:
            t = float(snap["time"])
            others = [log for other, log in logs.items() if other != name]
            if not all(log.known(t) for log in others):
                skipped += 1
                continue
            summed += 1
            best = max(best, int(snap["mapped_bytes"]) + sum(log.upper(t) for log in others))
    return best, summed, skipped
