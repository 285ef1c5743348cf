"""The stats file of a live elastic worker: a heartbeat while nothing changes, ``closed`` on
SIGTERM and SIGINT — in a real separate process (the worker side kvplan attaches at bind,
over a real host-vmm elastic cache; no vLLM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvplan.elastic.files import HEARTBEAT_SECONDS

ROOT = Path(__file__).resolve().parents[2]

_WORKER = """
import faulthandler, signal, sys, time
from pathlib import Path
faulthandler.register(signal.SIGUSR1)  # the test asks for the stacks when the process hangs
# SIGINT as an interactive shell leaves it (a KeyboardInterrupt): a suite started in the
# background by a non-interactive shell hands its children SIGINT ignored, and an ignored
# signal must stay ignored (kvplan's handler writes its snapshot and the process goes on)
signal.signal(signal.SIGINT, signal.default_int_handler)
from kvplan.executor import apply
from kvplan.integrations.vllm.elastic import ElasticSettings, attach_worker, worker_side
from harness import _builders as builders
from tests.elastic.test_ledger import PAGE, plan_of

plan = plan_of(builders.llama(num_blocks=64))
cache = apply(plan, backend="host-vmm", mode="elastic", chunk_size=PAGE)
cache.ensure_mapped([0])
owner = type("Runner", (), {})()
side = worker_side(cache, ElasticSettings(), dump_dir=Path(sys.argv[1]), backend="host-vmm",
                   label="rank0")
attach_worker(owner, side)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _stats(directory: Path) -> dict:
    return json.loads((directory / "rank0.stats.json").read_text())


def _start(tmp_path: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}")
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(tmp_path)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
    return proc


def test_an_idle_worker_keeps_writing_its_heartbeat(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        first = _stats(tmp_path)
        assert first["state"] == "bound"
        deadline = time.monotonic() + 4 * HEARTBEAT_SECONDS
        while time.monotonic() < deadline and _stats(tmp_path)["time"] == first["time"]:
            time.sleep(0.1)
        later = _stats(tmp_path)
        assert later["time"] > first["time"]  # nothing changed, the file was rewritten
        assert {k: v for k, v in later.items() if k != "time"} == {
            k: v for k, v in first.items() if k != "time"
        }
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_leaves_a_closed_snapshot(tmp_path: Path, sig: int) -> None:
    proc = _start(tmp_path)
    proc.send_signal(sig)
    try:  # the last snapshot waits for no disk; a write in progress at most 5 s
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # its threads' stacks, to stderr
        time.sleep(1)
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"still running 60 s after signal {sig}; stats {_stats(tmp_path)}; {err}")
    assert proc.returncode != 0  # the signal still ended the process as before
    assert _stats(tmp_path)["state"] == "closed"


def test_kill_9_leaves_the_last_state_for_top_to_call_stale(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    proc.kill()
    proc.wait()
    assert _stats(tmp_path)["state"] == "bound"  # nothing could run: top judges by time
