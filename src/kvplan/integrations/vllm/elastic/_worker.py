"""A worker's elastic cache: it applies the scheduler's operations first thing in each step,
keeps the figures, and has its stats written (``_stats``). Workers never decide what to map."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvplan.integrations.vllm.elastic import _refusals as refusals
from kvplan.integrations.vllm.elastic._ops import (
    SCHEDULER_FIGURES,
    ElasticOps,
    MapFailed,
    geometry_digest,
)
from kvplan.integrations.vllm.elastic._settings import ElasticSettings, default_limits
from kvplan.integrations.vllm.elastic._stats import (
    EXIT_WRITE_SECONDS,
    StatsReporter,
    count_step,
    engine_name,
    forget_exit_hook,
    on_exit_signal,
)
from kvplan.schemas.errors import KVPlanError

if TYPE_CHECKING:
    from kvplan.executor import BoundKVCache

logger = logging.getLogger("vllm.kvplan")


@dataclass
class WorkerSide:
    """One worker's elastic cache: applies the scheduler's operations, keeps the figures."""

    cache: BoundKVCache
    label: str
    settings: ElasticSettings
    dump_dir: Path | None
    digest: str
    backend: str
    count: Counter[str] = field(default_factory=Counter)
    """``maps`` / ``unmaps`` (chunks; ``ahead_maps``: of ``maps``, those mapped ahead of need,
    outside a step), ``failed_maps``, ``rollbacks`` (chunks a failed map
    mapped and unmapped again: not unmaps, no block used them), ``steps`` (with operations),
    ``map_calls`` (steps that mapped), ``ahead_calls`` (maps sent while the engine idled),
    ``busy_ahead_calls`` (maps ahead of a busy engine, on the mapping thread)."""
    seconds: dict[str, float] = field(default_factory=lambda: {"map": 0.0, "unmap": 0.0})
    """Time spent mapping (``map``) and unmapping (``unmap``)."""
    step_counts: dict[str, list[int]] = field(default_factory=dict)
    """Steps that mapped (``map``) / unmapped (``unmap``) by duration (:func:`count_step`)."""
    scheduler: dict[str, int | None] = field(default_factory=dict)
    """What the scheduler last said: ``live_blocks``, ``cached_blocks``, ``limit_bytes``,
    ``cache_limit_bytes``, ``reserve_bytes``."""
    peak_mapped_bytes: int = 0
    checked: bool = False
    group_member: str | None = None
    """The engine's member name in ``KVPLAN_GROUP`` (stats only)."""
    state: Literal["bound", "running", "closed"] = "bound"
    pending_report: Any = None
    """A failed map's ``MapFailureReport`` this worker's next step output must carry to the
    scheduler (``_recovery``)."""
    step_blocks: tuple[int, ...] = ()
    """What the last operations made resident: their maps and the blocks mapped ahead that
    they joined (``ElasticOps.joins``) -- what every rank releases when any rank failed; the
    same on every rank (they all received the same operations)."""
    _reporter: StatsReporter | None = None
    _ahead: tuple[tuple[int, ...], Future[KVPlanError | None]] | None = None
    """The blocks being mapped ahead, and the mapping's outcome (its error, if it failed)."""
    _mapper: ThreadPoolExecutor | None = None
    _fail_retry: bool = False
    """``KVPLAN_DEBUG_FAIL_MAP`` failed a map ahead: its retry fails too."""

    def apply(self, ops: ElasticOps, *, between_steps: bool = False) -> None:
        """Join the map ahead of the last operations, then unmap, then map, ``ops``
        (``MapFailed`` after a rolled-back map). A map ahead that failed (rolled back) is
        mapped again with ``ops.map``; when that fails, every block of :attr:`step_blocks`
        is released here (and on every rank: ``agree_across_ranks``, or the idle engine's
        undo). ``ops.ahead`` is not started here: :meth:`start_ahead`, once the ranks agreed.
        ``between_steps``: sent while the engine idles (``apply_between_steps``), not by a
        step. The test-only ``KVPLAN_DEBUG_FAIL_MAP`` counts the maps of steps (a busy
        engine's maps ahead included), not an idle engine's maps ahead (no request's concern);
        ``KVPLAN_DEBUG_SKIP_MAP`` counts every map (a block mapped ahead and left unbacked is
        used by a later step)."""
        joined, ahead_error = self.join_ahead()
        fail_retry, self._fail_retry = self._fail_retry, False
        if not self.checked:
            if ops.digest != self.digest:
                raise refusals.elastic_geometry(self.label, ops.digest, self.digest)
            self.checked = True
        cache = self.cache
        if ops.unmap:
            before = sum(cache.mapped_chunks.values())
            t0 = time.perf_counter()
            cache.release_blocks(ops.unmap)
            self.seconds["unmap"] += count_step(self.step_counts, "unmap", t0)
            self.count["unmaps"] += before - sum(cache.mapped_chunks.values())
        joined = ops.joins(joined)
        self.step_blocks = ops.map + joined
        blocks = ops.map
        if ahead_error is not None and joined:  # mapped again, with the step's own
            blocks = self.step_blocks
        failed: MapFailed | None = None
        if blocks:
            self.count["ahead_calls" if between_steps else "map_calls"] += 1
            blocks = self._skipped(blocks)
            inject = not between_steps and (self._injected() or fail_retry)
            t0 = time.perf_counter()
            try:
                error = self._counted_map(blocks, inject, ahead=between_steps)
            finally:
                self.seconds["map"] += count_step(self.step_counts, "map", t0)
            if error is not None:  # rolled back: none of ``blocks`` became resident
                if joined and ahead_error is None:  # mapped ahead: released as well
                    mapped = sum(cache.mapped_chunks.values())
                    cache.release_blocks(joined)
                    self.count["rollbacks"] += mapped - sum(cache.mapped_chunks.values())
                failed = MapFailed(ops.seq, self.step_blocks, error)
        self.scheduler = {key: getattr(ops, key) for key in SCHEDULER_FIGURES}
        self.count["idle_ops" if between_steps else "steps"] += 1
        self.state = "running"
        self.touch()
        if failed is not None:
            raise failed

    # -- mapping ahead while busy (``docs/elastic.md``) ----------------------------------------
    def start_ahead(self, blocks: tuple[int, ...]) -> None:
        """Map ``blocks`` (a busy engine's ``ElasticOps.ahead``) on this worker's mapping
        thread while the step runs; :meth:`join_ahead` (the next :meth:`apply`) waits for it.
        The cache's own lock keeps its calls whole; no other call of this worker maps or
        unmaps before the join but an agreement's release, which runs before this starts."""
        if not blocks:
            return
        self.count["busy_ahead_calls"] += 1
        inject = self._injected()
        mapped = self._skipped(blocks)
        if self._mapper is None:
            self._mapper = ThreadPoolExecutor(1, thread_name_prefix=f"kvplan-ahead-{self.label}")
        self._ahead = (blocks, self._mapper.submit(self._map_ahead, mapped, inject))

    def join_ahead(self) -> tuple[tuple[int, ...], KVPlanError | None]:
        """Wait for the map ahead in flight: its blocks and, when it failed (rolled back: none
        of them resident), why. ``((), None)`` when none is."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return (), None
        blocks, outcome = ahead
        return blocks, outcome.result()

    def _map_ahead(self, blocks: tuple[int, ...], inject: bool) -> KVPlanError | None:
        t0 = time.perf_counter()
        try:
            error = self._counted_map(blocks, inject, ahead=True)
        finally:
            self.seconds["map"] += time.perf_counter() - t0
        self._fail_retry = inject and error is not None  # injected: its retry fails too
        return error

    def _counted_map(
        self, blocks: tuple[int, ...], inject: bool, *, ahead: bool
    ) -> KVPlanError | None:
        """Map ``blocks`` (``inject``: the test-only failure) and count it: the chunks mapped
        (``ahead``: as mapped ahead of need too), or the failure and its rollback. The error
        when it failed (rolled back: none of ``blocks`` resident), else ``None``."""
        cache = self.cache
        before = sum(cache.mapped_chunks.values())
        rolled = cache.rolled_back_chunks
        try:
            self._map(blocks, inject)
        except KVPlanError as exc:
            self.count["failed_maps"] += 1
            self.count["rollbacks"] += cache.rolled_back_chunks - rolled
            return exc
        made = sum(cache.mapped_chunks.values()) - before
        self.count["maps"] += made
        if ahead:
            self.count["ahead_maps"] += made
        return None

    def _injected(self) -> bool:
        """``KVPLAN_DEBUG_FAIL_MAP`` names the map being made (of a step, or ahead while
        busy)."""
        return self.settings.fail_map == self.count["map_calls"] + self.count["busy_ahead_calls"]

    def _skipped(self, blocks: tuple[int, ...]) -> tuple[int, ...]:
        """``blocks`` less the one ``KVPLAN_DEBUG_SKIP_MAP`` leaves unbacked when it names
        this map (test-only: the N-th map of any kind)."""
        every_map = sum(self.count[k] for k in ("map_calls", "ahead_calls", "busy_ahead_calls"))
        if self.settings.skip_map != every_map:
            return blocks
        droppable = [b for b in blocks if b != 0]
        if not droppable:
            return blocks
        # the first: a map ahead lists what vLLM hands out next first
        logger.warning(
            "kvplan: %s skips mapping block %d (KVPLAN_DEBUG_SKIP_MAP)", self.label, droppable[0]
        )
        return tuple(b for b in blocks if b != droppable[0])

    def _map(self, blocks: tuple[int, ...], inject: bool) -> None:
        cache = self.cache
        if not inject:
            cache.ensure_mapped(blocks)
            return
        # test-only fault injection: granting access fails (per chunk: after the chunks were
        # mapped; host-vmm's runs: the first run's call), the transaction rolls back what it
        # mapped -- as when the device runs out of memory mid-step
        from kvplan.executor.backends.faults import FaultyBackend

        logger.warning(
            "kvplan: %s fails map #%d on purpose (KVPLAN_DEBUG_FAIL_MAP)",
            self.label, self.count["map_calls"] + self.count["busy_ahead_calls"],
        )  # fmt: skip
        real = cache.backend
        cache.backend = FaultyBackend(real, fail_ops={"set_access", "map_run"})
        try:
            cache.ensure_mapped(blocks)
        finally:
            cache.backend = real

    def touch(self) -> None:
        """Figures changed: keep the peak, wake the reporter (it snapshots on its thread: every
        figure it reads is O(1) and read atomically, so a step never waits for it)."""
        mapped = self.cache.mapped_bytes
        if mapped > self.peak_mapped_bytes:
            self.peak_mapped_bytes = mapped
        if self._reporter is not None:
            self._reporter.changed()

    def snapshot(self) -> Any:
        from kvplan.elastic.files import ElasticStats, mapped_runs
        from kvplan.elastic.status import writer_identity

        cache = self.cache
        figures: dict[str, int | None] = {
            key: self.scheduler.get(key, 0) for key in SCHEDULER_FIGURES
        }
        figures["floor_bytes"] = self.scheduler.get("floor_bytes") or None  # 0: not known yet
        figures["asked_limit_bytes"] = self.scheduler.get("asked_limit_bytes")
        runs, unit = (None, 1) if cache.closed else mapped_runs(cache.mapped_chunk_ids())
        group = self.settings.group
        return ElasticStats(
            **writer_identity(),
            group=None if group is None else str(group.resolve()),
            group_member=self.group_member,
            plan_fingerprint=cache.plan.fingerprint,
            mapped_runs=runs,
            mapped_runs_unit=unit,
            engine=engine_name(self.dump_dir),
            rank=int(self.label.removeprefix("rank") or 0),
            pid=os.getpid(),
            time=time.time(),
            state=self.state,
            backend=self.backend,
            chunk_bytes=cache.chunk_bytes,
            num_blocks=cache.page_index.num_blocks,
            reserved_bytes=cache.reserved_bytes,
            mapped_bytes=0 if cache.closed else cache.mapped_bytes,
            peak_mapped_bytes=self.peak_mapped_bytes,
            **figures,
            **{
                key: self.count[key]
                for key in ("maps", "unmaps", "failed_maps", "rollbacks", "steps")
            },
            ahead_maps=self.count["ahead_maps"],
            map_seconds=round(self.seconds["map"], 6),
            unmap_seconds=round(self.seconds["unmap"], 6),
            **{f"{k}_seconds_buckets": list(n) for k, n in list(self.step_counts.items())},
        )

    def start_reporting(self) -> None:
        if self.dump_dir is not None:
            self._reporter = StatsReporter(self.dump_dir, self.snapshot)
            on_exit_signal(self.exiting)

    def exiting(self) -> None:
        """SIGTERM/SIGINT: write a ``closed`` snapshot now (if the process goes on after all,
        the next heartbeat writes its state again)."""
        reporter = self._reporter
        if reporter is None or self.state == "closed":
            return
        state, self.state = self.state, "closed"
        try:
            reporter._write(EXIT_WRITE_SECONDS)
        finally:
            self.state = state

    def closed(self) -> None:
        """The cache was closed (its lock waited for a map ahead in flight): one last
        snapshot; the mapping thread ends."""
        self.state = "closed"
        if self._mapper is not None:
            self._mapper.shutdown(wait=False)
        forget_exit_hook(self.exiting)
        if self._reporter is not None:
            self._reporter.stop()


def worker_side(
    cache: BoundKVCache,
    settings: ElasticSettings,
    *,
    dump_dir: Path | None,
    backend: str,
    label: str,
) -> WorkerSide:
    """The elastic state of a worker that just bound ``cache`` (null block mapped)."""
    from kvplan.elastic.ledger import Ledger

    ledger = Ledger(cache.plan, cache.chunk_bytes, cache.chunk_bytes)
    ledger.back([0])
    side = WorkerSide(
        cache=cache,
        label=label,
        settings=settings,
        dump_dir=dump_dir,
        digest=geometry_digest(ledger),
        backend=backend,
    )
    limit, cache_limit, reserve = default_limits(settings, ledger.reserved_bytes)
    side.scheduler = {
        "limit_bytes": limit,
        "cache_limit_bytes": cache_limit,
        "reserve_bytes": reserve,
        "asked_limit_bytes": settings.limit,
    }
    side.touch()
    return side


_WORKERS: dict[int, WorkerSide] = {}
_WORKERS_LOCK = threading.Lock()


def attach_worker(owner: Any, side: WorkerSide) -> None:
    """Register the elastic cache of runner ``owner`` (replacing an earlier one)."""
    with _WORKERS_LOCK:
        old = _WORKERS.pop(id(owner), None)
        _WORKERS[id(owner)] = side
    if old is not None and old is not side:
        old.closed()
    side.start_reporting()


def worker_of(owner: Any) -> WorkerSide | None:
    side = _WORKERS.get(id(owner))  # one dict read: atomic, no lock (writers hold it)
    if side is not None and side.cache.closed:
        return None
    return side


def detach_cache(cache: BoundKVCache) -> None:
    """The cache is being closed: final stats, forget its worker state."""
    with _WORKERS_LOCK:
        found = [k for k, s in _WORKERS.items() if s.cache is cache]
        sides = [_WORKERS.pop(k) for k in found]
    for side in sides:
        side.closed()


def apply_between_steps(worker: Any, ops: ElasticOps) -> str | None:
    """Apply ``ops`` on ``worker`` outside a step: what the engine core sends every rank
    through vLLM's ``collective_rpc`` while the engine idles -- unmaps of what it gives back,
    maps of the blocks it maps ahead (the rank runs it in its RPC order, so every step
    scheduled before it has run). ``None`` when done; the failure's first line when a map
    failed (rolled back: none of ``ops.map`` is resident here)."""
    side = worker_of(getattr(worker, "model_runner", None))
    if side is None:
        raise KVPlanError(
            refusals.elastic_unsupported(
                "this worker received elastic operations but bound no elastic KV cache"
            )
        )
    try:
        side.apply(ops, between_steps=True)
    except MapFailed as exc:
        return refusals.first_message(exc.error)
    return None


def close_for_shutdown(worker: Any) -> int:
    """The engine core is shutting down (its loop has stopped stepping): close this rank's
    elastic cache now -- unmapped, its last snapshot ``closed``, the group lease this process
    held let go -- so that the engine can leave its group before vLLM stops the worker
    process, which the OpenAI server's default shutdown does by killing it. Sent through
    ``collective_rpc``; the caches this rank closed (0 or 1)."""
    from kvplan.integrations.vllm.pipeline import release_owner

    owner = getattr(worker, "model_runner", None)
    if worker_of(owner) is None:
        return 0
    release_owner(owner)  # closed, then what the binding asked for after it (the lease)
    return 1
