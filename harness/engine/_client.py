"""Drive a vLLM OpenAI server with the real ``openai`` client (run by the engine venv).

``python _client.py JOB.json RESULT.json``. The job names the server (``base_url``,
``model``), the requests (token-id prompts, ``max_tokens``; greedy, ``ignore_eos``, the token
ids and the chosen tokens' logprobs returned) and how many are sent at once
(``concurrency``: all of them by default). With ``limit`` set, the physical budget of the
elastic engine is changed while the requests are in flight, through kvplan's own CLI
(``python -m kvplan limit DIR SIZE``, this interpreter's kvplan): the command's process is
started with the load, its imports done, and told to run once the engine's stats file shows
blocks in use (the load has reached the engine) -- on a loaded 2-core machine importing the
CLI took longer (5.6 s) than the whole load; then the stats file
is watched until the engine reports the new limit, and that first snapshot is kept (its
``live_blocks`` say whether requests held blocks in the step that applied it). With
``limit.plant`` (a command, run as another user: it leaves a ``limit.json`` of that user in
the dump directory), the command runs first, once blocks are in use; after ``plant.wait``
seconds and a step of the engine's that came a second after the plant (the engine looks at
``limit.json`` at most every half second), the engine's snapshot and the planted file's
owner are kept, and the file is removed (as an operator would) before ``kvplan limit`` runs.

The result holds, per request in job order: ``token_ids``, ``prompt_token_ids``,
``finish_reason``, the sampled tokens' ids and logprobs as the logprobs report them, the
usage, ``error`` (a request that failed) and its start/end times; and what the limit change
did. Every request is sent once (no retries): a failure is a result, not a retry.

This file imports only the standard library and ``openai``: it runs outside the test suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

POLL_SECONDS = 0.02
GRACE_SECONDS = 10.0


def _send(client: Any, job: dict[str, Any], index: int, t0: float) -> dict[str, Any]:
    spec = job["requests"][index]
    result: dict[str, Any] = {"index": index, "start_s": time.perf_counter() - t0}
    try:
        answer = client.completions.create(
            model=job["model"],
            prompt=list(spec["prompt"]),
            max_tokens=int(spec["max_tokens"]),
            temperature=0.0,
            logprobs=int(job.get("logprobs", 1)),
            extra_body={
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
                "ignore_eos": True,
            },
        )
        choice = answer.choices[0]
        extra = choice.model_extra or {}
        logprobs = choice.logprobs
        result.update(
            token_ids=extra.get("token_ids"),
            prompt_token_ids=extra.get("prompt_token_ids"),
            finish_reason=choice.finish_reason,
            logprob_tokens=[_token_id(t) for t in (logprobs.tokens or [])] if logprobs else None,
            token_logprobs=list(logprobs.token_logprobs or []) if logprobs else None,
            top_logprobs=[
                {str(_token_id(k)): v for k, v in (top or {}).items()}
                for top in (logprobs.top_logprobs or [])
            ]
            if logprobs
            else None,
            usage=answer.usage.model_dump() if answer.usage else None,
        )
    except Exception as exc:  # a failed request is a result
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    result["end_s"] = time.perf_counter() - t0
    return result


def _token_id(text: str) -> int:
    """``token_id:123`` (``return_tokens_as_token_ids``) -> 123."""
    return int(str(text).rsplit(":", 1)[-1])


def _read(path: Path) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads(path.read_text())
        return found
    except (OSError, ValueError):
        return None


_ARMED = (
    "import runpy, sys\n"
    "import kvplan.cli.app  # imported ahead: the command runs as soon as it is told to\n"
    "sys.stdin.readline()\n"
    "sys.argv = ['kvplan', *sys.argv[1:]]\n"
    "runpy.run_module('kvplan', run_name='__main__', alter_sys=True)\n"
)
"""``python -m kvplan ARGS``, its imports done before it reads a line from stdin."""


def _change_limit(
    spec: dict[str, Any], done: list[bool], t0: float, results: dict[str, Any]
) -> None:
    """Wait for blocks in use, run ``kvplan limit``, wait for the engine to report it."""
    args = ["limit", spec["dir"], spec["size"]]
    if spec.get("cache") is not None:
        args += ["--cache", spec["cache"]]
    armed = subprocess.Popen(
        [sys.executable, "-c", _ARMED, *args], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        _limit_once_loaded(spec, done, t0, results, armed, args)
    finally:
        if armed.poll() is None:
            armed.kill()
            armed.wait()


def _limit_once_loaded(
    spec: dict[str, Any],
    done: list[bool],
    t0: float,
    results: dict[str, Any],
    armed: subprocess.Popen[str],
    args: list[str],
) -> None:
    stats = Path(spec["stats_file"])
    deadline = time.monotonic() + float(spec.get("timeout", 300))
    while time.monotonic() < deadline:
        snap = _read(stats)
        if snap and snap.get("live_blocks", 0) > 0:
            results["load_seen"] = {"t_s": time.perf_counter() - t0, "snapshot": snap}
            break
        if all(done):
            results["error"] = "every request finished before the engine showed blocks in use"
            return
        time.sleep(POLL_SECONDS)
    else:
        results["error"] = "the engine never showed blocks in use"
        return
    if spec.get("plant"):
        results["plant"] = _plant(spec, stats, t0)
    started = time.perf_counter()
    output, _ = armed.communicate("go\n", timeout=120)
    results["cli"] = {
        "command": ["-m", "kvplan", *args],
        "rc": armed.returncode,
        "output": output[-2000:],
        "seconds": time.perf_counter() - started,
        "t_s": time.perf_counter() - t0,
        "unfinished": done.count(False),
    }
    grace: float | None = None
    while time.monotonic() < deadline:
        snap = _read(stats)
        if snap and snap.get("limit_bytes") == spec["bytes"]:
            results["applied"] = {
                "t_s": time.perf_counter() - t0,
                "snapshot": snap,
                "unfinished": done.count(False),
            }
            return
        if all(done):  # an idle engine applies a limit at its next step: give it a moment
            grace = time.monotonic() + GRACE_SECONDS if grace is None else grace
            if time.monotonic() > grace:
                break
        time.sleep(POLL_SECONDS)
    results["error"] = "the engine never reported the new limit"


def _plant(spec: dict[str, Any], stats: Path, t0: float) -> dict[str, Any]:
    """Run the planting command, wait, keep what the engine then says; remove the file."""
    plant = spec["plant"]
    planted_at = time.time()
    done = subprocess.run(plant["command"], capture_output=True, text=True, timeout=60)
    time.sleep(float(plant.get("wait", 1.5)))
    # the engine looks at limit.json at a step at most every half second: wait for a step
    # after a snapshot written a second after the plant (a first step can take seconds)
    base: int | None = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        snap = _read(stats)
        if snap and base is None and snap.get("time", 0) >= planted_at + 1.0:
            base = int(snap.get("steps", 0))
        elif snap and base is not None and int(snap.get("steps", 0)) > base:
            break
        time.sleep(POLL_SECONDS)
    planted = Path(spec["dir"]) / "limit.json"
    try:
        owner: int | None = planted.stat().st_uid
        planted.unlink()
    except OSError:
        owner = None
    return {
        "rc": done.returncode,
        "output": (done.stdout + done.stderr)[-2000:],
        "owner": owner,
        "snapshot": _read(stats),
        "t_s": time.perf_counter() - t0,
    }


def main(argv: list[str]) -> int:
    from openai import OpenAI

    job = json.loads(Path(argv[1]).read_text())
    client = OpenAI(
        base_url=job["base_url"] + "/v1",
        api_key="unused",
        timeout=float(job.get("timeout", 600)),
        max_retries=0,
    )
    count = len(job["requests"])
    done = [False] * count
    limit: dict[str, Any] | None = None
    watcher = None
    t0 = time.perf_counter()
    if job.get("limit"):
        limit = {}
        watcher = threading.Thread(target=_change_limit, args=(job["limit"], done, t0, limit))
        watcher.start()

    def run(index: int) -> dict[str, Any]:
        try:
            return _send(client, job, index, t0)
        finally:
            done[index] = True

    with ThreadPoolExecutor(max_workers=int(job.get("concurrency") or count)) as pool:
        results = list(pool.map(run, range(count)))
    if watcher is not None:
        watcher.join()
    Path(argv[2]).write_text(
        json.dumps(
            {"requests": results, "limit": limit, "seconds": time.perf_counter() - t0}, indent=1
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
