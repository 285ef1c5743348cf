"""``kvplan top`` and ``kvplan limit`` as a user runs them (typer's CliRunner)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvplan.cli import elastic_cmd
from kvplan.cli.app import app
from kvplan.elastic.files import LimitRequest, read_limit, write_stats
from tests.elastic.test_files import make_stats

ENV = {"NO_COLOR": "1", "COLUMNS": "200"}


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env=ENV)


def assert_refused(res: Any, code: str) -> None:
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(code), res.stderr
    assert "Traceback" not in res.output and res.stdout == ""


# -- limit --------------------------------------------------------------------------------


def test_limit_writes_and_prints(tmp_path: Path) -> None:
    res = run("limit", str(tmp_path), "24GiB", "--cache", "2GiB")
    assert res.exit_code == 0, res.output
    got = read_limit(tmp_path)
    assert isinstance(got, LimitRequest)
    assert (got.limit_bytes, got.cache_limit_bytes) == (24 << 30, 2 << 30)
    assert "limit.json" in res.stdout and "24.00 GiB (25769803776 B)" in res.stdout
    assert "cache limit 2.00 GiB" in res.stdout


def test_limit_without_cache_and_cache_zero(tmp_path: Path) -> None:
    assert run("limit", str(tmp_path), "512MiB").exit_code == 0
    got = read_limit(tmp_path)
    assert isinstance(got, LimitRequest) and got.cache_limit_bytes is None
    res = run("limit", str(tmp_path), "1GiB", "--cache", "0")
    assert res.exit_code == 0 and "cache limit 0 B" in res.stdout
    got = read_limit(tmp_path)
    assert isinstance(got, LimitRequest) and got.cache_limit_bytes == 0


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["lots"], "KVP020"),  # the one size reader's codes
        (["0"], "KVP020"),
        (["--", "-5GiB"], "KVP020"),
        (["2048TiB"], "KVP405"),  # above 1 PiB
        (["9" * 60], "KVP020"),
        (["1GiB", "--cache", "2GiB"], "KVP418"),  # a cache limit above the limit
        (["1GiB", "--cache", "x"], "KVP020"),
    ],
)
def test_limit_bad_sizes_are_refused(tmp_path: Path, args: list[str], code: str) -> None:
    run("limit", str(tmp_path), "1GiB")
    before = (tmp_path / "limit.json").read_bytes()
    assert_refused(run("limit", str(tmp_path), *args), code)
    assert (tmp_path / "limit.json").read_bytes() == before  # previous request intact


def test_limit_missing_directory_is_kvp419(tmp_path: Path) -> None:
    assert_refused(run("limit", str(tmp_path / "nope"), "1GiB"), "KVP419")
    (tmp_path / "file").write_text("")
    assert_refused(run("limit", str(tmp_path / "file"), "1GiB"), "KVP419")
    assert not (tmp_path / "nope").exists()


# -- top ----------------------------------------------------------------------------------


@pytest.fixture
def engines(tmp_path: Path) -> Path:
    now = time.time()
    for engine in ("e1", "e2"):
        (tmp_path / engine).mkdir()
        for rank in (0, 1):
            write_stats(
                tmp_path / engine,
                make_stats(engine=f"host:{engine}", rank=rank, time=now, mapped_bytes=rank << 20),
            )
    return tmp_path


def test_top_json(engines: Path) -> None:
    res = run("top", str(engines), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [(d["engine"], d["rank"]) for d in data] == [
        ("host:e1", 0),
        ("host:e1", 1),
        ("host:e2", 0),
        ("host:e2", 1),
    ]
    assert data[1]["mapped_bytes"] == 1 << 20 and data[0]["path"].endswith("e1/rank0.stats.json")
    assert all(d["stale"] is False and d["age_seconds"] < 60 for d in data)
    assert res.stderr == ""


def test_top_once_table(engines: Path) -> None:
    res = run("top", str(engines), "--once")
    assert res.exit_code == 0, res.output
    out = res.stdout
    for column in ("engine", "rank", "state", "mapped", "peak", "limit", "reserved", "live"):
        assert column in out
    assert "cached" in out and "maps" in out and "unmaps" in out and "map time" in out
    assert "failed" in out  # failed maps (each one preempted requests, see docs/elastic.md)
    assert out.count("host:e1") == 2 and out.count("host:e2") == 2
    assert "1.00 MiB" in out and "512.00 MiB" in out and "12.5 ms" in out  # mapped, limit, time
    assert "stale" not in out and "\x1b" not in out  # NO_COLOR: no escapes


def test_top_marks_stale_but_not_closed(tmp_path: Path) -> None:
    old = time.time() - 60
    write_stats(tmp_path, make_stats(rank=0, time=old))
    write_stats(tmp_path, make_stats(rank=1, time=old, state="closed"))
    res = run("top", str(tmp_path), "--once")
    assert res.exit_code == 0 and res.stdout.count("stale 6") == 1
    data = json.loads(run("top", str(tmp_path), "--json").stdout)
    assert [d["stale"] for d in data] == [True, False]


def test_top_reports_bad_files_and_shows_the_rest(engines: Path) -> None:
    (engines / "e1" / "rank5.stats.json").write_text("{")
    res = run("top", str(engines), "--json")
    assert res.exit_code == 0 and len(json.loads(res.stdout)) == 4
    assert res.stderr.startswith("KVP416") and "rank5.stats.json" in res.stderr
    res = run("top", str(engines), "--once")
    assert res.exit_code == 0 and "KVP416" in res.stderr


def test_top_only_bad_files_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "rank0.stats.json").write_text("[]")
    res = run("top", str(tmp_path), "--json")
    assert res.exit_code == 2 and res.stderr.startswith("KVP416")
    assert json.loads(res.stdout) == []


def test_top_nothing_found_is_exit_1(tmp_path: Path) -> None:
    for args in ([], ["--once"], ["--json"]):
        res = run("top", str(tmp_path), *args)
        assert res.exit_code == 1, res.output
        assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1
        assert "no rank<N>.stats.json files" in res.stderr


def test_top_missing_directory_is_kvp419(tmp_path: Path) -> None:
    assert_refused(run("top", str(tmp_path / "nope")), "KVP419")
    assert_refused(run("top", str(tmp_path / "nope"), "--json"), "KVP419")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "4000"])
def test_top_bad_interval(engines: Path, value: str) -> None:
    assert_refused(run("top", str(engines), "--interval", value), "KVP405")


def test_top_live_refreshes_until_ctrl_c(engines: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Live mode re-reads the files every interval; Ctrl-C (KeyboardInterrupt) exits 0."""
    sleeps: list[float] = []

    def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 1:  # between the first and second frame an engine maps more
            write_stats(
                engines / "e2",
                make_stats(engine="host:e2", rank=1, time=time.time(), mapped_bytes=7 << 20),
            )
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(elastic_cmd.time, "sleep", fake_sleep)
    reads: list[int] = []
    real_read = elastic_cmd.read_stats_tree

    def counting_read(directory: Path) -> Any:
        reads.append(1)
        return real_read(directory)

    monkeypatch.setattr(elastic_cmd, "read_stats_tree", counting_read)
    res = run("top", str(engines), "--interval", "0.25")
    assert res.exit_code == 0, res.output
    assert sleeps == [0.25, 0.25, 0.25]
    assert len(reads) == 4  # the start check, the first frame and two refreshes
    assert "7.00 MiB" in res.stdout and "host:e2" in res.stdout


def test_top_escapes_and_bounds_document_text(tmp_path: Path) -> None:
    engine = "evil\x1b[31m" + "x" * 400
    write_stats(tmp_path, make_stats(engine=engine, time=time.time()))
    res = run("top", str(tmp_path), "--once")
    assert res.exit_code == 0 and "\x1b[" not in res.stdout
    assert "evil\\x1b[31m" in res.stdout and "x" * 400 not in res.stdout
    data = json.loads(run("top", str(tmp_path), "--json").stdout)
    assert data[0]["engine"] == engine  # JSON keeps the exact value, escaped as JSON
