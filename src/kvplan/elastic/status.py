"""Is the engine behind a stats snapshot alive? What ``kvplan top`` shows in its state column.

A running engine's stats reporter rewrites its snapshot at least every
:data:`~kvplan.elastic.files.HEARTBEAT_SECONDS` and writes ``state: "closed"`` on every orderly
exit, so:

* ``closed``: the engine exited in order (the last snapshot says so);
* ``dead``: the snapshot is not closed and its writer is gone — it ran on this machine (same
  host name and pid namespace) and no live process has its ``pid``, the process with that pid is
  a zombie, or it started after the snapshot was written (the pid was reused);
* ``stale``: the snapshot is not closed and more than
  :data:`~kvplan.elastic.files.STALE_HEARTBEATS` heartbeats old, and the writer cannot be
  checked (another machine) or still exists (hung, or stopped with SIGSTOP);
* otherwise the snapshot's own ``state`` (``bound``, ``running``).

Reads ``/proc`` only; no torch, no vLLM.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvplan.elastic.files import ElasticStats, is_stale

Status = Literal["bound", "running", "closed", "stale", "dead"]

PID_START_SLACK = 2.0
"""Seconds a process may appear to have started after a snapshot it wrote (``/proc/stat``'s
boot time is whole seconds, process start times are clock ticks)."""

PROC = Path("/proc")


@dataclass(frozen=True)
class EngineStatus:
    status: Status
    age_seconds: float
    alive: bool | None
    """Whether the writing process exists: ``None`` when it cannot be checked here."""
    reason: str


def pid_namespace() -> str | None:
    """This process's pid namespace (``pid:[4026531836]``), ``None`` where ``/proc`` lacks it."""
    try:
        return os.readlink(PROC / "self" / "ns" / "pid")
    except OSError:
        return None


def writer_identity() -> dict[str, str | None]:
    """What a stats writer records about itself: ``host`` and ``pid_namespace`` fields."""
    return {"host": socket.gethostname(), "pid_namespace": pid_namespace()}


def _boot_time() -> float | None:
    try:
        for line in (PROC / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _proc_state(pid: int) -> tuple[str, float | None] | None:
    """(state letter, start time in unix seconds) of ``pid`` from ``/proc``; None: no entry."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return ("?", None)
    fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) "
    try:
        state, ticks = fields[0], int(fields[19])  # fields 3 and 22 of proc(5)
        boot = _boot_time()
        start = None if boot is None else boot + ticks / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return ("?", None)
    return (state, start)


def process_alive(pid: int, written_at: float) -> bool | None:
    """Whether a process that could have written a snapshot at ``written_at`` has ``pid``.

    False when there is no such process, it is a zombie, or it started after ``written_at``
    (the pid was reused); None when that cannot be told (no ``/proc``, a pid <= 0).
    """
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    except (OSError, OverflowError, ValueError):
        return False if pid > 1 << 31 else None
    found = _proc_state(pid)
    if found is None:
        return None if not PROC.joinpath("self").exists() else False
    state, start = found
    if state == "Z":
        return False
    return start is None or start <= written_at + PID_START_SLACK


def same_machine(stats: ElasticStats) -> bool:
    """Whether ``stats`` was written on this machine, in this pid namespace (so its pid means
    the same process here)."""
    if stats.host is None or stats.host != socket.gethostname():
        return False
    if stats.pid_namespace is not None:
        return stats.pid_namespace == pid_namespace()
    return True


def engine_status(
    stats: ElasticStats,
    now: float,
    alive: Callable[[int, float], bool | None] = process_alive,
) -> EngineStatus:
    """What ``kvplan top`` says about the engine behind ``stats`` at unix time ``now``."""
    age = max(0.0, now - stats.time)
    if stats.state == "closed":
        return EngineStatus("closed", age, None, "the engine closed its cache")
    found = alive(stats.pid, stats.time) if same_machine(stats) else None
    if found is False:
        return EngineStatus(
            "dead", age, False, f"pid {stats.pid} is gone (no such process, a zombie or reused)"
        )
    if is_stale(stats, now):
        why = "its writer stopped (hung or suspended)" if found else "no snapshot for a while"
        return EngineStatus("stale", age, found, why)
    return EngineStatus(stats.state, age, found, "snapshots are fresh")
