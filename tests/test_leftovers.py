"""The suite's look for engine processes that outlived it (``harness/engine/_leftovers``):
marked processes of this run are found and killed, others are left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from harness.engine import _leftovers

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _start(env: dict[str, str]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(SLEEPER, env={**os.environ, **env})
    time.sleep(0.3)  # its environment is readable once it runs
    return process


def test_a_marked_process_left_behind_is_found_then_killed() -> None:
    run = "run-under-test"
    marked = _start({_leftovers.MARK_VAR: run})
    other_run = _start({_leftovers.MARK_VAR: "another-run"})
    unmarked = _start({})
    try:
        found = _leftovers.leftovers(run)
        assert list(found) == [marked.pid]
        assert "time.sleep(60)" in found[marked.pid]
        assert _leftovers.reap(run, grace=0.5) == found
        assert marked.wait(10) == -9
        assert _leftovers.leftovers(run) == {}
        assert other_run.poll() is None and unmarked.poll() is None
    finally:
        for process in (marked, other_run, unmarked):
            process.kill()
            process.wait()


def test_reaping_waits_for_processes_that_end_within_the_grace() -> None:
    run = "ending-run"
    ending = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(1)"],
        env={**os.environ, _leftovers.MARK_VAR: run},
    )
    time.sleep(0.3)
    assert _leftovers.reap(run, grace=10) == {}
    assert ending.wait(5) == 0


def test_engine_processes_carry_this_runs_mark() -> None:
    from harness.engine.harness import ENGINE_ENV

    run = os.environ[_leftovers.RUN_VAR]
    assert run and ENGINE_ENV[_leftovers.MARK_VAR] == run
    assert _leftovers.MARK_VAR not in os.environ  # the pytest processes are not marked
    assert _leftovers.leftovers("") == {}


def test_a_session_started_inside_a_run_marks_a_run_of_its_own() -> None:
    """A pytest a test starts inherits the outer run's id; its end (or its watch) reaps only
    its own run, never the outer run's live engines."""
    outer = os.environ[_leftovers.RUN_VAR]
    code = "from harness.engine import _leftovers; print(_leftovers.start_run())"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, check=True, cwd=Path(__file__).parents[1],
        env={**os.environ, _leftovers.RUN_VAR: outer},
    )  # fmt: skip
    inner = done.stdout.strip()
    assert inner and inner != outer
