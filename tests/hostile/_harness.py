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
nothing on stdout, every message at most a few lines.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
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


def invoke(args: list[str], env: dict[str, str] | None = None) -> Outcome:
    """The CLI in-process."""
    result = runner.invoke(app, args, env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"kvplan {args} raised {result.exception!r}") from result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)


def spawn(
    args: list[str],
    *,
    stdin: int | None = None,
    stdout_path: str | None = None,
    cwd: Path | None = None,
) -> Outcome:
    """``python -m kvplan ARGS`` in a child; wall time and the child's own peak RSS."""
    env = dict(os.environ, PYTHONPATH=str(SRC), NO_COLOR="1", COLUMNS="200")
    with (
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as out,
        tempfile.NamedTemporaryFile("r") as peak,
    ):
        sink = open(stdout_path, "wb") if stdout_path else out  # noqa: SIM115
        try:
            start = time.monotonic()
            child = subprocess.Popen(
                [sys.executable, "-c", _CHILD, peak.name, *args],
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=sink,
                stderr=err,
                env=env,
                cwd=cwd,
            )
            deadline = start + HANG_SECONDS
            while True:
                pid, status, _ = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    child.kill()
                    child.wait()
                    raise AssertionError(f"kvplan {args} hung for {HANG_SECONDS} s")
                time.sleep(0.01)
            child.returncode = os.waitstatus_to_exitcode(status)
            seconds = time.monotonic() - start
        finally:
            if stdout_path:
                sink.close()
        err.seek(0)
        out.seek(0)
        return Outcome(
            child.returncode,
            out.read().decode("utf-8", "replace"),
            err.read().decode("utf-8", "replace"),
            seconds,
            int(peak.read() or 0) * 1024,  # VmHWM is in kB
        )


def assert_refused(outcome: Outcome, code: str | None = None, *, what: str = "") -> None:
    """Exit 2, one coded paragraph first on stderr (``code`` when given), no traceback."""
    label = f"{what}: " if what else ""
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
