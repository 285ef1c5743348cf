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

The run also gives its engines a temporary directory of their own (:data:`SCRATCH_VAR`, made
by :func:`start_run`): vLLM puts its ZeroMQ sockets (``VLLM_RPC_BASE_PATH``), its file-store
rendezvous (``vllm_dist_*``) and Ray its sessions under the system's temporary directory, and a
process killed or stopped by a signal leaves them there -- about 400 entries in ``/tmp`` a
run of the suite before. :func:`mark` points ``TMPDIR`` and ``VLLM_RPC_BASE_PATH`` of every
engine process there (torch's compile cache stays where it was, so it still persists) -- and
``VLLM_RPC_BASE_PATH`` of the session's own processes, whose vLLM makes sockets too -- and the
session removes the directory once it has passed (kept, and said, when it failed).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

RUN_VAR = "ENGINE_TEST_RUN"
MARK_VAR = "ENGINE_TEST_MARK"
SCRATCH_VAR = "ENGINE_TEST_SCRATCH"
KEPT_SAID = "the engines' temporary files of this failed run: "
"""What a run that keeps its temporary directory says, before the directory's path."""
GRACE_S = 15.0
"""Seconds an engine process may outlive the last test (vLLM's own shutdown of a worker
that is still stopping takes up to 10 s) before it counts as left behind."""


def start_run() -> str:
    """In the session's main process: a fresh id for this run, and the temporary directory
    its engines use (module doc). Always fresh: a pytest that a test starts inherits the outer
    run's variable, and keeping it would let that inner session's end (or its watch) kill the
    outer run's live engines."""
    os.environ[RUN_VAR] = uuid.uuid4().hex
    os.environ[SCRATCH_VAR] = tempfile.mkdtemp(prefix="kvplan-run-")
    # the session's own processes too: a CLI test's vLLM 0.33 engine client makes sockets
    os.environ["VLLM_RPC_BASE_PATH"] = os.environ[SCRATCH_VAR]
    return os.environ[RUN_VAR]


def mark() -> dict[str, str]:
    """The variables engine processes are started with (none outside a test session): this
    run's mark, and its temporary directory for what vLLM and Ray leave behind."""
    run = os.environ.get(RUN_VAR, "")
    if not run:
        return {}
    marked = {MARK_VAR: run}
    scratch = os.environ.get(SCRATCH_VAR, "")
    if scratch:
        marked.update(
            TMPDIR=scratch,
            VLLM_RPC_BASE_PATH=scratch,
            TORCHINDUCTOR_CACHE_DIR=os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            or _inductor_cache_dir(),
        )
    return marked


def _inductor_cache_dir() -> str:
    """Where torch keeps its compile cache by default (``torchinductor_<user>`` under the
    temporary directory, as ``torch._inductor.runtime.cache_dir_utils`` names it)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(
        tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    )


def end_run(passed: bool) -> str | None:
    """In the session's main process, once no engine is left: remove the run's temporary
    directory if the run passed or the directory is empty; else keep it and return where it
    is (vLLM's and Ray's files of a failed run)."""
    scratch = os.environ.get(SCRATCH_VAR, "")
    if not scratch or not os.path.isdir(scratch):
        return None
    if passed or not os.listdir(scratch):
        shutil.rmtree(scratch, ignore_errors=True)
        return None
    return scratch


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


def as_a_run(main: Callable[[], int]) -> int:
    """A benchmark's ``main`` as a run of its own: its engines marked and given the run's
    temporary directory; at its end, engine processes still alive are killed (said on
    stderr) and the directory removed -- kept, and said, if ``main`` failed or left an engine
    running (the benchmark's fault: its files tell what) and something is in it. ``main``'s
    :class:`SystemExit` counts by its code (argparse's ``--help`` is 0)."""
    start_run()
    code = 1
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        raise
    finally:
        left = reap(os.environ[RUN_VAR])
        for pid, line in sorted(left.items()):
            print(f"engine process outlived the run (killed): {pid}: {line}", file=sys.stderr)
        kept = end_run(passed=code == 0 and not left)
        if kept:
            print(f"{KEPT_SAID}{kept}", file=sys.stderr)
    return code
