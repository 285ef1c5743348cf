"""``benchmarks/plot_colocation.py``: the co-location figure is drawn from the benchmark's
JSON -- the ratios it draws are the per-round ratios the benchmark's tables give, drawn from
the committed results as ``docs/img/colocation.svg`` is."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from tests._scripts import ROOT, load_benchmark

RESULTS = ROOT / "benchmarks" / "results"
FIGURE_FROM = ("colocation-heavy-2-3.json", "colocation-heavy-4.json")


def phase(rnd: int, arm: str, p99: list[float]) -> dict[str, Any]:
    per_engine = {f"e{i}": {"ttft_p99_s": v} for i, v in enumerate(p99)}
    return {"round": rnd, "seed": 7, "arm": arm, "per_engine": per_engine}


def test_ratios_are_per_round_against_vanilla_split() -> None:
    plot = load_benchmark("plot_colocation")
    run = {
        "engines": 2,
        "trace": "heavy",
        "phases": [
            phase(0, "vanilla-split", [1.0, 2.0]),
            phase(0, "shared", [0.5, 0.5]),
            phase(1, "vanilla-split", [2.0, 2.0]),
            phase(1, "shared", [0.5, 1.5]),
        ],
    }
    assert sorted(plot.p99_ratios(run)["shared"]) == [0.25, 0.25, 0.5, 0.75]
    assert "vanilla-split" not in plot.p99_ratios(run)


def test_the_figure_is_an_svg_of_every_arm(tmp_path: Path) -> None:
    plot = load_benchmark("plot_colocation")
    out = tmp_path / "figure.svg"
    args = [str(RESULTS / name) for name in FIGURE_FROM]
    assert plot.main([*args, "-o", str(out)]) == 0
    text = out.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for label in plot.LABELS.values():
        assert label.split(" (")[0] in text, label
    data = plot.collect([RESULTS / name for name in FIGURE_FROM])
    assert sorted(data) == [2, 3, 4]
    assert statistics.median(data[3]["shared"]) < 0.5  # what performance.md says it shows


def test_no_heavy_run_is_refused(tmp_path: Path) -> None:
    plot = load_benchmark("plot_colocation")
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"runs": [{"engines": 2, "trace": "poisson", "phases": []}]}))
    assert plot.main([str(results), "-o", str(tmp_path / "x.svg")]) == 2
    assert not (tmp_path / "x.svg").exists()
