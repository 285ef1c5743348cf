"""No engine process outlives the suite: every process an engine test starts is marked, and
the suite looks for the marked ones once it is done.

The pytest process that runs the session (the xdist controller) sets :data:`RUN_VAR` to a
fresh id before its workers start; ``harness.ENGINE_ENV`` -- the environment every engine
process of the tests is started with (drivers, OpenAI servers, co-location members) -- carries
it on as :data:`MARK_VAR`, and every process an engine starts inherits it: vLLM's engine core
and workers, a second node's process tree, Ray's daemons. The pytest processes themselves
carry only :data:`RUN_VAR`. When the session ends, :func:`leftovers` lists the processes still
marked with this run's id (read from ``/proc/PID/environ``); the suite waits a grace for them,
then kills them and fails (``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

RUN_VAR = "ENGINE_TEST_RUN"
MARK_VAR = "ENGINE_TEST_MARK"
GRACE_S = 15.0
"""Seconds an engine process may outlive the last test (vLLM's own shutdown of a worker
that is still stopping takes up to 10 s) before it counts as left behind."""


def start_run() -> str:
    """In the session's main process: a fresh id for this run. Always fresh: a pytest that a
    test starts inherits the outer run's variable, and keeping it would let that inner
    session's end (or its watch) kill the outer run's live engines."""
    os.environ[RUN_VAR] = uuid.uuid4().hex
    return os.environ[RUN_VAR]


def mark() -> dict[str, str]:
    """The variable engine processes are started with (none outside a test session)."""
    run = os.environ.get(RUN_VAR, "")
    return {MARK_VAR: run} if run else {}


def leftovers(run: str, proc: Path = Path("/proc")) -> dict[int, str]:
    """Processes marked with ``run`` that are alive (zombies aside): pid -> command line."""
    wanted = f"{MARK_VAR}={run}".encode()
    found: dict[int, str] = {}
    if not run:
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):  # gone meanwhile, or not ours to read
            continue
        if state != "Z":
            found[int(entry.name)] = line.strip()[:200]
    return found


def reap(run: str, grace: float = GRACE_S) -> dict[int, str]:
    """Wait up to ``grace`` for the marked processes to end; kill what is left and return it
    (empty: nothing outlived the run)."""
    deadline = time.monotonic() + grace
    left = leftovers(run)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = leftovers(run)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left
