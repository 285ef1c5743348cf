"""``benchmarks/bench_colocation.py``'s A/A control: the ``vanilla-split-twin`` arm is
vanilla-split again (engines of its own, the same settings), and its ratio to vanilla-split
is printed like every other arm's -- what the benchmark measures when nothing differs."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

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
