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


def test_the_step_table_sets_kvplans_wrappers_apart_from_vllms_own_work() -> None:
    timers = {
        "eager": {
            "schedule": 13.0, "update_from_output": 8.0, "worker.execute_model": 305.0,
            "runner.execute_model": 301.0, "worker.sample_tokens": 19.0,
            "runner.sample_tokens": 17.0,
        },
    }  # fmt: skip
    header, rule, row = load().step_table(timers, {"eager": 0.36})
    assert header.count("|") == rule.count("|") == row.count("|") == 9
    assert row == "| eager | 360.0 | 13.0 | 8.0 | 4.0 | 301.0 | 2.0 | 17.0 |"


def test_the_engines_step_timers_wrap_vllms_functions_and_put_them_back() -> None:
    from harness.engine import driver

    sites = [
        (driver.timer_class(module, cls), name) for _key, module, cls, name in driver.STEP_TIMERS
    ]
    before = [vars(cls).get(name) for cls, name in sites]
    figures: dict[str, dict[str, float]] = {}
    with driver.step_timers(figures):
        assert all(vars(cls)[name] is not b for (cls, name), b in zip(sites, before, strict=True))
    assert [vars(cls).get(name) for cls, name in sites] == before
    assert set(figures) == {key for key, *_ in driver.STEP_TIMERS}


def test_the_handler_table_ranks_kvplans_own_time() -> None:
    handlers = {
        "schedule": {"ms": 1.6, "calls": 160},
        "pool.get_new_blocks": {"ms": 0.75, "calls": 24},
    }
    lines = load().handler_table(handlers)
    assert lines[2] == "| schedule | 160 | 1.60 | 10.0 |"
    assert lines[3] == "| pool.get_new_blocks | 24 | 0.75 | 31.2 |"
    assert lines[-1] == "| all | | 2.35 | |"


def test_the_handler_timers_count_kvplans_time_not_the_vllm_function_it_wraps() -> None:
    """A handler's own time is its time less the time in ``Call.run`` (vLLM's original): a
    handler that runs a slow original and does little itself shows little; every timed
    method is put back."""
    import importlib
    import time

    from harness.engine import driver
    from kvplan.integrations.vllm.elastic._mode import ElasticMode
    from kvplan.integrations.vllm.pipeline import Call
    from tests.elastic._calls import wrapped_call

    sites = [
        (getattr(importlib.import_module(module), cls), name)
        for _key, module, cls, name in driver.HANDLER_TIMERS
    ]
    before = [vars(cls)[name] for cls, name in sites] + [vars(Call)["run"]]

    class Scheduler:
        def schedule(self) -> object:
            time.sleep(0.05)  # vLLM's work: not kvplan's
            return object()

    figures: dict[str, dict[str, float]] = {}
    with driver.handler_timers(figures):
        mode = ElasticMode.__new__(ElasticMode)
        mode.schedule(None, wrapped_call(Scheduler(), "schedule"))  # type: ignore[arg-type]
    assert figures["schedule"]["calls"] == 1
    assert 0 <= figures["schedule"]["seconds"] < 0.02  # the 50 ms sleep is not counted
    assert [vars(cls)[name] for cls, name in sites] + [vars(Call)["run"]] == before


def test_the_snapshot_runs_measure_runs() -> None:
    costs = load().snapshot_runs_cost(chunks=64, rounds=1)
    assert set(costs) == {"10% mapped", "50% mapped", "100% mapped"}
    assert all(v >= 0 for v in costs.values())
