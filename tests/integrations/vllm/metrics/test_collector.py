"""The collector: every series of a stats file, a group member, an eager rank, with vLLM's
labels, read at scrape time (what the API server's ``/metrics`` shows)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from kvplan.elastic.files import STEP_SECONDS_BUCKETS, write_stats
from kvplan.elastic.group import GroupMember, read_snapshot, set_budget
from kvplan.integrations.vllm.metrics import METRICS, RANK_LABELS, STATUSES, EngineSource, Reader
from tests.integrations.vllm.metrics._helpers import (
    MAP_COUNTS,
    UNMAP_COUNTS,
    only,
    scrape,
    stats,
    write_plan,
)

MiB = 1 << 20
LABELS = {"model_name": "tiny", "engine": "0"}


def reader_of(directory: Path, engine: str = "0") -> Reader:
    reader = Reader()
    reader.add(EngineSource("tiny", engine, directory))
    return reader


def test_every_rank_series_is_the_stats_file_with_vllms_labels(tmp_path: Path) -> None:
    snaps = [stats(rank=0), stats(rank=1, mapped_bytes=3 * MiB, maps=768)]
    for snap in snaps:
        write_stats(tmp_path, snap)
    found = scrape(reader_of(tmp_path))
    rank_metrics = [m for m in METRICS if m.labels[: len(RANK_LABELS)] == RANK_LABELS]
    for m in rank_metrics:
        for name in m.sample_names:
            assert {lab["rank"] for lab, _ in found[name]} == {"0", "1"}, name
            for lab, _ in found[name]:
                assert lab["model_name"] == "tiny" and lab["engine"] == "0", (name, lab)
    for snap in snaps:
        rank = str(snap.rank)
        for name, attr in (
            ("kvplan_kv_reserved_bytes", "reserved_bytes"),
            ("kvplan_kv_mapped_bytes", "mapped_bytes"),
            ("kvplan_kv_peak_mapped_bytes", "peak_mapped_bytes"),
            ("kvplan_kv_limit_bytes", "limit_bytes"),
            ("kvplan_kv_asked_limit_bytes", "asked_limit_bytes"),
            ("kvplan_kv_floor_bytes", "floor_bytes"),
            ("kvplan_kv_cache_limit_bytes", "cache_limit_bytes"),
            ("kvplan_kv_reserve_bytes", "reserve_bytes"),
            ("kvplan_kv_blocks", "num_blocks"),
            ("kvplan_kv_live_blocks", "live_blocks"),
            ("kvplan_kv_cached_blocks", "cached_blocks"),
            ("kvplan_kv_mapped_chunks_total", "maps"),
            ("kvplan_kv_unmapped_chunks_total", "unmaps"),
            ("kvplan_kv_failed_maps_total", "failed_maps"),
            ("kvplan_kv_rolled_back_chunks_total", "rollbacks"),
            ("kvplan_kv_over_limit_preemptions_total", "over_limit_preemptions"),
            ("kvplan_kv_elastic_steps_total", "steps"),
        ):
            assert only(found, name, rank=rank) == getattr(snap, attr), name
        assert 0 <= only(found, "kvplan_kv_snapshot_age_seconds", rank=rank) < 60
        for status in STATUSES:
            want = 1.0 if status == "running" else 0.0
            assert only(found, "kvplan_kv_status", rank=rank, status=status) == want


def test_the_step_histograms_are_the_stats_files_bucket_counts(tmp_path: Path) -> None:
    write_stats(tmp_path, stats())
    found = scrape(reader_of(tmp_path))
    bounds = [*STEP_SECONDS_BUCKETS, float("inf")]
    for kind, counts, total in (("map", MAP_COUNTS, 0.0125), ("unmap", UNMAP_COUNTS, 0.001)):
        name = f"kvplan_kv_{kind}_step_seconds"
        buckets = {float(lab["le"]): v for lab, v in found[f"{name}_bucket"]}
        assert sorted(buckets) == bounds
        running = 0
        for bound, count in zip(bounds, counts, strict=True):
            running += count
            assert buckets[bound] == running  # cumulative, as Prometheus reads them
        assert only(found, f"{name}_count") == sum(counts)
        assert only(found, f"{name}_sum") == pytest.approx(total)


def test_a_rank_before_its_first_step_has_empty_histograms(tmp_path: Path) -> None:
    write_stats(tmp_path, stats(map_seconds_buckets=None, unmap_seconds_buckets=None))
    found = scrape(reader_of(tmp_path))
    assert only(found, "kvplan_kv_map_step_seconds_count") == 0
    assert {v for _, v in found["kvplan_kv_map_step_seconds_bucket"]} == {0.0}


def test_unknown_figures_are_absent_not_zero(tmp_path: Path) -> None:
    write_stats(
        tmp_path, stats(asked_limit_bytes=None, floor_bytes=None, over_limit_preemptions=None)
    )
    found = scrape(reader_of(tmp_path))
    assert "kvplan_kv_asked_limit_bytes" not in found
    assert "kvplan_kv_floor_bytes" not in found
    assert "kvplan_kv_over_limit_preemptions_total" not in found  # an older writer
    assert only(found, "kvplan_kv_limit_bytes") == 24 * MiB


def test_a_closed_or_dead_engine_says_so(tmp_path: Path) -> None:
    from kvplan.elastic.status import writer_identity

    write_stats(tmp_path, stats(rank=0, state="closed"))
    gone = 2**22 + 12345  # above pid_max's default: no such process
    write_stats(tmp_path, stats(rank=1, pid=gone, **writer_identity()))
    found = scrape(reader_of(tmp_path))
    assert only(found, "kvplan_kv_status", rank="0", status="closed") == 1
    assert only(found, "kvplan_kv_status", rank="1", status="dead") == 1
    assert only(found, "kvplan_kv_status", rank="1", status="running") == 0


def test_a_group_member_shows_its_grant_and_the_groups_budget(tmp_path: Path) -> None:
    group, dump = tmp_path / "group", tmp_path / "dump"
    group.mkdir()
    dump.mkdir()
    set_budget(group, 64 * MiB, create=True)
    member = GroupMember.join(group, "e1", floor=MiB, ceiling=64 * MiB)
    try:
        assert member.request(8 * MiB)
        write_stats(dump, stats(group=str(group.resolve()), group_member="e1"))
        write_stats(dump, stats(rank=1, group=str(group.resolve()), group_member="e1"))
        found = scrape(reader_of(dump))
        snap = read_snapshot(group)
        mine = next(m for m in snap.members if m.name == "e1")
        where = {"group": str(group.resolve()), "member": "e1", **LABELS}
        assert only(found, "kvplan_group_budget_bytes", **where) == snap.budget_bytes
        assert only(found, "kvplan_group_free_bytes", **where) == snap.free_bytes
        for name in ("granted", "charged", "guarantee", "borrowed", "claim", "owed"):
            series = f"kvplan_group_{name}_bytes"
            assert only(found, series, **where) == getattr(mine, f"{name}_bytes"), name
        assert only(found, "kvplan_group_effective_limit_bytes", **where) == (
            mine.effective_limit_bytes
        )
        assert mine.granted_bytes >= 8 * MiB
        assert len(found["kvplan_group_granted_bytes"]) == 1  # one member, not one per rank
    finally:
        member.leave()


def test_an_eager_rank_shows_its_reservation_and_nothing_elastic(tmp_path: Path) -> None:
    pools = write_plan(tmp_path)
    found = scrape(reader_of(tmp_path))
    assert set(found) == {"kvplan_kv_reserved_bytes"}
    assert only(found, "kvplan_kv_reserved_bytes", rank="0", **LABELS) == pools > 0


def test_a_stats_file_older_than_the_plan_is_an_earlier_run(tmp_path: Path) -> None:
    """The dump directory served an elastic engine before this eager one: the old snapshot
    is older than the plan the new engine dumped at bind."""
    write_stats(tmp_path, stats(time=time.time() - 3600, state="closed"))
    pools = write_plan(tmp_path)
    found = scrape(reader_of(tmp_path))
    assert set(found) == {"kvplan_kv_reserved_bytes"}
    assert only(found, "kvplan_kv_reserved_bytes") == pools
    write_stats(tmp_path, stats())  # an elastic engine bound after the plan: its figures
    assert only(scrape(reader_of(tmp_path)), "kvplan_kv_reserved_bytes") == 32 * MiB


def test_a_bad_file_is_left_out_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_stats(tmp_path, stats(rank=0))
    (tmp_path / "rank1.stats.json").write_text("{not json")
    reader = reader_of(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vllm.kvplan"):
        first, second = scrape(reader), scrape(reader)
    assert set(first) == set(second)
    assert {lab["rank"] for lab, _ in first["kvplan_kv_mapped_bytes"]} == {"0"}
    assert sum("rank1.stats.json" in r.getMessage() for r in caplog.records) == 1


def test_a_missing_dump_directory_shows_nothing(tmp_path: Path) -> None:
    assert scrape(reader_of(tmp_path / "not-yet")) == {}


def test_a_dump_directory_is_shown_once_whatever_the_engine_indexes(tmp_path: Path) -> None:
    write_stats(tmp_path, stats())
    reader = reader_of(tmp_path, engine="0")
    reader.add(EngineSource("tiny", "1", tmp_path))
    found = scrape(reader)
    assert [lab["engine"] for lab, _ in found["kvplan_kv_mapped_bytes"]] == ["0"]


def test_the_figures_follow_the_file_at_every_scrape(tmp_path: Path) -> None:
    reader = reader_of(tmp_path)
    write_stats(tmp_path, stats(limit_bytes=24 * MiB, maps=10))
    assert only(scrape(reader), "kvplan_kv_limit_bytes") == 24 * MiB
    write_stats(tmp_path, stats(limit_bytes=12 * MiB, maps=30))
    found = scrape(reader)
    assert only(found, "kvplan_kv_limit_bytes") == 12 * MiB
    assert only(found, "kvplan_kv_mapped_chunks_total") == 30
