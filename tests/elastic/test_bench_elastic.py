"""``benchmarks/bench_elastic.py``'s in-process measures still run against kvplan's current
elastic handlers and vLLM's real block pool (the per-step measure broke once, silently, when
``Worker.execute_model`` became a step target: a benchmark nobody can run measures nothing).
Tiny sizes: this checks that they run and return sane figures, not how fast anything is."""

from __future__ import annotations

from types import ModuleType

from tests._scripts import load_benchmark


def load() -> ModuleType:
    return load_benchmark("bench_elastic")


def test_the_per_step_measure_runs_the_three_handlers() -> None:
    us = load().micro(20)
    assert 0 < us < 100_000


def test_the_admission_and_trim_measures_run() -> None:
    bench = load()
    admission = bench.admission(512)
    assert admission and all(v >= 0 for v in admission.values())
    trim = bench.trim_cost(512, rounds=2)
    assert trim and all(v > 0 for v in trim.values())
