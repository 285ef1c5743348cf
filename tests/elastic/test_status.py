"""Whether the engine behind a snapshot is alive: heartbeat age, pid, pid reuse, zombies."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from harness._stats import make_stats
from kvplan.elastic import status
from kvplan.elastic.status import engine_status, pid_namespace, process_alive

HERE = {"host": socket.gethostname(), "pid_namespace": pid_namespace()}


def _exited_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_own_process_is_alive() -> None:
    assert process_alive(os.getpid(), time.time()) is True


def test_an_exited_process_is_gone() -> None:
    assert process_alive(_exited_pid(), time.time()) is False


def test_a_zombie_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):  # until it has exited (a zombie until we wait for it)
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert process_alive(child.pid, time.time()) is False
    finally:
        child.wait()


def test_a_reused_pid_is_gone() -> None:
    """Our own process, but the snapshot predates its start: another process had the pid."""
    assert process_alive(os.getpid(), written_at=1_000_000.0) is False


def test_pids_that_cannot_be_checked() -> None:
    assert process_alive(0, time.time()) is None  # kill(0) would be the process group
    assert process_alive(2**40, time.time()) is False


def test_status_from_the_heartbeat() -> None:
    now = time.time()
    fresh = make_stats(time=now - 5.0)  # no host: the pid cannot be checked
    assert engine_status(fresh, now).status == "running"
    old = make_stats(time=now - 7.0)
    got = engine_status(old, now)
    assert (got.status, got.alive) == ("stale", None)
    assert engine_status(make_stats(time=now - 600, state="closed"), now).status == "closed"
    assert engine_status(make_stats(time=now, state="bound"), now).status == "bound"


def test_status_of_an_engine_on_this_machine() -> None:
    now = time.time()
    gone = make_stats(time=now, pid=_exited_pid(), **HERE)
    got = engine_status(gone, now)
    assert (got.status, got.alive) == ("dead", False)  # dead at once, not after 6 s
    live = make_stats(time=now, pid=os.getpid(), **HERE)
    got = engine_status(live, now)
    assert (got.status, got.alive) == ("running", True)
    closed = make_stats(time=now, pid=_exited_pid(), state="closed", **HERE)
    assert engine_status(closed, now).status == "closed"


def test_a_hung_writer_is_stale_and_alive() -> None:
    now = time.time()
    stats = make_stats(time=now - 60, pid=os.getpid(), **HERE)
    got = engine_status(stats, now, alive=lambda pid, at: True)
    assert (got.status, got.alive) == ("stale", True) and "hung" in got.reason


def test_other_machines_and_namespaces_are_not_pid_checked() -> None:
    now = time.time()
    seen: list[int] = []

    def probe(pid: int, at: float) -> bool:
        seen.append(pid)
        return False

    other_host = make_stats(time=now, host="not-" + socket.gethostname(), pid=1)
    other_ns = make_stats(time=now, host=socket.gethostname(), pid_namespace="pid:[1]", pid=1)
    for stats in (other_host, other_ns):
        assert engine_status(stats, now, alive=probe).status == "running"
    assert seen == []
    if status.pid_namespace() is not None:
        same = make_stats(time=now, pid=1, **HERE)
        assert engine_status(same, now, alive=probe).status == "dead" and seen == [1]
