"""A scrape stays bounded whatever the dump directory holds (issue 52): a 16 MiB plan that
does not parse, 1,025 decoy stats files (beside rank 0's and in a subdirectory), plan files
past the rank bound, a stats file named for one rank that says another, a stats file whose
``group`` text carries an ESC sequence and a newline -- rank 0's series stay, each problem is
said once and escaped, and a failed file is not read again while it is unchanged."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.elastic.files import write_stats
from kvplan.integrations.vllm.metrics._collector import MAX_RANKS, SCRAPE_FILES
from tests.integrations.vllm.metrics._helpers import scrape, stats, write_plan
from tests.integrations.vllm.metrics.test_collector import reader_of

SRC = Path(__file__).parents[4] / "src"
ROOT = Path(__file__).parents[4]
MiB = 1 << 20


def plant(directory: Path, decoys: int = 1025) -> None:
    """The hostile directory of the issue, around a real rank 0: the 16 MiB plan, and
    ``decoys`` stats files in a subdirectory that sorts first (valid ones) and in the
    directory itself (each named for its own rank, each saying rank 0)."""
    (directory / "rank7.plan.json").write_text('{"x": "' + "a" * (16 * MiB) + '"}')
    sub = directory / "a"
    sub.mkdir()
    forged = stats(rank=0, mapped_bytes=1).model_dump_json()
    for rank in range(1, decoys + 1):
        write_stats(sub, stats(rank=rank))
        (directory / f"rank{rank}.stats.json").write_text(forged)
    write_stats(directory, stats(rank=0))  # after any plan of rank 0: this run's


def test_rank_labels_stop_at_the_documented_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for rank in range(MAX_RANKS + 2):
        write_stats(tmp_path, stats(rank=rank))
    write_plan(tmp_path, MAX_RANKS + 5)  # plan files count toward the bound too
    reader = reader_of(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vllm.kvplan"):
        scrapes = 2 + (MAX_RANKS + 8) // SCRAPE_FILES  # new files are read a bound a scrape
        found = [reader.samples() for _ in range(scrapes)]
    for each in found:
        ranks = {int(sample.labels[2]) for sample in each}
        assert 0 in ranks and ranks <= set(range(MAX_RANKS))
    assert {int(sample.labels[2]) for sample in found[-1]} == set(range(MAX_RANKS))
    logged = [r.getMessage() for r in caplog.records]
    assert sum("ranks; the series of the lowest" in m for m in logged) == 1, logged


def test_rank_zero_stays_and_decoys_are_not_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plant(tmp_path)
    reader = reader_of(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vllm.kvplan"):
        found = [scrape(reader) for _ in range(3)]
    for each in found:
        assert [lab["rank"] for lab, _ in each["kvplan_kv_mapped_bytes"]] == ["0"]
        assert {lab["rank"] for series in each.values() for lab, _ in series} == {"0"}
    logged = [r.getMessage() for r in caplog.records]
    assert sum("rank7.plan.json" in m for m in logged) == 1, logged
    assert sum("named for rank 5;" in m for m in logged) == 1, logged


def test_a_failed_plan_is_not_read_again_while_unchanged(tmp_path: Path) -> None:
    write_stats(tmp_path, stats(rank=0))
    bad = tmp_path / "rank3.plan.json"
    bad.write_text("{not json")
    reader = reader_of(tmp_path)
    scrape(reader)
    import kvplan.integrations.vllm.metrics._collector as collector

    calls: list[Path] = []
    real = collector._plan_reserved
    collector._plan_reserved = lambda p, d: (calls.append(p), real(p, d))[1]  # type: ignore[assignment]
    try:
        scrape(reader)
        scrape(reader)
    finally:
        collector._plan_reserved = real  # type: ignore[assignment]
    assert calls == []
    bad.write_text("{still not json}")  # a change is read once
    collector._plan_reserved = lambda p, d: (calls.append(p), real(p, d))[1]  # type: ignore[assignment]
    try:
        scrape(reader)
        scrape(reader)
    finally:
        collector._plan_reserved = real  # type: ignore[assignment]
    assert calls == [bad]


def test_a_stats_file_named_for_one_rank_cannot_speak_for_another(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_stats(tmp_path, stats(rank=0, mapped_bytes=6 * MiB))
    forged = stats(rank=0, mapped_bytes=1)
    (tmp_path / "rank5.stats.json").write_text(forged.model_dump_json())
    (tmp_path / "rank00.stats.json").write_text(forged.model_dump_json())
    with caplog.at_level(logging.WARNING, logger="vllm.kvplan"):
        found = scrape(reader_of(tmp_path))
    assert [(lab["rank"], v) for lab, v in found["kvplan_kv_mapped_bytes"]] == [("0", 6 * MiB)]
    assert any("says rank 0 but is named for rank 5" in r.getMessage() for r in caplog.records)


def test_a_files_text_reaches_the_log_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    forged = "/nowhere\x1b[2J\nINFO forged line"
    write_stats(tmp_path, stats(rank=0, group=forged, group_member="m"))
    (tmp_path / "rank1.stats.json").write_text('{"kind": "\x1b[31m\\u001b"}')
    with caplog.at_level(logging.WARNING, logger="vllm.kvplan"):
        scrape(reader_of(tmp_path))
    messages = [r.getMessage() for r in caplog.records]
    assert any("nowhere" in m for m in messages), messages
    for m in messages:
        assert "\x1b" not in m and "\n" not in m, repr(m)


_MEASURE = r"""
import json, resource, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from pathlib import Path
from tests.integrations.vllm.metrics._helpers import scrape
from tests.integrations.vllm.metrics.test_collector import reader_of
scrape(reader_of(Path(sys.argv[3]) / "missing"))  # the imports, nothing read
reader = reader_of(Path(sys.argv[3]))
if sys.argv[4] == "steady":
    scrape(reader)  # the first read of everything
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
before, times = rss(), []
for _ in range(1 if sys.argv[4] == "first" else 5):
    t = time.perf_counter()
    found = scrape(reader)
    times.append(time.perf_counter() - t)
rank0 = any(lab["rank"] == "0" for lab, _ in found.get("kvplan_kv_mapped_bytes", []))
print(json.dumps({"before": before, "rss": rss(), "seconds": max(times), "rank0": rank0}))
"""


def _measure(directory: Path, which: str) -> dict[str, float]:
    """One scrape's peak memory and the slowest of its scrapes, in a fresh process:
    ``first`` the first scrape, ``steady`` five scrapes after it."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(SRC), str(ROOT), str(directory), which],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_scrape_of_a_hostile_directory_costs_what_a_clean_one_does(tmp_path: Path) -> None:
    """Generous bounds (a shared machine): the issue's figures are 0.2 s and 50 MB more
    than a clean scrape (``benchmarks/bench_scrape.py`` measures them)."""
    clean, hostile = tmp_path / "clean", tmp_path / "hostile"
    clean.mkdir()
    hostile.mkdir()
    write_plan(clean, 0)
    write_stats(clean, stats(rank=0))
    write_plan(hostile, 0)
    plant(hostile)
    for which, seconds in (("first", 2.0), ("steady", 1.0)):
        base, bad = _measure(clean, which), _measure(hostile, which)
        assert bad["rank0"] and base["rank0"], (which, base, bad)
        assert bad["rss"] - base["rss"] < 50 * MiB, (which, base, bad)
        assert bad["seconds"] < seconds, (which, bad)
