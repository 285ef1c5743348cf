"""``kvplan top`` and ``kvplan limit`` as a user runs them (typer's CliRunner)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness._stats import make_stats
from kvplan.cli import elastic_cmd
from kvplan.cli.app import app
from kvplan.elastic.files import LimitRequest, read_limit, write_stats
from kvplan.schemas.errors import KVPlanError

ENV = {"NO_COLOR": "1", "COLUMNS": "200"}


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env=ENV)


def assert_refused(res: Any, code: str) -> None:
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(code), res.stderr
    assert "Traceback" not in res.output and res.stdout == ""


# -- limit --------------------------------------------------------------------------------


def test_limit_writes_and_prints(tmp_path: Path) -> None:
    _engine(tmp_path, engine="e1", floor_bytes=None)
    res = run("limit", str(tmp_path), "24GiB", "--cache", "2GiB")
    assert res.exit_code == 0, res.output
    got = read_limit(tmp_path)
    assert isinstance(got, LimitRequest)
    assert (got.limit_bytes, got.cache_limit_bytes) == (24 << 30, 2 << 30)
    assert "limit.json" in res.stdout and "24.00 GiB (25769803776 B)" in res.stdout
    assert "cache limit 2.00 GiB" in res.stdout and "(e1 rank 0)" in res.stdout


def test_limit_without_cache_and_cache_zero(tmp_path: Path) -> None:
    _engine(tmp_path, floor_bytes=None)
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
    _engine(tmp_path, floor_bytes=None)
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
    assert "1.00 MiB" in out and "512 MiB" in out and "12.5 ms" in out  # mapped, limit, time
    assert "cache lim" in out and "51.0 MiB" in out  # the cache limit
    assert "stale" not in out and "\x1b" not in out  # NO_COLOR: no escapes


def test_top_marks_stale_but_not_closed(tmp_path: Path) -> None:
    old = time.time() - 60
    write_stats(tmp_path, make_stats(rank=0, time=old))
    write_stats(tmp_path, make_stats(rank=1, time=old, state="closed"))
    res = run("top", str(tmp_path), "--once")
    assert res.exit_code == 0 and res.stdout.count("stale 6") == 1
    data = json.loads(run("top", str(tmp_path), "--json").stdout)
    assert [d["stale"] for d in data] == [True, False]
    assert [d["status"] for d in data] == ["stale", "closed"]


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
    for args in (["--once"], ["--json"], ["--html", str(tmp_path / "p.html")]):
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
    assert len(reads) == 3  # the start check (also the first frame) and two refreshes
    assert "7.00 MiB" in res.stdout and "host:e2" in res.stdout


def test_top_escapes_and_bounds_document_text(tmp_path: Path) -> None:
    engine = "evil\x1b[31m" + "x" * 400
    write_stats(tmp_path, make_stats(engine=engine, time=time.time()))
    res = run("top", str(tmp_path), "--once")
    assert res.exit_code == 0 and "\x1b[" not in res.stdout
    assert "evil\\x1b[31m" in res.stdout and "x" * 400 not in res.stdout
    data = json.loads(run("top", str(tmp_path), "--json").stdout)
    assert data[0]["engine"] == engine  # JSON keeps the exact value, escaped as JSON


# -- liveness, widths, units, waiting ---------------------------------------------------------


def test_an_idle_engine_is_not_stale_within_three_heartbeats(tmp_path: Path) -> None:
    write_stats(tmp_path, make_stats(rank=0, time=time.time() - 5.0))  # was "stale" at 5 s
    write_stats(tmp_path, make_stats(rank=1, time=time.time() - 7.0))
    data = json.loads(run("top", str(tmp_path), "--json").stdout)
    assert [d["status"] for d in data] == ["running", "stale"]


def test_a_dead_engine_on_this_host_is_shown_dead(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    from kvplan.elastic.status import pid_namespace

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    here = {"host": socket.gethostname(), "pid_namespace": pid_namespace()}
    write_stats(tmp_path, make_stats(rank=0, time=time.time(), pid=child.pid, **here))
    write_stats(tmp_path, make_stats(rank=1, time=time.time(), pid=os.getpid(), **here))
    res = run("top", str(tmp_path), "--once")
    assert res.exit_code == 0, res.output
    assert "dead" in res.stdout and f"pid {child.pid} is gone" in res.stdout
    data = json.loads(run("top", str(tmp_path), "--json").stdout)
    assert [(d["status"], d["alive"]) for d in data] == [("dead", False), ("running", True)]


@pytest.mark.parametrize("columns", [100, 80])
def test_the_table_fits_the_terminal(tmp_path: Path, columns: int) -> None:
    now = time.time()
    for rank in range(3):
        write_stats(
            tmp_path,
            make_stats(
                engine="an-engine-with-a-rather-long-name",
                rank=rank,
                time=now,
                mapped_bytes=(23 << 30) + rank,
                limit_bytes=24 << 30,
                map_seconds=312.5,
                maps=1_234_567,
                floor_bytes=640 << 10,
                asked_limit_bytes=24 << 30,
            ),
        )
    res = CliRunner().invoke(
        app, ["top", str(tmp_path), "--once"], env={"NO_COLOR": "1", "COLUMNS": str(columns)}
    )
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns
    header = next(line for line in lines if line.startswith("engine"))
    kept = header.split()
    assert {"rank", "state", "mapped", "limit", "live", "cached"} <= set(kept)
    assert "…" not in res.stdout  # no cell is cut by the table (engine names are cut " ... ")
    assert "23.0 GiB" in res.stdout and "24.0 GiB" in res.stdout
    assert "not shown at this width:" in res.stdout and "--json has every field" in res.stdout
    if columns == 100:
        assert "cache" in kept and "51.0 MiB" in res.stdout


def test_map_time_units() -> None:
    assert elastic_cmd.human_seconds(0.000412) == "412 µs"
    assert elastic_cmd.human_seconds(0.0125) == "12.5 ms"
    assert elastic_cmd.human_seconds(1.25) == "1.25 s"
    assert elastic_cmd.human_seconds(312.5) == "312 s"
    assert elastic_cmd.short_bytes(640 << 10) == "640 KiB"
    assert elastic_cmd.short_bytes(1073725440) == "1.00 GiB"
    assert elastic_cmd.short_bytes(999) == "999 B"


def test_top_shows_the_limit_in_force_and_asked(tmp_path: Path) -> None:
    write_stats(
        tmp_path,
        make_stats(
            time=time.time(), limit_bytes=640 << 10, floor_bytes=640 << 10, asked_limit_bytes=1024
        ),
    )
    res = run("top", str(tmp_path), "--once")
    assert res.exit_code == 0
    assert "asked" in res.stdout and "1.00 KiB<" in res.stdout
    assert "asked 1.00 KiB, below its floor 640 KiB; in force: 640 KiB" in res.stdout
    (row,) = json.loads(run("top", str(tmp_path), "--json").stdout)
    assert row["limit_bytes"] == 640 << 10 and row["asked_limit_bytes"] == 1024
    assert row["floor_bytes"] == 640 << 10 and row["limit_raised_to_floor"] is True
    assert row["mapped_runs"] is None and row["mapped_runs_unit"] == 1


def test_live_mode_waits_for_the_first_stats_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeps: list[float] = []

    def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:  # the engine binds while top waits
            write_stats(tmp_path, make_stats(time=time.time(), mapped_bytes=3 << 20))
        if len(sleeps) == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(elastic_cmd.time, "sleep", fake_sleep)
    res = run("top", str(tmp_path), "--interval", "0.5")
    assert res.exit_code == 0, res.output
    assert "waiting for rank<N>.stats.json files" in res.stderr and "Ctrl-C" in res.stderr
    assert "3.00 MiB" in res.stdout


def test_ctrl_c_while_waiting_is_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_sleep(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(elastic_cmd.time, "sleep", fake_sleep)
    res = run("top", str(tmp_path))
    assert res.exit_code == 1 and "waiting for" in res.stderr and res.stdout == ""


# -- limit against the engines' floors --------------------------------------------------------


def _engine(directory: Path, rank: int = 0, **changes: Any) -> None:
    values: dict[str, Any] = {"time": time.time(), "floor_bytes": 640 << 10, "rank": rank}
    values.update(changes)
    write_stats(directory, make_stats(**values))


def test_limit_below_an_engines_floor_is_written_and_said(tmp_path: Path) -> None:
    _engine(tmp_path, engine="e1")
    res = run("limit", str(tmp_path), "1KiB")
    assert res.exit_code == 1, res.output  # written, but not in force as asked
    got = read_limit(tmp_path)
    assert isinstance(got, LimitRequest) and got.limit_bytes == 1024
    assert "limit 1.00 KiB" in res.stdout
    assert res.stderr.startswith("KVP427 warning")
    assert "floor of e1 rank 0, 640.00 KiB" in res.stderr and "raises the limit" in res.stderr
    res = run("limit", str(tmp_path), "640KiB")
    assert res.exit_code == 0 and res.stderr == ""


def test_limit_json_lists_each_engine(tmp_path: Path) -> None:
    _engine(tmp_path, rank=0)
    _engine(tmp_path, rank=1, floor_bytes=None)  # an older writer: floor unknown
    _engine(tmp_path, rank=2, state="closed")  # gone: not watching
    (tmp_path / "sub").mkdir()
    _engine(tmp_path / "sub", floor_bytes=1 << 40)  # another engine's directory, below DIR
    res = run("limit", str(tmp_path), "4KiB", "--json")
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert data["limit_bytes"] == 4096 and data["below_floor"] is True
    assert [(e["rank"], e["status"], e["floor_bytes"]) for e in data["engines"]] == [
        (0, "running", 640 << 10),
        (1, "running", None),
        (2, "closed", 640 << 10),
        (0, "running", 1 << 40),
    ]
    assert [e["limit_in_force_bytes"] for e in data["engines"]] == [
        640 << 10, 4096, None, 1 << 40,
    ]  # fmt: skip
    assert data["paths"] == [str(tmp_path / "limit.json"), str(tmp_path / "sub" / "limit.json")]
    assert res.stderr.count("KVP427") == 2


def test_limit_without_engines_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    res = run("limit", str(tmp_path), "1KiB", "--json")
    assert_refused(res, "KVP429")
    assert "--group" in res.stderr and "KVPLAN_DUMP_DIR" in res.stderr
    assert "wrote" not in res.output and list(tmp_path.iterdir()) == []
    (tmp_path / "e1").mkdir()
    (tmp_path / "e1" / "rank0.stats.json").write_text("{")  # not an engine's stats
    res = run("limit", str(tmp_path), "1KiB")
    assert_refused(res, "KVP429")
    assert "KVP416" in res.stderr and not (tmp_path / "e1" / "limit.json").exists()


def test_limit_applies_to_every_engine_top_shows(tmp_path: Path) -> None:
    """The docs' layout: one dump directory per engine below a common DIR (``top DIR``)."""
    for name in ("llama", "gemma"):
        (tmp_path / name).mkdir()
        _engine(tmp_path / name, engine=name, floor_bytes=1 << 20)
    (tmp_path / "gemma" / "tp").mkdir()
    _engine(tmp_path / "gemma" / "tp", engine="gemma-tp", rank=1, state="closed")
    (tmp_path / "notes").mkdir()  # no engine: nothing written there
    res = run("limit", str(tmp_path), "24GiB", "--cache", "2GiB")
    assert res.exit_code == 0, res.output
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("limit.json"))
    assert written == [Path("gemma/limit.json"), Path("gemma/tp/limit.json"),
                       Path("llama/limit.json")]  # fmt: skip
    for folder in ("llama", "gemma", "gemma/tp"):
        got = read_limit(tmp_path / folder)
        assert isinstance(got, LimitRequest)
        assert (got.limit_bytes, got.cache_limit_bytes) == (24 << 30, 2 << 30)
    assert not (tmp_path / "limit.json").exists()
    lines = res.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("wrote ") for line in lines)
    assert "(llama rank 0)" in res.stdout and "(gemma-tp rank 1)" in res.stdout
    res = run("limit", str(tmp_path), "512KiB", "--json")
    assert res.exit_code == 1, res.output  # below both running engines' floors
    data = json.loads(res.stdout)
    assert sorted(Path(p).relative_to(tmp_path) for p in data["paths"]) == written
    assert {e["engine"]: Path(e["limit_path"]).parent.name for e in data["engines"]} == {
        "gemma": "gemma", "gemma-tp": "tp", "llama": "llama",
    }  # fmt: skip
    assert res.stderr.count("KVP427") == 2


def test_limit_refuses_a_planted_limit_file_before_writing_any(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        _engine(tmp_path / name, engine=name)
    os.symlink(tmp_path / "elsewhere", tmp_path / "b" / "limit.json")
    assert_refused(run("limit", str(tmp_path), "24GiB"), "KVP023")
    assert not (tmp_path / "a" / "limit.json").exists()
    assert not (tmp_path / "elsewhere").exists()


# -- groups (KVPLAN_GROUP) ----------------------------------------------------------------


def test_a_guarantee_for_a_group_that_does_not_exist_is_refused_and_creates_nothing(
    tmp_path: Path,
) -> None:
    group = tmp_path / "group"
    assert_refused(run("limit", "--group", str(group), "--member", "a", "1MiB"), "KVP540")
    assert not group.exists()


def test_limit_group_creates_changes_and_refuses_a_budget_below_the_guarantees(
    tmp_path: Path,
) -> None:
    from kvplan.elastic.group import GroupMember, read_snapshot

    group = tmp_path / "group"
    made = run("limit", "--group", str(group), "64MiB")
    assert made.exit_code == 0, made.output
    assert "budget now 64.00 MiB" in made.stdout
    member = GroupMember.join(group, "a", floor=1 << 20, ceiling=1 << 30, guarantee=8 << 20)
    try:
        # a group directory is recognised without --group; --member sets a guarantee
        res = run("limit", str(group), "--member", "a", "16MiB", "--json")
        assert res.exit_code == 0, res.output
        snap = json.loads(res.stdout)
        assert snap["budget_bytes"] == 64 << 20
        assert [m["guarantee_bytes"] for m in snap["members"]] == [16 << 20]
        assert_refused(run("limit", str(group), "8MiB"), "KVP542")  # below Σ guarantees
        assert read_snapshot(group).budget_bytes == 64 << 20  # unchanged
        assert_refused(run("limit", str(group), "32MiB", "--cache", "1MiB"), "KVP406")
    finally:
        member.leave()


def test_a_guarantee_set_by_an_operator_survives_the_members_restart(tmp_path: Path) -> None:
    """Kept in the ledger by member name: a restarted member rejoins with it, not its floor,
    until --clear; a guarantee for a name that is not a member now waits for its join."""
    from kvplan.elastic.group import GroupMember, read_snapshot

    group = tmp_path / "group"
    assert run("limit", "--group", str(group), "64MiB").exit_code == 0
    floor = 1 << 20

    def join() -> GroupMember:
        return GroupMember.join(group, "gemma", floor=floor, ceiling=1 << 30)

    member = join()
    assert member.guarantee == floor
    res = run("limit", "--group", str(group), "--member", "gemma", "12MiB")
    assert res.exit_code == 0, res.output
    assert "kept across gemma's restarts" in res.stdout and "--clear" in res.stdout
    member.leave()  # the server stops...
    assert read_snapshot(group).kept_guarantees == {"gemma": 12 << 20}
    member = join()  # ...and starts again under its name
    assert member.guarantee == 12 << 20
    table = run("top", str(group), "--once")
    assert "kept guarantees: gemma 12.00 MiB" in table.stdout, table.stdout
    res = run("limit", "--group", str(group), "--member", "gemma", "--clear")
    assert res.exit_code == 0, res.output
    assert "cleared" in res.stdout and "until it restarts" in res.stdout
    assert member.guarantee == 12 << 20  # live: kept until it restarts
    member.leave()
    member = join()
    assert member.guarantee == floor and read_snapshot(group).kept_guarantees == {}
    member.leave()
    res = run("limit", "--group", str(group), "--member", "gemma", "--clear")
    assert res.exit_code == 0 and "no guarantee was kept for gemma" in res.stdout
    # not a member now: kept for its join, which may then be refused as any join
    res = run("limit", "--group", str(group), "--member", "llama", "64MiB")
    assert res.exit_code == 0 and "gets it when it joins" in res.stdout, res.output
    first = join()
    with pytest.raises(KVPlanError) as refused:
        GroupMember.join(group, "llama", floor=8 << 20, ceiling=1 << 30)
    assert refused.value.code.value == "KVP542" and "--clear" in str(refused.value)
    first.leave()
    assert_refused(run("limit", "--group", str(group), "--clear"), "KVP406")
    assert_refused(
        run("limit", "--group", str(group), "--member", "a", "1MiB", "--clear"), "KVP406"
    )
    assert_refused(run("limit", "--group", str(group), "--member", "a b", "1MiB"), "KVP547")
    assert_refused(run("limit", str(group)), "KVP406")


def test_top_shows_the_group_of_its_engines_and_a_group_directory(tmp_path: Path) -> None:
    from kvplan.elastic.group import GroupMember, set_budget

    group = tmp_path / "group"
    group.mkdir()
    set_budget(group, 64 << 20, create=True)
    a = GroupMember.join(group, "a", floor=1 << 20, ceiling=1 << 30, initial=4 << 20)
    try:
        dumps = tmp_path / "dumps" / "a"
        dumps.mkdir(parents=True)
        stats = make_stats(time=time.time(), group=str(group), group_member="a")
        write_stats(dumps, stats)
        res = run("top", str(tmp_path / "dumps"), "--json")
        assert res.exit_code == 0, res.output
        (row,) = json.loads(res.stdout)
        view = row["group_view"]
        assert view["member"] == "a" and view["budget_bytes"] == 64 << 20
        assert view["granted_bytes"] >= 4 << 20 and view["liveness"] == "alive"
        table = run("top", str(tmp_path / "dumps"), "--once")
        assert table.exit_code == 0, table.output
        assert "budget 64.00 MiB" in table.stdout and "guarantee" in table.stdout
        alone = run("top", str(group), "--json")  # a group directory with no stats under it
        assert alone.exit_code == 0, alone.output
        assert [m["name"] for m in json.loads(alone.stdout)["members"]] == ["a"]
    finally:
        a.leave()


def test_top_limit_column_shows_the_limit_in_force_group_cap_included(tmp_path: Path) -> None:
    """An engine in a group is capped by its effective limit there (its guarantee plus what it
    may borrow now); the engine table's limit column shows the lower of the two, marked, at
    100 columns, and a note names both."""
    from kvplan.elastic.group import GroupMember, read_snapshot, set_budget

    group = tmp_path / "group"
    group.mkdir()
    set_budget(group, 8 << 20, create=True)
    a = GroupMember.join(group, "a", floor=1 << 20, ceiling=8 << 20, guarantee=4 << 20)
    b = GroupMember.join(group, "b", floor=1 << 20, ceiling=8 << 20, guarantee=4 << 20)
    try:
        a.request(7 << 20)  # a borrows b's idle share
        b.request(4 << 20)  # b claims its guarantee: a owes it back
        cap = {m.name: m.effective_limit_bytes for m in read_snapshot(group).members}
        assert cap["a"] < 8 << 20
        now = time.time()
        for name in ("a", "b"):
            dump = tmp_path / "dumps" / name
            dump.mkdir(parents=True)
            write_stats(
                dump,
                make_stats(
                    engine=f"engine-{name}", time=now, limit_bytes=8 << 20,
                    group=str(group), group_member=name,
                ),
            )  # fmt: skip
        res = CliRunner().invoke(
            app,
            ["top", str(tmp_path / "dumps"), "--once"],
            env={"NO_COLOR": "1", "COLUMNS": "100"},
        )
        assert res.exit_code == 0, res.output
        lines = res.stdout.splitlines()
        assert max(len(line) for line in lines) <= 100, res.stdout
        header = next(line for line in lines if line.startswith("engine"))
        at = header.index("limit") + len("limit")  # the column is right-aligned
        rows = {line.split()[0]: line for line in lines if " running " in line}
        shown = {name: rows[f"engine-{name}"][:at].split()[-2:] for name in ("a", "b")}
        want = {n: elastic_cmd.short_bytes(min(8 << 20, cap[n])).split() for n in ("a", "b")}
        want = {n: [v[0], v[1] + ("*" if cap[n] < 8 << 20 else "")] for n, v in want.items()}
        assert shown == want, res.stdout
        assert (
            f"engine-a rank 0: limit* in force {elastic_cmd.short_bytes(cap['a'])}, its "
            "grant in its group now (its own limit 8.00 MiB)" in res.stdout
        )
        assert "not a cap: it grows on request while the group's budget has free bytes" in (
            " ".join(res.stdout.split())
        )
        (row_a, row_b) = json.loads(run("top", str(tmp_path / "dumps"), "--json").stdout)
        assert row_a["limit_bytes"] == 8 << 20  # the engine's own, as its stats file says
        assert row_a["limit_in_force_bytes"] == cap["a"]
        assert row_b["limit_in_force_bytes"] == min(8 << 20, cap["b"])
    finally:
        a.leave()
        b.leave()
