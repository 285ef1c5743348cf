"""``benchmarks/bench_machine.py``: what it says of a series of timings."""

from __future__ import annotations

import pytest

from tests._scripts import load_benchmark


def test_the_summary_counts_slow_samples_and_their_runs() -> None:
    bench = load_benchmark("bench_machine")
    # fast, fast, slow, slow, slow, fast, slow: slow runs of 3 and 1, fast runs of 2 and 1
    got = bench.steadiness([0.050, 0.052, 0.080, 0.081, 0.079, 0.051, 0.100])
    assert got["samples"] == 7 and got["fastest_ms"] == 50.0
    assert got["slow_share"] == round(4 / 7, 3)
    assert got["slow_run_median"] == 2 and got["fast_run_median"] == 1.5
    assert got["slowest_x"] == 2.0 and got["median_x"] == 1.58


def test_a_steady_machine_has_no_slow_samples() -> None:
    bench = load_benchmark("bench_machine")
    got = bench.steadiness([0.05] * 10)
    assert got["slow_share"] == 0 and got["slow_run_median"] == 0 and got["p90_x"] == 1.0
    with pytest.raises(ValueError):
        bench.steadiness([])


def test_the_work_takes_time() -> None:
    assert load_benchmark("bench_machine").work(1000) > 0
