"""Stats and limit files: atomic writes, bounded reads, diagnostics instead of exceptions."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness._stats import make_stats
from kvplan.elastic import files
from kvplan.elastic.files import (
    LIMIT_FILE,
    STATS_KIND,
    ElasticStats,
    LimitRequest,
    read_limit,
    read_stats_tree,
    stats_path,
    write_limit,
    write_stats,
)
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError


def test_stats_round_trip(tmp_path: Path) -> None:
    stats = make_stats(rank=3)
    path = write_stats(tmp_path, stats)
    assert path == stats_path(tmp_path, 3) == tmp_path / "rank3.stats.json"
    data = json.loads(path.read_text())
    assert data["kind"] == STATS_KIND and data["version"] == 1 and data["mapped_bytes"] == 6 << 20
    assert read_stats_tree(tmp_path) == [(path, stats)]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # no temp file left


def test_stats_rewrite_is_atomic_replace(tmp_path: Path) -> None:
    path = write_stats(tmp_path, make_stats(mapped_bytes=1))
    inode = path.stat().st_ino
    write_stats(tmp_path, make_stats(mapped_bytes=2))
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    ((_, got),) = read_stats_tree(tmp_path)
    assert isinstance(got, ElasticStats) and got.mapped_bytes == 2


def test_tree_finds_ranks_two_levels_down_sorted(tmp_path: Path) -> None:
    for sub, rank in (("b", 1), ("a", 0), ("a", 10), ("a/x", 2)):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
        write_stats(tmp_path / sub, make_stats(rank=rank, engine=sub))
    write_stats(tmp_path, make_stats(rank=7))
    deep = tmp_path / "a" / "x" / "y"
    deep.mkdir()
    write_stats(deep, make_stats(rank=9))  # three levels down: not searched
    (tmp_path / "notes.json").write_text("{}")
    (tmp_path / "rank1.stats.json.bak").write_text("{}")
    got = read_stats_tree(tmp_path)
    paths = [p.relative_to(tmp_path).as_posix() for p, _ in got]
    assert paths == [
        "a/rank0.stats.json",
        "a/rank10.stats.json",
        "a/x/rank2.stats.json",
        "b/rank1.stats.json",
        "rank7.stats.json",
    ]
    assert all(isinstance(s, ElasticStats) for _, s in got)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{", "KVP001"),
        ("", "empty"),
        (b"\xff\xfe{}", "UTF-16"),
        (json.dumps({"kind": "something-else", "version": 1}), "not a kvplan-elastic-stats"),
        (json.dumps([1, 2]), "not a kvplan-elastic-stats"),
        (json.dumps({"kind": STATS_KIND, "version": 2}), "version 2"),
        ("rank", "KVP0"),
    ],
)
def test_bad_stats_file_is_a_diagnostic(tmp_path: Path, content: str | bytes, needle: str) -> None:
    good = write_stats(tmp_path, make_stats(rank=0))
    bad = tmp_path / "rank1.stats.json"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    got = dict(read_stats_tree(tmp_path))
    assert isinstance(got[good], ElasticStats)
    diag = got[bad]
    assert isinstance(diag, Diagnostic) and diag.code is Code.STATS_UNREADABLE
    assert needle in diag.render() and str(bad) in diag.location
    assert "\n" not in diag.render() and len(diag.render()) < 800


def test_invalid_field_names_the_field(tmp_path: Path) -> None:
    data = make_stats().model_dump(mode="json")
    data["mapped_bytes"] = -5
    data["surprise"] = True
    (tmp_path / "rank0.stats.json").write_text(json.dumps(data))
    ((_, diag),) = read_stats_tree(tmp_path)
    assert isinstance(diag, Diagnostic) and diag.code is Code.STATS_UNREADABLE
    assert "mapped_bytes" in diag.message and "1 more" in diag.message


def test_huge_and_odd_files_are_not_read(tmp_path: Path) -> None:
    big = tmp_path / "rank0.stats.json"
    big.write_bytes(b" " * (files.MAX_FILE_BYTES + 1))
    (tmp_path / "rank1.stats.json").mkdir()  # a directory with a stats name
    got = dict(read_stats_tree(tmp_path))
    assert isinstance(got[big], Diagnostic) and "larger than 64 KiB" in got[big].message
    odd = got[tmp_path / "rank1.stats.json"]
    assert isinstance(odd, Diagnostic) and "not a regular file" in odd.message


def test_unreadable_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Permission errors (simulated: the suite may run as root, who reads anything)."""
    path = write_stats(tmp_path, make_stats())
    locked = tmp_path / "locked"
    locked.mkdir()
    real_open, real_scandir = os.open, os.scandir

    def fake_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file) in (str(path), path.name):  # the reader opens it relative to its folder
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    def fake_scandir(folder: Any) -> Any:
        if str(folder) == str(locked):
            raise PermissionError(13, "Permission denied", str(folder))
        return real_scandir(folder)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(files.os, "scandir", fake_scandir)
    got = dict(read_stats_tree(tmp_path))
    assert isinstance(got[path], Diagnostic) and got[path].code is Code.STATS_UNREADABLE
    assert "Permission denied" in got[path].message
    assert isinstance(got[locked], Diagnostic) and got[locked].code is Code.DIRECTORY_MISSING
    assert "Permission denied" in got[locked].message


def test_tree_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_STATS_FILES", 3)
    for rank in range(5):
        write_stats(tmp_path, make_stats(rank=rank))
    got = read_stats_tree(tmp_path)
    assert sum(isinstance(s, ElasticStats) for _, s in got) == 3
    (diag,) = [s for _, s in got if isinstance(s, Diagnostic)]
    assert "more than 3 stats files" in diag.message
    monkeypatch.setattr(files, "MAX_TREE_ENTRIES", 2)
    got = read_stats_tree(tmp_path)
    assert any(isinstance(s, Diagnostic) and "directory entries" in s.message for _, s in got)


def test_missing_directory_is_a_diagnostic(tmp_path: Path) -> None:
    ((path, diag),) = read_stats_tree(tmp_path / "nope")
    assert path == tmp_path / "nope"
    assert isinstance(diag, Diagnostic) and diag.code is Code.DIRECTORY_MISSING


def test_stats_model_refuses_bad_values() -> None:
    with pytest.raises(ValueError):
        make_stats(state="sleeping")
    with pytest.raises(ValueError):
        make_stats(map_seconds=float("nan"))
    with pytest.raises(ValueError):
        make_stats(extra_field=1)
    with pytest.raises(ValueError):
        make_stats(rank=-1)
    with pytest.raises(ValueError):
        make_stats(engine="x" * 513)


def test_limit_round_trip(tmp_path: Path) -> None:
    assert read_limit(tmp_path) is None
    assert read_limit(tmp_path / "missing-dir") is None
    path = write_limit(tmp_path, 24 << 30)
    assert path == tmp_path / LIMIT_FILE
    got = read_limit(tmp_path)
    assert isinstance(got, LimitRequest)
    assert got.limit_bytes == 24 << 30 and got.cache_limit_bytes is None and got.written_at > 0
    write_limit(tmp_path, 8 << 30, 0)
    got = read_limit(tmp_path)
    assert isinstance(got, LimitRequest) and (got.limit_bytes, got.cache_limit_bytes) == (
        8 << 30,
        0,
    )


def test_limit_refuses_negative(tmp_path: Path) -> None:
    with pytest.raises(KVPlanError) as e:
        write_limit(tmp_path, -1)
    assert e.value.code is Code.BAD_LIMIT
    with pytest.raises(KVPlanError) as e:
        write_limit(tmp_path, 1, -1)
    assert e.value.code is Code.BAD_LIMIT
    assert read_limit(tmp_path) is None  # nothing written


def test_failed_limit_write_keeps_previous(tmp_path: Path) -> None:
    write_limit(tmp_path, 1 << 30)
    with pytest.raises(KVPlanError) as e:
        write_limit(tmp_path / "gone", 2 << 30)
    assert e.value.code is Code.OUTPUT_FAILED
    got = read_limit(tmp_path)
    assert isinstance(got, LimitRequest) and got.limit_bytes == 1 << 30


@pytest.mark.parametrize(
    "content",
    [
        "{",
        json.dumps({"kind": "kvplan-elastic-limit", "version": 1, "limit_bytes": -1}),
        json.dumps({"kind": "kvplan-elastic-stats", "version": 1}),
        json.dumps({"kind": "kvplan-elastic-limit", "version": 1, "limit_bytes": 1.5e99}),
    ],
)
def test_bad_limit_file_is_a_diagnostic(tmp_path: Path, content: str) -> None:
    (tmp_path / LIMIT_FILE).write_text(content)
    got = read_limit(tmp_path)
    assert isinstance(got, Diagnostic) and got.code is Code.LIMIT_UNREADABLE
    assert str(tmp_path / LIMIT_FILE) in got.location


# -- the optional fields: liveness, floor, asked limit, mapped runs -------------------------


def test_files_of_older_writers_read_with_defaults(tmp_path: Path) -> None:
    data = make_stats().model_dump(mode="json")
    for key in (
        "host",
        "pid_namespace",
        "floor_bytes",
        "asked_limit_bytes",
        "over_limit_preemptions",
        "plan_fingerprint",
        "mapped_runs",
        "mapped_runs_unit",
    ):
        del data[key]
    (tmp_path / "rank0.stats.json").write_text(json.dumps(data))
    ((_, got),) = read_stats_tree(tmp_path)
    assert isinstance(got, ElasticStats)
    assert (got.host, got.floor_bytes, got.asked_limit_bytes, got.mapped_runs) == (
        None,
        None,
        None,
        None,
    )
    assert got.over_limit_preemptions is None
    assert got.mapped_runs_unit == 1


def test_new_fields_round_trip(tmp_path: Path) -> None:
    stats = make_stats(
        host="node-1",
        pid_namespace="pid:[4026531836]",
        floor_bytes=640 << 10,
        asked_limit_bytes=1024,
        plan_fingerprint="sha256:" + "ab" * 32,
        mapped_runs={"kv_cache": [(0, 1), (5, 3)]},
    )
    path = write_stats(tmp_path, stats)
    data = json.loads(path.read_text())
    assert data["mapped_runs"] == {"kv_cache": [[0, 1], [5, 3]]}  # [first_chunk, count]
    assert data["floor_bytes"] == 640 << 10 and data["asked_limit_bytes"] == 1024
    assert read_stats_tree(tmp_path) == [(path, stats)]


@pytest.mark.parametrize(
    ("runs", "needle"),
    [
        ({"kv_cache": [[5, 1], [2, 1]]}, "sorted and disjoint"),
        ({"kv_cache": [[0, 4], [3, 1]]}, "sorted and disjoint"),
        ({"kv_cache": [[-1, 2]]}, "first chunk"),
        ({"kv_cache": [[0, 0]]}, "first chunk"),
        ({"kv_cache": [[0, 1, 2]]}, "mapped_runs"),
        ({"kv_cache": [[2**50, 1]]}, "below 2**50"),
        ({"": [[0, 1]]}, "pool name"),
        ({"p" * 257: [[0, 1]]}, "pool name"),
        ({f"p{i}": [[0, 1]] for i in range(65)}, "more than 64 pools"),
        ({"kv_cache": [[2 * i, 1] for i in range(513)]}, "more than 512 runs"),
    ],
)
def test_bad_mapped_runs_are_a_diagnostic(tmp_path: Path, runs: Any, needle: str) -> None:
    data = make_stats().model_dump(mode="json")
    data["mapped_runs"] = runs
    (tmp_path / "rank0.stats.json").write_text(json.dumps(data))
    ((_, diag),) = read_stats_tree(tmp_path)
    assert isinstance(diag, Diagnostic) and diag.code is Code.STATS_UNREADABLE
    assert needle in diag.message and "mapped_runs" in diag.message


def test_the_largest_valid_snapshot_fits_the_reader(tmp_path: Path) -> None:
    """A writer that fills every bound still writes a file the reader accepts."""
    pools = [
        f"{'p' * (files.MAX_POOL_NAME_CHARS - 3)}{i:03d}" for i in range(files.MAX_MAPPED_POOLS)
    ]
    per = files.MAX_MAPPED_RUNS // len(pools)
    big = 2**50 - 2 * per - 2
    runs = {pool: [(big + 2 * k, 1) for k in range(per)] for pool in pools}
    stats = make_stats(
        engine="e" * 512,
        backend="b" * 64,
        host="h" * 255,
        pid_namespace="n" * 64,
        plan_fingerprint="f" * 128,
        floor_bytes=2**63 - 1,
        asked_limit_bytes=2**63 - 1,
        over_limit_preemptions=2**63 - 1,
        mapped_runs=runs,
    )
    path = write_stats(tmp_path, stats)
    assert path.stat().st_size <= files.MAX_FILE_BYTES
    assert read_stats_tree(tmp_path) == [(path, stats)]


def test_run_lengths() -> None:
    assert files.run_lengths([]) == []
    assert files.run_lengths([7, 1, 2, 3, 3, 9, 8]) == [(1, 3), (7, 3)]


def test_mapped_runs_exact_when_they_fit() -> None:
    runs, unit = files.mapped_runs({"kv_cache": {0, 1, 2, 10}, "empty": set()})
    assert (runs, unit) == ({"kv_cache": [(0, 3), (10, 1)]}, 1)


def test_mapped_runs_coarsen_past_the_bound() -> None:
    chunks = set(range(0, 4000, 3))  # 1334 runs of one chunk
    runs, unit = files.mapped_runs({"kv_cache": chunks}, max_runs=100)
    assert runs is not None and unit > 1 and unit & (unit - 1) == 0
    assert sum(len(r) for r in runs.values()) <= 100
    covered = {u for first, count in runs["kv_cache"] for u in range(first, first + count)}
    assert all(c // unit in covered for c in chunks)  # every mapped chunk's unit is listed
    make_stats(mapped_runs=runs, mapped_runs_unit=unit)  # and a snapshot accepts them


def test_mapped_runs_are_the_smallest_unit_whose_runs_fit() -> None:
    """Against the definition, over random chunk sets (sparse, dense, clustered): the runs
    list exactly the units (``chunk // unit``) some mapped chunk falls in, merged into
    maximal runs, at the smallest power of two whose run count fits (the halving passes
    over runs give what the chunks themselves give)."""
    import random

    def definition(ids: set[int], unit: int) -> list[tuple[int, int]]:
        units = sorted({c // unit for c in ids})
        out: list[tuple[int, int]] = []
        for u in units:
            if out and out[-1][0] + out[-1][1] == u:
                out[-1] = (out[-1][0], out[-1][1] + 1)
            else:
                out.append((u, 1))
        return out

    rng = random.Random(33)
    for case in range(300):
        pools = {}
        for p in range(rng.randint(1, 3)):
            size = rng.choice([1, 7, 64, 1000, 5000])
            density = rng.choice([0.05, 0.5, 0.95, 1.0])
            ids = {c for c in range(size) if rng.random() < density}
            if rng.random() < 0.3:  # a clustered pool: a few long runs
                ids = {c for lo in rng.sample(range(size), min(size, 4)) for c in range(lo, size)}
            pools[f"p{p}"] = ids
        bound = rng.choice([1, 3, 16, 100, 512])
        runs, unit = files.mapped_runs(pools, max_runs=bound)
        mapped = {pool: ids for pool, ids in pools.items() if ids}
        if len(mapped) > bound:
            assert (runs, unit) == (None, 1), case
            continue
        assert runs == {pool: definition(ids, unit) for pool, ids in mapped.items()}, case
        assert sum(len(r) for r in runs.values()) <= bound, case
        if unit > 1:  # half the unit would not have fitted
            half = sum(len(definition(ids, unit // 2)) for ids in mapped.values())
            assert half > bound, case


def test_mapped_runs_that_cannot_be_recorded_are_none() -> None:
    many = {f"pool{i}": [0] for i in range(files.MAX_MAPPED_POOLS + 1)}
    assert files.mapped_runs(many) == (None, 1)
    assert files.mapped_runs({"p" * 300: [0]}) == (None, 1)


def test_stale_means_the_writer_stopped() -> None:
    assert files.HEARTBEAT_SECONDS == 2.0 and files.STALE_HEARTBEATS == 3
    stats = make_stats(time=1000.0)
    assert not files.is_stale(stats, 1000.0 + 5.9)  # an idle engine's heartbeat is 2 s
    assert files.is_stale(stats, 1000.0 + 6.1)
    assert not files.is_stale(make_stats(time=1000.0, state="closed"), 99999.0)
    assert not files.is_stale(stats, 900.0)  # a clock behind the writer's: not stale
