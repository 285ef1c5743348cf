"""The soak's 3-minute version (#28's CI version) (``harness/engine/_soak``; the 20-minute one is
``benchmarks/soak.py``, its figures in docs/performance.md): a served elastic engine in a group
with a neighbour killed (-9) and restarted, bursts of heavy-tailed requests, a new
``kvplan limit`` every 20 s, and vanilla vLLM given the same bursts at the same time (the
control). Nothing leaks, nothing hangs, nothing stays borrowed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from harness.engine import _soak as soak

SECONDS = 180.0
FLAT = 0.05
"""Largest growth of a process's anonymous RSS or open fds after warm-up (a quarter of the
samples; the first burst has the largest requests the soak sends), as a fraction of its first
value then."""


@pytest.fixture(scope="module")
def summary(
    engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("soak")
    run = soak.run(
        engine_python, llama_checkpoint, work, seconds=SECONDS, limit_every_s=20.0,
        kill_every_s=60.0,
    )  # fmt: skip
    found = run.summary()
    print(found)
    return found


def test_every_request_finishes(summary: dict[str, Any]) -> None:
    assert summary["requests"] >= 40, summary
    assert summary["outcomes"] == {"length": summary["requests"]}, summary


def test_memory_and_descriptors_stay_flat(summary: dict[str, Any]) -> None:
    """Open fds and maps entries do not grow; anonymous RSS grows no more than vanilla vLLM's
    own under the same requests (its worker's grows too: allocator and vLLM state), plus 5 %."""
    assert summary["samples"] >= 8, summary
    assert summary["vanilla_bursts"] == summary["samples"], summary  # every burst, both
    assert summary["vanilla_errors"] == 0, summary
    vanilla = summary["vanilla_drift"]
    for key, grown in summary["max_drift"].items():
        if key.endswith(".fds"):
            assert grown <= FLAT, (key, grown, summary)
        if key.endswith(".rss_anon_kib"):  # the same roles: api, engine core, worker
            assert grown <= vanilla.get(key, 0.0) + FLAT, (key, grown, vanilla, summary)


def test_an_idle_engine_keeps_only_its_floor_and_reserve(summary: dict[str, Any]) -> None:
    assert summary["idle_over_floor_plus_reserve"] == 0, summary
    assert summary["limit_changes"] >= 5, summary


def test_no_process_of_the_served_engine_is_bound_to_fewer_cores(summary: dict[str, Any]) -> None:
    """vLLM's CPU build binds a multiprocess engine's worker to cores of its own choosing
    (``VLLM_CPU_OMP_THREADS_BIND=auto``: core 0 of a 2-core machine for every engine); the
    harness starts its engines unbound, so two servers share the machine, not one core."""
    cores = len(os.sched_getaffinity(0))
    assert summary["fewest_cpus"] and all(n == cores for n in summary["fewest_cpus"].values()), (
        cores,
        summary["fewest_cpus"],
    )


def test_the_neighbours_kills_are_survived(summary: dict[str, Any]) -> None:
    assert summary["neighbour_kills"] >= 1, summary
    assert summary["neighbour_served_after_restart"] > 0, summary
    assert summary["served_alive"] and summary["served_exit"] == 0, summary
    assert not summary["leftover_processes"], summary
