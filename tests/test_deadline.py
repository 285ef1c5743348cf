"""Nothing hangs the suite (``tests/_deadline.py``, ``harness._run_in_session``): a test past
its deadline fails with its process's stacks, one that does not stop ends its process, a
session without reports ends, and an engine driver that runs past its bound prints the
stacks of its whole process tree before it is killed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.engine import _leftovers, harness
from tests import _deadline

ROOT = Path(__file__).resolve().parents[1]


def _waits_forever() -> None:
    time.sleep(30)


def test_a_call_past_its_deadline_fails_with_where_it_was() -> None:
    deadline = _deadline.TestDeadline(seconds=0.3, kill_after=30)
    started = time.monotonic()
    deadline.arm("tests/x.py::test_hangs")
    try:
        with pytest.raises(pytest.fail.Exception) as failed:
            try:
                _waits_forever()
            except Exception:  # code that swallows errors does not swallow the deadline
                pytest.fail("swallowed")
    finally:
        deadline.disarm()
    assert time.monotonic() - started < 5
    text = str(failed.value)
    assert "tests/x.py::test_hangs ran past its deadline of 0 s" in text
    assert "_waits_forever" in text and "--- thread MainThread" in text


def test_a_call_within_its_deadline_is_left_alone() -> None:
    deadline = _deadline.TestDeadline(seconds=0.3, kill_after=0.3)
    deadline.arm("tests/x.py::test_quick")
    deadline.disarm()
    time.sleep(0.8)  # neither the failure nor the kill comes


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_call_that_does_not_stop_ends_its_process() -> None:
    done = _python("""
        import signal, time
        from tests import _deadline
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})  # the failure cannot land
        _deadline.TestDeadline(seconds=0.2, kill_after=0.3).arm("tests/x.py::test_stuck")
        time.sleep(30)
    """)
    assert done.returncode == 3, done.stderr
    assert "tests/x.py::test_stuck ran past its deadline" in done.stderr
    assert "it did not stop: exiting now" in done.stderr


def test_a_session_without_reports_ends_saying_what_was_held() -> None:
    done = _python("""
        import sys, time
        from tests import _deadline
        heard = _deadline.Silence(
            0.4, write=lambda text: print(text, flush=True),
            state=lambda: "  worker gw0 holds 1: tests/x.py::test_waits",
            on_fire=lambda: print("reaped", flush=True),
        ).start()
        for _ in range(4):
            time.sleep(0.2)
            heard.heard()  # reports keep it quiet
        print("still running", flush=True)
        time.sleep(30)
    """)
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "still running"
    assert lines[1].startswith("no test reported for ") and "stopping it" in lines[1]
    assert lines[2:] == ["  worker gw0 holds 1: tests/x.py::test_waits", "reaped"]


def test_a_driver_past_its_bound_prints_its_trees_stacks_then_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "hangs.py"
    script.write_text(
        textwrap.dedent("""
        import subprocess, sys, time
        def wait_for_child():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            print("child", child.pid, flush=True)
            time.sleep(60)
        wait_for_child()
    """)
    )
    started = time.monotonic()
    code, log = harness._run_in_session([sys.executable, str(script)], dict(os.environ),
                                        tmp_path, timeout=2)  # fmt: skip
    assert time.monotonic() - started < 2 + harness.DUMP_GRACE_S + 10
    assert code == -1 and "timed out after 2 s" in log
    assert "most recent call first" in log and "wait_for_child" in log  # the driver's stack
    assert log.count("most recent call first") >= 2  # and its child's
    child = int(log.split("child ", 1)[1].split()[0])
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()
    assert "printed the stacks of process groups" in log
    assert not list(tmp_path.glob("core*"))


def test_a_stuck_xdist_session_ends_through_the_suites_own_controller(tmp_path: Path) -> None:
    """The suite's conftest (its scheduler and watch) over two workers, one test that waits.
    It inherits this session's run id and must make its own (``_leftovers.start_run``): its
    watch kills none of this session's engines when it fires."""
    (tmp_path / "test_waits.py").write_text(
        "import os, time\n\ndef test_waits():\n"
        # a file in the run's temporary directory, as an engine's socket would be
        f"    open(os.path.join(os.environ['{_leftovers.SCRATCH_VAR}'], 'sock'), 'w').close()\n"
        "    time.sleep(600)\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "2", "-q",
         "-o", "addopts=", "-p", "no:cacheprovider", str(tmp_path / "test_waits.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "KVPLAN_TESTS_SILENCE_S": "4"},
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    # long before the test's own 600 s: the watch ended it (starting two xdist workers takes
    # seconds on an idle machine, over 20 s under CI's load)
    assert time.monotonic() - started < 240
    assert "no test reported for " in done.stdout and "the session is stuck" in done.stdout
    assert "holds 1: " in done.stdout and "test_waits.py::test_waits" in done.stdout
    assert "timed unit keeper none" in done.stdout
    assert "killed 0 engine processes of this run" in done.stdout
    kept = done.stdout.split(_leftovers.KEPT_SAID, 1)[1]
    shutil.rmtree(kept.split()[0])  # kept, as a failed run's files are, and said
