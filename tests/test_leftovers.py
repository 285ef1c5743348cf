"""The suite's look for engine processes that outlived it (``harness/engine/_leftovers``):
marked processes of this run are found and killed, others are left alone; what vLLM leaves in
the temporary directory goes with the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

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
    from harness.engine.harness import engine_env

    run = os.environ[_leftovers.RUN_VAR]
    assert run and engine_env()[_leftovers.MARK_VAR] == run
    assert _leftovers.MARK_VAR not in os.environ  # the pytest processes are not marked
    # ... but their vLLM (the CLI's engine clients) makes its sockets in the run's directory
    assert os.environ["VLLM_RPC_BASE_PATH"] == os.environ[_leftovers.SCRATCH_VAR]
    assert _leftovers.leftovers("") == {}


def test_a_session_started_inside_a_run_marks_a_run_of_its_own() -> None:
    """A pytest a test starts inherits the outer run's id; its end (or its watch) reaps only
    its own run, never the outer run's live engines."""
    outer = os.environ[_leftovers.RUN_VAR]
    code = (
        "import os; from harness.engine import _leftovers; print(_leftovers.start_run()); "
        "os.rmdir(os.environ[_leftovers.SCRATCH_VAR])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, check=True, cwd=Path(__file__).parents[1],
        env={**os.environ, _leftovers.RUN_VAR: outer},
    )  # fmt: skip
    inner = done.stdout.strip()
    assert inner and inner != outer


_LEAVES = """
import os, subprocess, sys
from harness.engine.harness import engine_env

SHOW = (
    "import os, tempfile\\n"
    "from vllm.utils.network_utils import get_file_store_init_method, get_open_zmq_ipc_path\\n"
    "ipc, dist = get_open_zmq_ipc_path(), get_file_store_init_method()\\n"
    "open(ipc.removeprefix('ipc://'), 'w').close()  # what a killed engine leaves\\n"
    "open(dist.removeprefix('file://'), 'w').close()\\n"
    "print(tempfile.gettempdir(), ipc, dist, os.environ['TORCHINDUCTOR_CACHE_DIR'])\\n"
)

def test_an_engine_leaves_files():
    said = subprocess.run([sys.executable, "-c", SHOW], env=engine_env(), capture_output=True,
                          text=True, timeout=300, check=True).stdout.split()
    print("SAID", *said)
    assert os.environ.get("FAIL_IT") != "1"
"""


def _session(tmp_path: Path, fail: bool) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """A session of the suite's conftest (no xdist) whose one test starts a process with an
    engine's environment that makes vLLM's socket and rendezvous paths and files there."""
    (tmp_path / "test_leaves.py").write_text(textwrap.dedent(_LEAVES))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-s", "-o", "addopts=",
         "-p", "no:cacheprovider", str(tmp_path / "test_leaves.py")],
        cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "FAIL_IT": "1" if fail else "0"},
    )  # fmt: skip
    said = next(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("SAID"))
    return done, said


def test_the_engines_temporary_files_go_with_a_run_that_passed(tmp_path: Path) -> None:
    """vLLM's ZeroMQ socket and file-store rendezvous paths (what a killed engine leaves in
    ``/tmp``), and the temporary directory itself, are the run's own directory; torch's
    compile cache is not (it persists); the session removes the directory once it passed."""
    done, (temp, ipc, dist, inductor) = _session(tmp_path, fail=False)
    assert done.returncode == 0, done.stdout + done.stderr
    scratch = Path(temp)
    assert scratch.name.startswith("kvplan-run-") and scratch.parent == Path(tempfile.gettempdir())
    assert ipc.startswith(f"ipc://{scratch}/") and dist.startswith(f"file://{scratch}/vllm_dist_")
    assert not Path(inductor).is_relative_to(scratch)
    assert not scratch.exists()  # the socket and rendezvous files went with it


def test_a_failed_run_keeps_the_engines_temporary_files_and_says_where(tmp_path: Path) -> None:
    done, (temp, ipc, _, _) = _session(tmp_path, fail=True)
    try:
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"{_leftovers.KEPT_SAID}{temp}" in done.stdout
        assert Path(ipc.removeprefix("ipc://")).exists()
    finally:
        shutil.rmtree(temp, ignore_errors=True)


_BENCHMARK = """
import os, subprocess, sys, time
from harness.engine import _leftovers
from harness.engine.harness import engine_env

ENGINE = "import tempfile, time; tempfile.mkstemp(prefix='sock-'); time.sleep(120)"

def main():
    how = os.environ["HOW"]
    scratch = os.environ[_leftovers.SCRATCH_VAR]
    if how == "an-engine-left":  # it leaves a file in its TMPDIR, as vLLM's sockets
        subprocess.Popen([sys.executable, "-c", ENGINE], env=engine_env())
        time.sleep(1.0)
    if how == "failed":
        open(os.path.join(scratch, "vllm_dist_x"), "w").close()
    print(scratch, flush=True)
    if how in ("help", "usage"):  # argparse's --help and a usage error
        sys.exit(0 if how == "help" else 2)
    return 1 if how in ("failed", "failed-empty") else 0

sys.exit(_leftovers.as_a_run(main))
"""


@pytest.mark.parametrize(
    ("how", "code", "kept"),
    [
        ("clean", 0, False),
        ("help", 0, False),
        ("usage", 2, False),  # a failed run with nothing in its directory: nothing to keep
        ("failed-empty", 1, False),
        ("failed", 1, True),
        ("an-engine-left", 0, True),
    ],
)
def test_a_benchmark_run_kills_its_engines_and_removes_their_temporary_files(
    how: str, code: int, kept: bool
) -> None:
    """``as_a_run`` (the benchmarks' main): the run's temporary directory goes with a run
    that returned 0 or exited 0 (``--help``), and with a failed run that left nothing in it;
    a failed run's files are kept and named; an engine process left running is killed and
    said, and the directory kept and named (what the benchmark got wrong)."""
    done = subprocess.run(
        [sys.executable, "-c", _BENCHMARK], cwd=Path(__file__).parents[1], capture_output=True,
        text=True, timeout=120, check=False, env={**os.environ, "HOW": how},
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    scratch = Path(done.stdout.strip())
    assert scratch.name.startswith("kvplan-run-")
    if not kept:
        assert not scratch.exists() and done.stderr == ""
        return
    shutil.rmtree(scratch)
    assert f"{_leftovers.KEPT_SAID}{scratch}" in done.stderr
    if how == "an-engine-left":
        assert "engine process outlived the run (killed): " in done.stderr
        assert "time.sleep(120)" in done.stderr
