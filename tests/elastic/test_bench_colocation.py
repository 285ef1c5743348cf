"""``benchmarks/bench_colocation.py``'s A/A control: the ``vanilla-split-twin`` arm is
vanilla-split again (engines of its own, the same settings), and its ratio to vanilla-split
is printed like every other arm's -- what the benchmark measures when nothing differs."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests._scripts import load_benchmark


def load() -> ModuleType:
    return load_benchmark("bench_colocation")


def test_the_twin_arm_starts_vanilla_split_again(tmp_path: Path) -> None:
    bench = load()
    (tmp_path / "g").mkdir()
    twin = bench.arm_setup("vanilla-split-twin", 2, tmp_path / "w", tmp_path / "g", "h100")
    split = bench.arm_setup("vanilla-split", 2, tmp_path / "w", tmp_path / "g", "h100")
    assert twin == split
    assert all(env == {} for env, _ in twin)  # vanilla vLLM: no kvplan, no emulation
    assert bench.usable_blocks("vanilla-split-twin", 2) == bench.usable_blocks("vanilla-split", 2)


def _phase(arm: str, rnd: int, p50: float, p99: float) -> dict[str, Any]:
    engine = {"ttft_p50_s": p50, "ttft_p90_s": p99, "ttft_p99_s": p99, "claims_s": []}
    return {
        "round": rnd,
        "seed": 7,
        "arm": arm,
        "per_engine": {"e0": engine},
        "total_throughput_rps": 1.0,
    }


def test_the_twin_ratio_is_tabled_per_round() -> None:
    bench = load()
    phases = [
        _phase("vanilla-split", 0, 1.0, 2.0),
        _phase("vanilla-split-twin", 0, 1.1, 2.0),
        _phase("vanilla-split", 1, 2.0, 4.0),
        _phase("vanilla-split-twin", 1, 1.8, 5.0),
    ]
    text = bench.tables({"engines": 1, "trace": "heavy", "phases": phases})
    twin = next(line for line in text.splitlines() if line.startswith("| vanilla-split-twin"))
    # p50 ratios 1.1 and 0.9 per round (median 1.00), p99 ratios 1.0 and 1.25
    assert "| 1.00 (0.90-1.10)x | 1.12 (1.00-1.25)x |" in twin


def test_the_results_file_names_no_path_of_this_machine(tmp_path: Path) -> None:
    """The settings written to a results file (committed) keep a path inside the checkout
    relative to it and only the last part of any other."""
    bench = load()
    inside = bench.ROOT / "benchmarks" / "results" / "x.json"
    assert bench.shown(inside) == "benchmarks/results/x.json"
    outside = bench.shown(tmp_path / "base" / "src")
    assert outside == "<outside the checkout>/src" and str(tmp_path) not in outside


def test_every_engine_lingers_until_every_arm_served_the_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that ends shuts vLLM down and writes its results: seconds of CPU on a 2-core
    machine. Ended as soon as its own arm had served the round's last phase, it did so beside
    the next arm's first burst: the "bimodal" seed-42 first engine of the 2026-12-05 runs (p99
    0.9 s, or 3 s with steps of 50-500 ms) was the arm's place in that phase's order. The
    round's orchestration, engines stubbed: every engine is started to linger, and told to end
    only after the last phase of every arm was opened and served."""
    bench = load()
    events: list[tuple[str, str]] = []
    started: list[bool] = []

    class Engine:
        def __init__(self, name: str, control: Path) -> None:
            self.name, self.control = name, control

        def ready(self) -> bool:
            return True

        def alive(self) -> bool:
            return False

        def result(self, timeout: float) -> dict[str, Any]:
            events.append(("result", self.control.parent.name))
            return {"serve": {"num_blocks": 24}}

    def start_engine(*args: Any, linger: bool = False, **kwargs: Any) -> Engine:
        started.append(linger)
        return Engine(args[1], args[4])

    def go(control: Path, phase: str, delay: float = 0.0) -> float:
        events.append(("go", f"{control.parent.name} {phase}"))
        return 0.0

    monkeypatch.setattr(bench, "write_model", lambda kind, folder: folder)
    monkeypatch.setattr(bench.co, "start_engine", start_engine)
    monkeypatch.setattr(bench.co, "go", go)
    monkeypatch.setattr(bench.co, "done", lambda control, name, phase: True)

    def end(control: Path) -> None:
        events.append(("end", control.parent.name))

    monkeypatch.setattr(bench.co, "end", end)
    arms = ["vanilla-split", "vanilla-split-twin"]
    args = argparse.Namespace(
        trace="heavy", seeds=[7, 42], arms=arms, requests=2, ramp=0.5, stagger=7.0, cycles=1,
        base_src=None, src=None, emulate=None, profile=None,
    )  # fmt: skip
    bench.run_round(args, 2, Path("python"), tmp_path / "r0", [(0, 7, "p7"), (0, 42, "p42")])
    assert started == [True] * 4
    kinds = [kind for kind, _ in events]
    assert kinds.count("go") == 2 * 3  # the warm-up and both phases, each arm
    last_go = max(i for i, kind in enumerate(kinds) if kind == "go")
    ends = [i for i, kind in enumerate(kinds) if kind == "end"]
    assert sorted(events[i][1] for i in ends) == [f"n2-heavy-{arm}" for arm in arms]
    assert min(ends) > last_go
    assert min(i for i, kind in enumerate(kinds) if kind == "result") > max(ends)


def test_profile_gives_every_engine_of_every_arm_a_file_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--profile DIR``: each engine's steps under cProfile, written to a file named by its
    arm and engine (none when the option is not given)."""
    bench = load()
    got: list[Any] = []
    monkeypatch.setattr(bench, "write_model", lambda kind, folder: folder)
    monkeypatch.setattr(
        bench.co, "start_engine", lambda *args, **kwargs: got.append(kwargs.get("profile"))
    )
    (tmp_path / "g").mkdir()
    traces: dict[str, list[Any]] = {"e0": [], "e1": []}
    folder = tmp_path / "prof"
    for arm in ("vanilla-split", "shared"):
        work = tmp_path / f"n2-heavy-{arm}"
        bench.start_arm(Path("python"), arm, 2, traces, work, tmp_path / "g", None, None, None,
                        folder)  # fmt: skip
    assert len(set(got)) == 4 and all(Path(p).parent == folder for p in got)
    bench.start_arm(Path("python"), "shared", 2, traces, tmp_path / "w", tmp_path / "g", None,
                    None)  # fmt: skip
    assert got[4:] == [None, None]


def test_a_members_group_operations_are_counted_over_its_burst() -> None:
    bench = load()
    steps = [{"group_ops": 5}, {"group_ops": 7}, {"group_ops": 12}]
    assert bench.group_ops(steps) == 7
    assert bench.group_ops([{"schedule_s": 0.1}]) is None  # vanilla: no group
