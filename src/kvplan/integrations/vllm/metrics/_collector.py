"""What an engine's dump directory says now, as samples of :data:`~._catalog.METRICS`.

Read at scrape time in the API server's process (or by the multiprocess mirror's thread):
the stats files the workers' reporter threads already write, the group snapshot (read
without the group's lock), and for eager engines the plan each rank dumped. Nothing here
reaches the engine core or a worker, so a scrape costs no step.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvplan.elastic.files import MAX_FILE_BYTES
from kvplan.integrations.vllm.metrics._catalog import METRICS, STATUSES, Metric, metric
from kvplan.schemas.errors import printable

logger = logging.getLogger("vllm.kvplan")

_STATS_NAME = re.compile(r"rank(0|[1-9][0-9]{0,8})\.stats\.json")
_PLAN_NAME = re.compile(r"rank(0|[1-9][0-9]{0,8})\.plan\.json")
"""A rank's files, the rank written as the writers write it (no leading zero: one name per
rank). The name is where a file's rank is taken from; a stats document that says another
rank is refused."""
PLAN_SLACK_SECONDS = 1.0
"""A stats snapshot older than its rank's plan by more than this is from an earlier run (the
plan is dumped at bind, the first snapshot right after): that rank is shown from its plan."""
MAX_ENTRIES = 4096
"""Most entries of a dump directory looked at per scrape (rank 0's files are looked up by
name besides, so no number of other entries hides them)."""
MAX_RANKS = 1024
"""Most ``rank`` label values per engine, stats files and plans together: the lowest ranks."""
MAX_PLAN_BYTES = 1 << 20
"""Largest plan file read (1 MiB; a real plan is tens of KiB): a larger one is named once in
the log and not read again while it is unchanged."""
SCRAPE_BYTES = 4 << 20
"""Bytes of files read per scrape, every engine together. Files unchanged since the scrape
that read them cost nothing (their figures, or their failure, are kept by file stamp); past
the budget the rest wait for the next scrape, lowest ranks first."""
SCRAPE_FILES = 128
"""Files read per scrape, every engine together (unchanged ones are not read: see
:data:`SCRAPE_BYTES`)."""
MAX_WARNINGS = 4096
"""Distinct problems logged per process; past it one line says the rest are not."""


@dataclass(frozen=True)
class EngineSource:
    """One engine the API server serves: vLLM's labels and kvplan's dump directory."""

    model_name: str
    engine: str
    dump_dir: Path


@dataclass(frozen=True)
class Sample:
    """One labelled value; a histogram's ``value`` is ``(counts per bucket, sum)``."""

    metric: Metric
    labels: tuple[str, ...]
    value: Any


Stamp = tuple[int, int, int, int]


@dataclass
class _Cached:
    """What a file said at one stamp: a stats snapshot, a plan's reserved bytes, or
    ``None`` (it could not be used: said once, not read again until it changes)."""

    stamp: Stamp
    value: Any


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class Reader:
    """Reads the dump directories of its sources, within bounds per scrape (entries looked
    at, rank label values, bytes read); keeps what it read of each file by file stamp,
    failures included, and says once per file what it could not use."""

    sources: list[EngineSource] = field(default_factory=list)
    _files: dict[Path, dict[str, _Cached]] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, source: EngineSource) -> None:
        """Serve ``source`` too. A dump directory is shown once, under the first engine
        index that names it (vLLM's data-parallel engines of one server share the
        environment, so their workers write into the same directory)."""
        with self._lock:
            if all(s.dump_dir != source.dump_dir for s in self.sources):
                self.sources.append(source)

    def samples(self, now: float | None = None) -> list[Sample]:
        with self._lock:
            sources = list(self.sources)
            when = time.time() if now is None else now
            budget = [SCRAPE_BYTES, SCRAPE_FILES]
            out: list[Sample] = []
            for source in sources:
                out.extend(self._engine(source, when, budget))
            return out

    def _warn(self, key: str, message: str) -> None:
        """Log ``message`` once per ``key``, through the one escaping rule (a file's text
        never reaches the log raw: no ESC sequence, no forged line)."""
        if key in self._warned:
            return
        if len(self._warned) >= MAX_WARNINGS:
            key, message = "\0full", "more problems than this are not logged"
            if key in self._warned:
                return
        self._warned.add(key)
        logger.warning("kvplan metrics: %s", printable(message, 600))

    # -- one engine ---------------------------------------------------------------------------
    def _engine(self, source: EngineSource, now: float, budget: list[int]) -> Iterator[Sample]:
        directory = source.dump_dir
        listing = self._list(directory)
        if listing is None:
            return
        old = self._files.get(directory, {})
        kept: dict[str, _Cached] = {}
        self._files[directory] = kept
        stats: dict[int, Any] = {}
        plans: dict[int, tuple[float, int]] = {}
        for rank in sorted(listing)[:MAX_RANKS]:
            for name, st in listing[rank]:
                value = self._read(directory, name, st, rank, old, kept, budget)
                if value is None:
                    continue
                if name.endswith(".plan.json"):
                    plans[rank] = (st.st_mtime, value)
                else:
                    stats[rank] = value
        if len(listing) > MAX_RANKS:
            self._warn(
                f"ranks:{directory}",
                f"{directory} holds files of {len(listing)} ranks; the series of the "
                f"lowest {MAX_RANKS} are shown",
            )
        group_done = False
        for rank in sorted(set(stats) | set(plans)):
            labels = (source.model_name, source.engine, str(rank))
            snap = stats.get(rank)
            plan = plans.get(rank)
            if snap is None or (plan is not None and plan[0] > snap.time + PLAN_SLACK_SECONDS):
                if plan is not None:
                    yield Sample(metric("kvplan_kv_reserved_bytes"), labels, plan[1])
                continue
            yield from stats_samples(snap, labels, now)
            if not group_done and snap.group is not None and snap.group_member is not None:
                group_done = True  # one member stands for all its ranks
                yield from self._group(source, snap.group, snap.group_member)

    def _list(self, directory: Path) -> dict[int, list[tuple[str, os.stat_result]]] | None:
        """``{rank: [(file name, lstat)]}`` of the directory's own regular stats and plan
        files (no subdirectory), at most :data:`MAX_ENTRIES` entries looked at, rank 0's
        looked up by name besides; ``None`` when the directory cannot be listed."""
        found: dict[int, list[tuple[str, os.stat_result]]] = {}
        seen: set[str] = set()

        def note(name: str, st: os.stat_result | None) -> None:
            match = _STATS_NAME.fullmatch(name) or _PLAN_NAME.fullmatch(name)
            if match is None or name in seen or st is None or not stat.S_ISREG(st.st_mode):
                return
            seen.add(name)
            found.setdefault(int(match.group(1)), []).append((name, st))

        for name in ("rank0.stats.json", "rank0.plan.json"):
            note(name, _lstat(directory / name))
        try:
            with os.scandir(directory) as entries:
                for i, entry in enumerate(entries):
                    if i >= MAX_ENTRIES:
                        self._warn(
                            f"entries:{directory}",
                            f"{directory} holds more than {MAX_ENTRIES} entries; only the "
                            "first are looked at (rank 0's files always)",
                        )
                        break
                    if entry.name not in seen and (
                        _STATS_NAME.fullmatch(entry.name) or _PLAN_NAME.fullmatch(entry.name)
                    ):
                        note(entry.name, _lstat(Path(entry.path)))
        except (OSError, ValueError):
            return found or None
        return found

    def _read(
        self,
        directory: Path,
        name: str,
        st: os.stat_result,
        rank: int,
        old: dict[str, _Cached],
        kept: dict[str, _Cached],
        budget: list[int],
    ) -> Any:
        """The file's stats snapshot or plan's reserved bytes (``None``: unusable, or left
        for a later scrape past the byte budget)."""
        stamp = _stamp(st)
        cached = old.get(name)
        if cached is not None and cached.stamp == stamp:
            kept[name] = cached
            return cached.value
        path = directory / name
        plan = name.endswith(".plan.json")
        largest = MAX_PLAN_BYTES if plan else MAX_FILE_BYTES
        if st.st_size > largest:  # refused by its size alone: not read
            self._warn(str(path), f"{path}: larger than {largest} bytes, not read")
            kept[name] = _Cached(stamp, None)
            return None
        if st.st_size > budget[0] or budget[1] <= 0:
            if cached is not None:  # what it said before, until a scrape has the bytes
                kept[name] = cached
            self._warn(
                f"budget:{directory}",
                f"{directory}: more than {SCRAPE_BYTES} bytes or {SCRAPE_FILES} files changed "
                "since the last scrape; the rest are read at the next scrapes",
            )
            return None if cached is None else cached.value
        budget[0] -= st.st_size
        budget[1] -= 1
        value, problem = (
            _plan_reserved(path, directory) if plan else _stats_of(path, directory, rank)
        )
        if problem is not None:
            self._warn(str(path), problem)
        kept[name] = _Cached(stamp, value)
        return value

    def _group(self, source: EngineSource, directory: str, member: str) -> Iterator[Sample]:
        from kvplan.elastic.group import read_snapshot
        from kvplan.schemas.errors import KVPlanError

        try:
            snap = read_snapshot(directory)
        except (KVPlanError, OSError) as exc:
            self._warn(f"group:{directory}", f"group {directory}: {exc}")
            return
        labels = (source.model_name, source.engine, directory, member)
        yield Sample(metric("kvplan_group_budget_bytes"), labels, snap.budget_bytes)
        yield Sample(metric("kvplan_group_free_bytes"), labels, snap.free_bytes)
        mine = next((m for m in snap.members if m.name == member), None)
        if mine is None:  # not joined yet, or reaped: the group figures only
            return
        for name, value in (
            ("granted", mine.granted_bytes),
            ("charged", mine.charged_bytes),
            ("guarantee", mine.guarantee_bytes),
            ("borrowed", mine.borrowed_bytes),
            ("claim", mine.claim_bytes),
            ("owed", mine.owed_bytes),
            ("effective_limit", mine.effective_limit_bytes),
        ):
            yield Sample(metric(f"kvplan_group_{name}_bytes"), labels, value)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (OSError, ValueError):
        return None


def _stats_of(path: Path, directory: Path, rank: int) -> tuple[Any, str | None]:
    """``(snapshot, None)`` or ``(None, why not)``: the file as the one reader reads it (this
    user's or root's, no link), saying the rank its name says."""
    from kvplan.elastic.files import ElasticStats, read_stats

    item = read_stats(path, within=directory)
    if not isinstance(item, ElasticStats):
        return None, item.render()
    if item.rank != rank:
        return None, (
            f"{path} says rank {item.rank} but is named for rank {rank}; a rank's figures come "
            "from its own file only"
        )
    return item, None


def _plan_reserved(path: Path, directory: Path) -> tuple[Any, str | None]:
    """``(reserved bytes, None)`` or ``(None, why not)`` of one plan file."""
    from kvplan.schemas.errors import KVPlanError
    from kvplan.schemas.loading import decode_text, parse_plan, parse_text, read_bytes

    name = str(path)
    try:
        raw = read_bytes(path, limit=MAX_PLAN_BYTES, within=directory, own=True)
        plan = parse_plan(parse_text(decode_text(raw, name), name), name)
    except KVPlanError as exc:
        return None, exc.diagnostics[0].render()
    except OSError as exc:
        return None, f"{path}: {exc}"
    return sum(p.size_bytes for p in plan.pools), None


_GAUGE_FIELDS = (
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
)
"""Series that are one stats field each (``None`` fields are left out)."""


def stats_samples(snap: Any, labels: tuple[str, ...], now: float) -> Iterator[Sample]:
    """The per-rank series of one :class:`~kvplan.elastic.files.ElasticStats` snapshot."""
    from kvplan.elastic.files import STEP_SECONDS_BUCKETS
    from kvplan.elastic.status import engine_status

    for name, attr in _GAUGE_FIELDS:
        value = getattr(snap, attr)
        if value is not None:
            yield Sample(metric(name), labels, value)
    yield Sample(metric("kvplan_kv_snapshot_age_seconds"), labels, max(0.0, now - snap.time))
    status = engine_status(snap, now).status
    for each in STATUSES:
        yield Sample(metric("kvplan_kv_status"), (*labels, each), 1 if each == status else 0)
    empty = [0] * (len(STEP_SECONDS_BUCKETS) + 1)
    for kind in ("map", "unmap"):
        counts = getattr(snap, f"{kind}_seconds_buckets") or empty
        total = getattr(snap, f"{kind}_seconds")
        yield Sample(metric(f"kvplan_kv_{kind}_step_seconds"), labels, (list(counts), total))


def families(samples: Iterable[Sample]) -> list[Any]:
    """The samples as prometheus_client metric families, one per metric of
    :data:`METRICS` that has samples, in that order."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.utils import floatToGoString

    from kvplan.elastic.files import STEP_SECONDS_BUCKETS

    bounds = [floatToGoString(b) for b in STEP_SECONDS_BUCKETS] + ["+Inf"]
    made: dict[str, Any] = {}
    for sample in samples:
        m = sample.metric
        family = made.get(m.name)
        if family is None:
            kinds = {
                "gauge": GaugeMetricFamily,
                "counter": CounterMetricFamily,
                "histogram": HistogramMetricFamily,
            }
            family = made[m.name] = kinds[m.kind](m.family, m.help, labels=list(m.labels))
        if m.kind == "histogram":
            counts, total = sample.value
            running, buckets = 0, []
            for bound, count in zip(bounds, counts, strict=True):
                running += count
                buckets.append((bound, float(running)))
            family.add_metric(list(sample.labels), buckets, float(total))
        else:
            family.add_metric(list(sample.labels), float(sample.value))
    return [made[m.name] for m in METRICS if m.name in made]


def empty_families(names: Sequence[Metric] = METRICS) -> list[Any]:
    """One family without samples per metric (what a collector's ``describe`` returns)."""
    from prometheus_client.core import Metric as PromMetric

    return [PromMetric(m.family, m.help, m.kind) for m in names]


class KVPlanCollector:
    """A prometheus_client collector over a :class:`Reader` (registered in vLLM's registry
    by the stat logger; every ``collect`` reads the files anew)."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def describe(self) -> list[Any]:
        return empty_families()

    def collect(self) -> list[Any]:
        try:
            return families(self.reader.samples())
        except Exception as exc:  # a scrape must not fail for kvplan's figures
            self.reader._warn("collect", f"cannot collect kvplan's figures: {exc!r}")
            return []
