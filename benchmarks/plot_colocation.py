"""Draw the co-location benchmark's results: p99 TTFT of each arm against vanilla-split's.

    python benchmarks/plot_colocation.py RESULTS.json [RESULTS.json ...] -o docs/img/colocation.svg

Reads the JSON ``bench_colocation.py --json`` writes (one or more files; each run is an engine
count) and draws, per engine count, the median over engines, seeds and repetitions
(``--rounds``) of each arm's p99 TTFT divided by vanilla-split's in the same repetition (the ratio
``bench_colocation`` tables give per engine), with the range of those ratios as a bar and the
ideal of a shared budget whose bursts take turns, 1/N, as a mark. Needs matplotlib
(``pip install 'kvplan[plot]'``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ARMS = ("vanilla-split-twin", "kvplan-split", "shared", "vanilla-whole")
COLOURS = {
    "vanilla-split-twin": "#9e9e9e",
    "kvplan-split": "#1f77b4",
    "shared": "#2ca02c",
    "vanilla-whole": "#ff7f0e",
}
LABELS = {
    "vanilla-split-twin": "vanilla-split again (A/A control)",
    "kvplan-split": "kvplan elastic, split budget",
    "shared": "kvplan elastic, one shared budget",
    "vanilla-whole": "vanilla with the whole budget each (bound)",
}


def p99_ratios(run: dict[str, Any]) -> dict[str, list[float]]:
    """``{arm: [ratio, ...]}``: every engine-round's p99 TTFT over vanilla-split's."""
    phases = run["phases"]
    base = {(p["seed"], p["round"]): p["per_engine"] for p in phases if p["arm"] == "vanilla-split"}
    out: dict[str, list[float]] = {}
    for phase in phases:
        ref = base.get((phase["seed"], phase["round"]))
        if phase["arm"] == "vanilla-split" or ref is None:
            continue
        for engine, figures in phase["per_engine"].items():
            ratio = figures["ttft_p99_s"] / max(1e-9, ref[engine]["ttft_p99_s"])
            out.setdefault(phase["arm"], []).append(ratio)
    return out


def collect(paths: list[Path]) -> dict[int, dict[str, list[float]]]:
    """``{engines: {arm: ratios}}`` over every heavy-trace run in ``paths`` (a later file's
    run of the same engine count replaces an earlier one's)."""
    out: dict[int, dict[str, list[float]]] = {}
    for path in paths:
        report = json.loads(path.read_text(encoding="utf-8"))
        for run in report["runs"]:
            if run.get("trace", "heavy") == "heavy":
                out[int(run["engines"])] = p99_ratios(run)
    return out


def plot(data: dict[int, dict[str, list[float]]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "kvplan"  # stable element ids: the file diffs cleanly
    counts = sorted(data)
    arms = [a for a in ARMS if any(a in data[n] for n in counts)]
    width = 0.8 / max(1, len(arms))
    fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=100)
    for i, arm in enumerate(arms):
        xs, medians, lows, highs = [], [], [], []
        for j, n in enumerate(counts):
            ratios = data[n].get(arm)
            if not ratios:
                continue
            med = statistics.median(ratios)
            xs.append(j + (i - (len(arms) - 1) / 2) * width)
            medians.append(med)
            lows.append(med - min(ratios))
            highs.append(max(ratios) - med)
        ax.bar(xs, medians, width * 0.9, color=COLOURS[arm], label=LABELS[arm])
        ax.errorbar(xs, medians, yerr=[lows, highs], fmt="none", ecolor="#333333", capsize=3)
    for j, n in enumerate(counts):
        ax.hlines(1 / n, j - 0.45, j + 0.45, colors="#d62728", linestyles="dotted")
    ax.axhline(1.0, color="#333333", linewidth=0.8)
    ax.set_xticks(range(len(counts)), [f"{n} engines" for n in counts])
    ax.set_ylabel("p99 TTFT / vanilla-split's (median, min-max)")
    ax.set_title(title, fontsize=10)
    ideal = "1/N: the ideal when bursts take turns"
    ax.plot([], [], color="#d62728", linestyle="dotted", label=ideal)
    ax.set_ylim(0, max(2.0, ax.get_ylim()[1]))
    fig.legend(fontsize=8, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None} if out.suffix == ".svg" else None)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+", help="bench_colocation --json files")
    parser.add_argument("-o", "--output", type=Path, required=True, help=".svg or .png")
    parser.add_argument(
        "--title", default="Co-location, heavy trace: p99 TTFT against a split budget"
    )
    args = parser.parse_args(argv)
    data = collect(args.results)
    if not data:
        print("no heavy-trace run in the results", file=sys.stderr)
        return 2
    plot(data, args.output, args.title)
    for n in sorted(data):
        shown = ", ".join(
            f"{arm} {statistics.median(r):.2f}x" for arm, r in sorted(data[n].items())
        )
        print(f"{n} engines: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
