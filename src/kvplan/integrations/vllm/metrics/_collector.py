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
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvplan.integrations.vllm.metrics._catalog import METRICS, STATUSES, Metric, metric

logger = logging.getLogger("vllm.kvplan")

_PLAN_NAME = re.compile(r"rank([0-9]{1,9})\.plan\.json")
PLAN_SLACK_SECONDS = 1.0
"""A stats snapshot older than its rank's plan by more than this is from an earlier run (the
plan is dumped at bind, the first snapshot right after): that rank is shown from its plan."""


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


@dataclass
class _PlanCache:
    stamp: tuple[int, int, int]
    reserved: int


@dataclass
class Reader:
    """Reads the dump directories of its sources; keeps what it parsed of plans (by file
    stamp) and says once per file what it could not read."""

    sources: list[EngineSource] = field(default_factory=list)
    _plans: dict[Path, _PlanCache] = field(default_factory=dict)
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
        out: list[Sample] = []
        for source in sources:
            out.extend(self._engine(source, when))
        return out

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("kvplan metrics: %s", message)

    # -- one engine ---------------------------------------------------------------------------
    def _engine(self, source: EngineSource, now: float) -> Iterator[Sample]:
        from kvplan.elastic.files import ElasticStats, read_stats_tree

        if not source.dump_dir.is_dir():
            return
        stats: dict[int, ElasticStats] = {}
        for path, item in read_stats_tree(source.dump_dir):
            if path.parent != source.dump_dir:
                continue
            if isinstance(item, ElasticStats):
                stats[item.rank] = item
            else:
                self._warn(str(path), item.render())
        plans = self._plans_of(source.dump_dir)
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

    def _plans_of(self, directory: Path) -> dict[int, tuple[float, int]]:
        """``{rank: (plan file mtime, reserved bytes)}`` of ``rank<N>.plan.json`` files."""
        from kvplan.schemas.errors import KVPlanError
        from kvplan.schemas.loading import load_plan

        found: dict[int, tuple[float, int]] = {}
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return found
        for entry in entries[:4096]:
            match = _PLAN_NAME.fullmatch(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            path = Path(entry.path)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            cached = self._plans.get(path)
            if cached is None or cached.stamp != stamp:
                try:
                    plan = load_plan(path, within=directory)
                except (KVPlanError, OSError) as exc:
                    self._warn(str(path), f"{path}: {exc}")
                    continue
                cached = _PlanCache(stamp, sum(p.size_bytes for p in plan.pools))
                self._plans[path] = cached
            found[int(match.group(1))] = (st.st_mtime, cached.reserved)
        return found

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
