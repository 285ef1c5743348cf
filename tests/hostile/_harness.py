"""The hostile-input harness: run the CLI on a case and check that it was refused properly.

Two ways to run a case:

- :func:`invoke` runs the CLI in-process (typer's ``CliRunner``): fast, used for the bulk of the
  generated cases;
- :func:`spawn` runs the CLI (as ``python -m kvplan`` does) in a child process and measures its
  wall time and peak RSS, for the exit-status / no-traceback / resource checks. The peak is the
  child's own ``VmHWM``, written at exit: ``getrusage``/``wait4`` report at least the parent's
  RSS at fork time (Linux copies the pre-exec high-water mark), which for a long pytest run is
  already over the bound.

:func:`assert_refused` is the contract every hostile case must meet: exit 2, the first stderr
line starts with a ``KVPnnn`` code (never ``KVP019``, the code of a kvplan bug), no traceback,
nothing on stdout, every message at most a few lines. :func:`assert_no_bug` is the part every
case meets, refused or not: ``KVP019`` (an unexpected exception dressed as a diagnostic) or a
traceback anywhere in the output fails the case.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from kvplan.cli import app

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
CODE_LINE = re.compile(r"^KVP\d{3} (error|warning)")
MAX_RSS_BYTES = 500 << 20
"""Peak RSS a child may reach on any hostile input (the issue's bound)."""
HANG_SECONDS = 60.0
"""A child that runs this long is hung (the issue's target is 2 s; timing lives in benchmarks)."""
MAX_LINE_CHARS = 1200
"""No diagnostic paragraph is longer than a few terminal lines."""

runner = CliRunner()

_CHILD = """
import atexit, runpy, sys
report = sys.argv[1]
def _peak():
    with open("/proc/self/status") as status, open(report, "w") as out:
        out.write(next((l.split()[1] for l in status if l.startswith("VmHWM:")), "0"))
atexit.register(_peak)
sys.argv = ["kvplan", *sys.argv[2:]]
runpy.run_module("kvplan", run_name="__main__", alter_sys=True)
"""


@dataclass
class Outcome:
    """What one run of the CLI did."""

    exit_code: int
    stdout: str
    stderr: str
    seconds: float = 0.0
    peak_rss_bytes: int = 0


IN_PROCESS_SECONDS = 20.0
"""An in-process command that runs this long is hung (a blocking open or read)."""


class Hung(BaseException):
    """Raised by :func:`deadline` in the main thread: a command blocked (not an ``Exception``,
    so the CLI's error boundary cannot turn it into a diagnostic)."""


@contextlib.contextmanager
def deadline(seconds: float = IN_PROCESS_SECONDS) -> Iterator[None]:
    """Interrupt whatever blocks the main thread (``open`` of a fifo, a read) after ``seconds``:
    the alarm's handler raises :class:`Hung`, and a system call interrupted by a handler that
    raises is not retried."""

    def expire(signum: int, frame: object) -> None:
        raise Hung(f"blocked for {seconds} s")

    previous: Callable[..., object] | int | None = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def invoke(
    args: list[str], env: dict[str, str] | None = None, *, seconds: float = IN_PROCESS_SECONDS
) -> Outcome:
    """The CLI in-process, interrupted (and failed) if it blocks for ``seconds``."""
    try:
        with deadline(seconds):
            result = runner.invoke(app, args, env=env)
    except Hung as exc:
        raise AssertionError(f"kvplan {args} hung: {exc}") from None
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"kvplan {args} raised {result.exception!r}") from result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)


def spawn(
    args: list[str],
    *,
    stdin: int | None = None,
    stdout_path: str | None = None,
    stderr_path: str | None = None,
    close: tuple[int, ...] = (),
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    seconds: float = HANG_SECONDS,
) -> Outcome:
    """``python -m kvplan ARGS`` in a child; wall time and the child's own peak RSS.

    ``stdout_path``/``stderr_path`` send a stream to a file (``/dev/full``); ``close`` names
    descriptors (1, 2) the child starts with closed (``1>&-``); ``env`` adds variables.
    """
    child_env = dict(os.environ, PYTHONPATH=str(SRC), NO_COLOR="1", COLUMNS="200", **(env or {}))
    with (
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as out,
        tempfile.NamedTemporaryFile("r") as peak,
    ):
        sink = open(stdout_path, "wb") if stdout_path else out  # noqa: SIM115
        err_sink = open(stderr_path, "wb") if stderr_path else err  # noqa: SIM115

        def closing() -> None:
            for fd in close:
                os.close(fd)

        try:
            start = time.monotonic()
            child = subprocess.Popen(
                [sys.executable, "-c", _CHILD, peak.name, *args],
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=sink,
                stderr=err_sink,
                env=child_env,
                cwd=cwd,
                preexec_fn=closing if close else None,
            )
            deadline = start + seconds
            while True:
                pid, status, _ = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    child.kill()
                    child.wait()
                    raise AssertionError(f"kvplan {args} hung for {seconds} s")
                time.sleep(0.01)
            child.returncode = os.waitstatus_to_exitcode(status)
            seconds = time.monotonic() - start
        finally:
            if stdout_path:
                sink.close()
            if stderr_path:
                err_sink.close()
        err.seek(0)
        out.seek(0)
        return Outcome(
            child.returncode,
            out.read().decode("utf-8", "replace"),
            err.read().decode("utf-8", "replace"),
            seconds,
            int(peak.read() or 0) * 1024,  # VmHWM is in kB
        )


def assert_no_bug(outcome: Outcome, what: str = "") -> None:
    """No ``KVP019`` (a kvplan bug reported as a diagnostic) and no traceback, on any stream."""
    label = f"{what}: " if what else ""
    for name, text in (("stdout", outcome.stdout), ("stderr", outcome.stderr)):
        at = text.find("KVP019")
        assert at < 0, f"{label}a kvplan bug on {name}: {text[at : at + 500]}"
        assert "Traceback" not in text, f"{label}a traceback on {name}: {text[-1500:]}"


def assert_refused(outcome: Outcome, code: str | None = None, *, what: str = "") -> None:
    """Exit 2, one coded paragraph first on stderr (``code`` when given), no traceback."""
    label = f"{what}: " if what else ""
    assert_no_bug(outcome, what)
    assert outcome.exit_code == 2, f"{label}exit {outcome.exit_code}; stderr: {outcome.stderr}"
    assert "Traceback" not in outcome.stderr, f"{label}{outcome.stderr}"
    lines = outcome.stderr.strip().splitlines()
    assert lines, f"{label}nothing on stderr"
    assert CODE_LINE.match(lines[0]), f"{label}first line is not coded: {lines[0][:300]}"
    assert not lines[0].startswith("KVP019"), f"{label}a kvplan bug: {lines[0][:500]}"
    if code is not None:
        assert lines[0].startswith(code), f"{label}expected {code}: {lines[0][:300]}"
    longest = max(len(line) for line in lines)
    assert longest <= MAX_LINE_CHARS, f"{label}a {longest}-character message"
    assert outcome.stdout == "", f"{label}stdout: {outcome.stdout[:200]}"
    assert "\x1b" not in outcome.stderr, f"{label}a raw escape reached stderr"


def assert_bounded(outcome: Outcome, what: str = "") -> None:
    """The child stayed under the issue's memory bound (and did not hang: see :func:`spawn`)."""
    assert 0 < outcome.peak_rss_bytes < MAX_RSS_BYTES, (
        f"{what}: peak RSS {outcome.peak_rss_bytes >> 20} MiB"
    )


def digest(path: Path) -> str | None:
    """The content hash of a file (None when absent): inputs and previous outputs stay intact."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
