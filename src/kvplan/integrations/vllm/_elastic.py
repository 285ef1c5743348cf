"""Elastic serving in vLLM: the scheduler decides, every worker maps, in step order.

Protocol (``docs/elastic.md``):

1. **Engine core** (one ``BlockPool`` per engine, global block ids). When the engine core
   forms the scheduler's config, kvplan keeps every rank's ``KVCacheConfig``; when the
   ``Scheduler`` is built, kvplan plans rank 0's config (the same pure planner the workers
   run), builds a :class:`~kvplan.elastic.ledger.Ledger` and turns the scheduler's block pool
   into an elastic one (its class is swapped for a subclass: same object, same managers).
   The pool then counts as free only the blocks it can back within ``KVPLAN_MEMORY_LIMIT``
   (``get_num_free_blocks``), so vLLM's own admission check makes requests wait or be
   preempted exactly as when it runs out of blocks; ``get_new_blocks`` hands out blocks that
   fit and records which ones need memory. Before every ``schedule()`` the pool gives memory
   back (:func:`~kvplan.elastic.ledger.trim`: prefix-cache entries above
   ``KVPLAN_CACHE_LIMIT`` are evicted page by page, free pages above the reserve unbacked).
2. **Transport**: after ``schedule()`` the step's :class:`ElasticOps` (blocks to unmap, then
   blocks to map) ride on the ``SchedulerOutput`` every rank receives, in step order.
3. **Workers**: first thing in ``Worker.execute_model``, each rank unmaps, then maps, from
   the same plan — before vLLM zeroes, copies or runs anything in that step. Unmapping
   synchronises the device first, and the blocks it names were free when the step was
   scheduled, so every step that could still write them ran before (FIFO per rank).

Unbacked memory reads as a scratch page (host-vmm: the zero page), never faults; with
``KVPLAN_POISON=1`` it faults instead (a test that no live block is ever unbacked).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error

if TYPE_CHECKING:
    from kvplan.elastic.ledger import Ledger
    from kvplan.executor import BoundKVCache
    from kvplan.integrations.vllm._patch_settings import Settings
    from kvplan.integrations.vllm._pipeline import Call, Runtime

logger = logging.getLogger("vllm.kvplan")

ENV_MEMORY_LIMIT = "KVPLAN_MEMORY_LIMIT"
ENV_CACHE_LIMIT = "KVPLAN_CACHE_LIMIT"
ENV_RESERVE = "KVPLAN_RESERVE"
ENV_POISON = "KVPLAN_POISON"
ENV_DEBUG_SKIP_MAP = "KVPLAN_DEBUG_SKIP_MAP"
ENV_DEBUG_FAIL_MAP = "KVPLAN_DEBUG_FAIL_MAP"
ENV_MAP_RETRY = "KVPLAN_MAP_RETRY"

OPS_ATTR = "kvplan_elastic"
"""The ``SchedulerOutput`` attribute that carries a step's :class:`ElasticOps`."""

CACHE_LIMIT_SHARE = 10
"""Default ``KVPLAN_CACHE_LIMIT``: a tenth of the memory limit."""
RESERVE_SHARE = 64
"""Default ``KVPLAN_RESERVE``: 1/64 of the memory limit, at most :data:`RESERVE_MAX`."""
RESERVE_MAX = 256 << 20
LIMIT_POLL_SECONDS = 0.5
"""How often the scheduler looks at ``<KVPLAN_DUMP_DIR>/limit.json`` (``kvplan limit``)."""
STATS_PERIOD_SECONDS = 0.5
"""A worker writes its stats file at most this often while figures change."""
SCHEDULER_FIGURES = (
    "live_blocks", "cached_blocks", "limit_bytes", "cache_limit_bytes", "reserve_bytes"
)  # fmt: skip
"""The figures a worker reports from the scheduler's last :class:`ElasticOps`."""
SAMPLED_BLOCKS = 64
"""Blocks whose pages the geometry fingerprint compares (plus the first and last)."""
SENT_KEPT = 8
"""Operations a scheduler remembers (steps in flight are at most two with async scheduling)."""
MAP_RETRY_SECONDS = 1.0
"""Default ``KVPLAN_MAP_RETRY``: after a failed map, no new memory is mapped for this long
(the blocks already backed are all the engine gets, as if the limit were what is mapped),
then mapping is tried again."""
MAP_RETRY_MAX = 3600.0


# -- settings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ElasticSettings:
    """``KVPLAN_MEMORY_LIMIT`` / ``KVPLAN_CACHE_LIMIT`` / ``KVPLAN_RESERVE`` (bytes; ``None``:
    the default), ``KVPLAN_POISON`` and the test-only ``KVPLAN_DEBUG_SKIP_MAP`` /
    ``KVPLAN_DEBUG_FAIL_MAP``."""

    limit: int | None = None
    cache_limit: int | None = None
    reserve: int | None = None
    poison: bool = False
    skip_map: int | None = None
    """Test-only negative control: drop one block from the N-th map (1-based)."""
    fail_map: int | None = None
    """Test-only fault injection: the N-th map (1-based) fails after mapping its chunks."""
    map_retry: float = MAP_RETRY_SECONDS
    """Seconds without new mappings after a failed map (0: try again at the next step)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "memory_limit": self.limit,
            "cache_limit": self.cache_limit,
            "reserve": self.reserve,
            "poison": self.poison,
            "debug_skip_map": self.skip_map,
            "debug_fail_map": self.fail_map,
            "map_retry": self.map_retry,
        }


def _size(env: Mapping[str, str], name: str, problems: list[Diagnostic]) -> int | None:
    from kvplan.units import parse_size

    raw = env.get(name, "").strip()
    if not raw:
        return None
    if raw == "0":
        return 0
    try:
        return parse_size(raw)
    except (ValueError, KVPlanError) as exc:
        problems.append(
            error(
                Code.INTEGRATION,
                name,
                f"{name}={raw[:40]!r} is not a byte size ({exc}).",
                f"write e.g. {name}=24GiB, 512MiB or 0",
            )
        )
        return None


def read_elastic_settings(env: Mapping[str, str]) -> tuple[ElasticSettings, list[Diagnostic]]:
    """The elastic settings in ``env`` and every problem with them (``KVP501``)."""
    problems: list[Diagnostic] = []
    limit = _size(env, ENV_MEMORY_LIMIT, problems)
    if limit == 0:
        problems.append(
            error(
                Code.INTEGRATION,
                ENV_MEMORY_LIMIT,
                f"{ENV_MEMORY_LIMIT}=0 leaves no memory for the KV cache.",
                f"give a byte size such as {ENV_MEMORY_LIMIT}=4GiB, or unset it",
            )
        )
    cache_limit = _size(env, ENV_CACHE_LIMIT, problems)
    reserve = _size(env, ENV_RESERVE, problems)
    from kvplan.integrations.vllm._patch_settings import flag  # it imports this module

    poison, bad_poison = flag(env, ENV_POISON)
    if bad_poison is not None:
        problems.append(bad_poison)
    skip = _map_number(env, ENV_DEBUG_SKIP_MAP, problems)
    fail = _map_number(env, ENV_DEBUG_FAIL_MAP, problems)
    retry = _seconds(env, ENV_MAP_RETRY, MAP_RETRY_SECONDS, MAP_RETRY_MAX, problems)
    return ElasticSettings(limit, cache_limit, reserve, poison, skip, fail, retry), problems


def _seconds(
    env: Mapping[str, str], name: str, default: float, most: float, problems: list[Diagnostic]
) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw.removesuffix("s"))
    except ValueError:
        value = -1.0
    if 0 <= value <= most:  # also refuses nan and inf
        return value
    problems.append(
        error(
            Code.INTEGRATION,
            name,
            f"{name}={raw[:40]!r} is not a number of seconds between 0 and {most:g}.",
            f"write e.g. {name}=1 or {name}=0.5s, or unset it (default {default:g})",
        )
    )
    return default


def _map_number(env: Mapping[str, str], name: str, problems: list[Diagnostic]) -> int | None:
    """A test-only ``KVPLAN_DEBUG_*`` setting: which map of a worker (1-based) it breaks."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if raw.isdigit() and 0 < int(raw) < 1 << 31:
        return int(raw)
    problems.append(
        error(
            Code.INTEGRATION,
            name,
            f"{name}={raw[:40]!r} is not a positive map number.",
            f"unset {name} (it breaks the cache on purpose, for tests)",
        )
    )
    return None


def elastic_chunk_bytes(backend: str) -> int:
    """The elastic mapping unit of ``backend``: its granularity (host-vmm: the OS page;
    cuda-vmm: 2 MiB), known on the scheduler side without creating the backend."""
    from kvplan.executor.backends import backend_info

    return backend_info(backend).granularity_default


# -- the message ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ElasticOps:
    """One step's memory operations, decided by the scheduler, applied by every worker.

    Plain ints and tuples: it is pickled to workers in other processes.
    """

    seq: int
    unmap: tuple[int, ...]
    """Blocks to unback first (free, without cache entries, since the step was scheduled)."""
    map: tuple[int, ...]
    """Blocks to back before the step runs (newly handed out)."""
    live_blocks: int
    cached_blocks: int
    limit_bytes: int
    cache_limit_bytes: int
    reserve_bytes: int
    mapped_bytes: int
    """What the scheduler's ledger counts as mapped after these operations."""
    digest: str
    """The scheduler's geometry fingerprint (see :func:`geometry_digest`)."""


def sampled_blocks(num_blocks: int) -> list[int]:
    if num_blocks <= 0:
        return []
    step = max(1, num_blocks // SAMPLED_BLOCKS)
    return sorted({*range(0, num_blocks, step), num_blocks - 1})


def geometry_digest(ledger: Ledger) -> str:
    """Chunk size, pool reservations and the chunks of sampled blocks, hashed: the scheduler
    and each worker compute it from their own plan and must agree."""
    import hashlib

    h = hashlib.sha256(f"{ledger.chunk_bytes};{ledger.reserved_bytes};".encode())
    h.update(f"{ledger.num_blocks};{ledger.pool_names}".encode())
    for b in sampled_blocks(ledger.num_blocks):
        h.update(f"{b}:{ledger.chunks(b)};".encode())
    return h.hexdigest()[:16]


# -- scheduler side ---------------------------------------------------------------------------


def default_limits(settings: ElasticSettings, reserved: int) -> tuple[int, int, int]:
    """``(limit, cache_limit, reserve)`` in bytes, defaults applied."""
    limit = settings.limit if settings.limit is not None else reserved
    cache = settings.cache_limit if settings.cache_limit is not None else limit // CACHE_LIMIT_SHARE
    reserve = (
        settings.reserve
        if settings.reserve is not None
        else min(limit // RESERVE_SHARE, RESERVE_MAX)
    )
    return limit, cache, reserve


class SchedulerSide:
    """The engine core's elastic state: ledger, budget, the operations of the next step."""

    def __init__(
        self, ledger: Ledger, settings: ElasticSettings, pool: Any, dump_dir: Path | None
    ) -> None:
        self.ledger = ledger
        self.settings = settings
        self.pool = pool
        self.dump_dir = dump_dir
        self.limit, self.cache_limit, self.reserve = default_limits(settings, ledger.reserved_bytes)
        self.digest = geometry_digest(ledger)
        self.pending_map: list[int] = []
        self.pending_unmap: list[int] = []
        self.seq = 0
        self.dirty = True
        self.cached_blocks = 0
        self._limit_stamp: float | None = None
        self._limit_polled = 0.0
        self._last_sent: tuple[int, ...] | None = None
        self._warned_over = False
        self.floor = 0
        """The smallest limit accepted: the null block plus one longest request."""
        self.failed: dict[int, MapFailed] = {}
        """Steps (``ElasticOps.seq``) whose maps failed on a worker, not yet recovered."""
        self.ceiling: int | None = None
        """After a failed map: the mapped bytes then, the effective limit until ``retry_at``."""
        self.retry_at = 0.0
        self.recovered = 0
        """Failed maps turned into preemptions (see :func:`recover_failed_map`)."""
        self.version = 0
        """Bumped whenever vLLM's pool changes (see :class:`_ElasticPool`)."""
        self.plain_count = False
        """Count free blocks as vLLM does: while vLLM checks that every block is free, and
        while it takes blocks already chosen within the limit."""
        self._counted: tuple[tuple[int, ...], int] | None = None
        self.sent: dict[int, ElasticOps] = {}
        """The last few operations sent, by ``seq``: a worker in this process finds its
        scheduler by identity (a worker in another process holds an unpickled copy)."""
        ledger.back([0])  # vLLM's null block: always backed (the workers map it at bind)

    # -- budget ---------------------------------------------------------------------------
    def effective_limit(self) -> int:
        """The limit, or less while mapping is held after a failed map."""
        return self.limit if self.ceiling is None else min(self.limit, self.ceiling)

    def tight(self) -> bool:
        """Whether the limit can bind at all (below the whole reservation)."""
        return self.effective_limit() < self.ledger.reserved_bytes

    def headroom(self) -> int:
        return self.effective_limit() - self.ledger.mapped_bytes

    def free_ids(self) -> Iterator[int]:
        """vLLM's free queue, front first, read lazily (a walk that stops early reads only the
        front); through its public list when the queue's links are not there."""
        queue = self.pool.free_block_queue
        block = getattr(getattr(queue, "fake_free_list_head", None), "next_free_block", None)
        if block is None:
            yield from (b.block_id for b in queue.get_all_free_blocks())
            return
        while block.next_free_block is not None:  # the fake tail has no next block
            yield block.block_id
            block = block.next_free_block

    def free_count(self, vanilla: int) -> int:
        """What ``get_num_free_blocks()`` says: the free blocks that can be backed within the
        limit, as :func:`~kvplan.elastic.ledger.admit` would take them in vLLM's free-queue
        order (``vanilla``: vLLM's own count).

        O(1) unless blocks share chunks *and* the limit binds: every block in use is backed,
        so the free backed blocks are counted from the ledger; with a
        :attr:`~kvplan.elastic.ledger.Ledger.uniform_block_cost` the unbacked ones that fit are
        arithmetic, and when even the worst case fits they all do. Only otherwise does it walk
        the free queue, at most once per change of the pool (the result is kept until a block
        is handed out, freed, hit, evicted, backed or unbacked, or the limit moves).
        """
        if self.plain_count or not self.tight():
            return vanilla
        ledger = self.ledger
        backed_free = max(0, len(ledger.backed) - (self.pool.num_gpu_blocks - vanilla))
        unbacked = vanilla - backed_free
        headroom = max(0, self.headroom())
        cost = ledger.uniform_block_cost
        if cost is not None:
            return backed_free + min(unbacked, headroom // cost)
        if headroom >= unbacked * ledger.max_block_cost:
            return vanilla
        key = (self.version, vanilla, len(ledger.backed), ledger.mapped_bytes, headroom)
        if self._counted is None or self._counted[0] != key:
            from kvplan.elastic.ledger import admit

            self._counted = (key, len(admit(ledger, self.free_ids(), headroom)))
        return self._counted[1]

    def choose(self, wanted: int) -> list[int]:
        from kvplan.elastic.ledger import admit

        return admit(self.ledger, self.free_ids(), self.headroom(), wanted)

    def backed(self, block_ids: list[int]) -> None:
        self.pending_map.extend(self.ledger.back(block_ids))
        self.version += 1

    def changed(self, *, freed: bool = True) -> None:
        """vLLM's pool changed: count free blocks anew; when blocks were freed or lost their
        cache entries (``freed``), also see what to give back before the next step."""
        self.version += 1
        if freed:
            self.dirty = True

    # -- between steps --------------------------------------------------------------------
    def poll_limit(self) -> None:
        """Pick up a new limit written by ``kvplan limit`` (at most every half second)."""
        if self.dump_dir is None:
            return
        now = time.monotonic()
        if now - self._limit_polled < LIMIT_POLL_SECONDS:
            return
        self._limit_polled = now
        from kvplan.elastic.files import LIMIT_FILE, read_limit

        try:
            stamp = (self.dump_dir / LIMIT_FILE).stat().st_mtime
        except OSError:
            return
        if stamp == self._limit_stamp:
            return
        self._limit_stamp = stamp
        found = read_limit(self.dump_dir)
        if found is None:
            return
        if isinstance(found, Diagnostic):
            logger.warning("kvplan: elastic limit file ignored: %s", found.render())
            return
        if found.limit_bytes < self.floor:
            logger.warning(
                "kvplan: elastic limit %d bytes raised to %d: the null block plus one "
                "request of max_model_len tokens",
                found.limit_bytes, self.floor,
            )  # fmt: skip
        self.limit = max(int(found.limit_bytes), self.floor)
        if found.cache_limit_bytes is not None:
            self.cache_limit = int(found.cache_limit_bytes)
        self.reserve = min(self.reserve, self.limit)
        self.dirty = True
        self._warned_over = False
        logger.info(
            "kvplan: elastic memory limit now %d bytes (cache limit %d)",
            self.limit, self.cache_limit,
        )  # fmt: skip

    def before_schedule(self) -> None:
        """Give memory back before the step allocates (see :func:`kvplan.elastic.ledger.trim`)."""
        self.poll_limit()
        if self.ceiling is not None and time.monotonic() >= self.retry_at:
            self.ceiling = None
            self.dirty = True
            logger.info("kvplan: elastic mapping resumes after the failed map")
        limit = self.effective_limit()
        if not self.dirty and self.ledger.mapped_bytes <= limit:
            return
        from kvplan.elastic.ledger import FreeBlock, trim

        pool = self.pool
        order = {b.block_id: i for i, b in enumerate(pool.free_block_queue.get_all_free_blocks())}
        blocks = pool.blocks
        free = [
            FreeBlock(b, blocks[b].block_hash is not None, order.get(b, 0))
            for b in self.ledger.backed
            if b != 0 and blocks[b].ref_cnt == 0
        ]
        result = trim(
            self.ledger, free, limit=limit, cache_limit=self.cache_limit, reserve=self.reserve
        )
        for b in result.evict:
            pool._maybe_evict_cached_block(blocks[b])
        self.pending_unmap.extend(result.unback)
        self.cached_blocks = sum(1 for f in free if f.cached) - len(result.evict)
        self.dirty = False
        if self.ledger.mapped_bytes > limit and not self._warned_over:
            self._warned_over = True
            logger.warning(
                "kvplan: %d bytes are mapped for blocks in use, above the elastic limit of %d "
                "bytes; no new memory is mapped until requests finish or are preempted",
                self.ledger.mapped_bytes, limit,
            )  # fmt: skip

    def ops(self) -> ElasticOps | None:
        """The operations for the step just scheduled (``None`` when nothing changed)."""
        pool = self.pool
        live = pool.num_gpu_blocks - 1 - pool.free_block_queue.num_free_blocks
        state = (live, self.cached_blocks, self.limit, self.cache_limit, self.reserve)
        if not self.pending_map and not self.pending_unmap and state == self._last_sent:
            return None
        self.seq += 1
        ops = ElasticOps(
            seq=self.seq,
            unmap=tuple(self.pending_unmap),
            map=tuple(self.pending_map),
            live_blocks=live,
            cached_blocks=self.cached_blocks,
            limit_bytes=self.limit,
            cache_limit_bytes=self.cache_limit,
            reserve_bytes=self.reserve,
            mapped_bytes=self.ledger.mapped_bytes,
            digest=self.digest,
        )
        self.pending_map, self.pending_unmap = [], []
        self._last_sent = state
        self.sent[ops.seq] = ops
        self.sent.pop(ops.seq - SENT_KEPT, None)
        return ops


class _ElasticPool:
    """Mixed into the class of the scheduler's ``BlockPool`` (see :func:`make_elastic`)."""

    _kvplan: SchedulerSide

    def get_num_free_blocks(self) -> int:
        vanilla: int = super().get_num_free_blocks()  # type: ignore[misc]
        return self._kvplan.free_count(vanilla)

    def get_new_blocks(self, num_blocks: int) -> list[Any]:
        side = self._kvplan
        found = False
        if side.tight():
            chosen = side.choose(num_blocks)
            found = len(chosen) >= num_blocks  # else vLLM raises as when it runs out
            if found:
                queue = self.free_block_queue  # type: ignore[attr-defined]
                picked = [self.blocks[b] for b in chosen]  # type: ignore[attr-defined]
                for block in picked:
                    queue.remove(block)
                queue.prepend_n(picked)  # vLLM pops exactly these
        # the blocks are found: vLLM's own "enough free blocks?" check needs no second count
        side.plain_count = found
        try:
            got: list[Any] = super().get_new_blocks(num_blocks)  # type: ignore[misc]
        finally:
            side.plain_count = False
        side.backed([b.block_id for b in got])
        return got

    def free_blocks(self, ordered_blocks: Any) -> None:
        super().free_blocks(ordered_blocks)  # type: ignore[misc]
        self._kvplan.changed()

    def touch(self, blocks: Any) -> None:
        super().touch(blocks)  # type: ignore[misc]
        self._kvplan.changed(freed=False)

    def evict_blocks(self, block_ids: set[int]) -> None:
        super().evict_blocks(block_ids)  # type: ignore[misc]
        self._kvplan.changed()

    def reset_prefix_cache(self) -> bool:
        # vLLM resets only when every block but the null block is free: count them as vLLM
        # does (under a binding limit the elastic count is smaller, and the reset would fail)
        side = self._kvplan
        side.plain_count = True
        try:
            done: bool = super().reset_prefix_cache()  # type: ignore[misc]
        finally:
            side.plain_count = False
        side.changed()
        return done


_POOL_CLASSES: dict[type, type] = {}


def make_elastic(pool: Any, side: SchedulerSide) -> None:
    """Turn vLLM's ``pool`` into an elastic pool in place (its managers keep the object)."""
    base = type(pool)
    cls = _POOL_CLASSES.get(base)
    if cls is None:
        cls = _POOL_CLASSES[base] = type(f"Elastic{base.__name__}", (_ElasticPool, base), {})
    pool.__class__ = cls
    pool._kvplan = side


# -- worker side --------------------------------------------------------------------------------


class MapFailed(Exception):
    """Backing a step's new blocks failed on a worker; everything that map did was rolled
    back, so none of ``blocks`` is resident (the step itself was applied otherwise)."""

    def __init__(self, seq: int, blocks: tuple[int, ...], error: KVPlanError) -> None:
        super().__init__(str(error))
        self.seq = seq
        self.blocks = blocks
        self.error = error


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
    """``maps`` / ``unmaps`` (chunks), ``failed_maps``, ``steps`` (with operations),
    ``map_calls``."""
    seconds: dict[str, float] = field(default_factory=lambda: {"map": 0.0, "unmap": 0.0})
    """Time spent mapping (``map``) and unmapping (``unmap``)."""
    scheduler: dict[str, int] = field(default_factory=dict)
    """What the scheduler last said: ``live_blocks``, ``cached_blocks``, ``limit_bytes``,
    ``cache_limit_bytes``, ``reserve_bytes``."""
    peak_mapped_bytes: int = 0
    checked: bool = False
    state: Literal["bound", "running", "closed"] = "bound"
    _reporter: StatsReporter | None = None

    def apply(self, ops: ElasticOps) -> None:
        from kvplan.integrations.vllm import _refusals as refusals

        if not self.checked:
            if ops.digest != self.digest:
                raise refusals.elastic_geometry(self.label, ops.digest, self.digest)
            self.checked = True
        cache = self.cache
        if ops.unmap:
            before = sum(cache.mapped_chunks.values())
            t0 = time.perf_counter()
            cache.release_blocks(ops.unmap)
            self.seconds["unmap"] += time.perf_counter() - t0
            self.count["unmaps"] += before - sum(cache.mapped_chunks.values())
        blocks = ops.map
        failed: MapFailed | None = None
        if blocks:
            self.count["map_calls"] += 1
            if self.settings.skip_map == self.count["map_calls"]:  # test-only: break it on purpose
                droppable = [b for b in blocks if b != 0]
                if droppable:
                    blocks = tuple(b for b in blocks if b != droppable[-1])
                    logger.warning(
                        "kvplan: %s skips mapping block %d (KVPLAN_DEBUG_SKIP_MAP)",
                        self.label, droppable[-1],
                    )  # fmt: skip
            before = sum(cache.mapped_chunks.values())
            t0 = time.perf_counter()
            try:
                self._map(blocks)
            except KVPlanError as exc:  # rolled back: none of ``blocks`` became resident
                self.count["failed_maps"] += 1
                failed = MapFailed(ops.seq, blocks, exc)
            else:
                self.count["maps"] += sum(cache.mapped_chunks.values()) - before
            finally:
                self.seconds["map"] += time.perf_counter() - t0
        self.scheduler = {key: getattr(ops, key) for key in SCHEDULER_FIGURES}
        self.count["steps"] += 1
        self.state = "running"
        self.touch()
        if failed is not None:
            raise failed

    def _map(self, blocks: tuple[int, ...]) -> None:
        cache = self.cache
        if self.settings.fail_map != self.count["map_calls"]:
            cache.ensure_mapped(blocks)
            return
        # test-only fault injection: the chunks are mapped, granting access fails, the
        # transaction rolls them back -- as when the device runs out of memory mid-step
        from kvplan.executor.backends.faults import FaultyBackend

        logger.warning(
            "kvplan: %s fails map #%d on purpose (KVPLAN_DEBUG_FAIL_MAP)",
            self.label, self.count["map_calls"],
        )  # fmt: skip
        real = cache.backend
        cache.backend = FaultyBackend(real, fail_ops={"set_access"})
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
        from kvplan.elastic.files import ElasticStats

        cache = self.cache
        return ElasticStats(
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
            **{key: self.scheduler.get(key, 0) for key in SCHEDULER_FIGURES},
            **{key: self.count[key] for key in ("maps", "unmaps", "failed_maps", "steps")},
            map_seconds=round(self.seconds["map"], 6),
            unmap_seconds=round(self.seconds["unmap"], 6),
        )

    def start_reporting(self) -> None:
        if self.dump_dir is not None:
            self._reporter = StatsReporter(self.dump_dir, self.snapshot)

    def closed(self) -> None:
        """The cache was closed: one last snapshot."""
        self.state = "closed"
        if self._reporter is not None:
            self._reporter.stop()


def worker_side(cache: BoundKVCache, settings: Settings, label: str) -> WorkerSide:
    """The elastic state of a worker that just bound ``cache`` (null block mapped)."""
    from kvplan.elastic.ledger import Ledger

    ledger = Ledger(cache.plan, cache.chunk_bytes, cache.chunk_bytes)
    ledger.back([0])
    side = WorkerSide(
        cache=cache,
        label=label,
        settings=settings.elastic,
        dump_dir=settings.dump_dir,
        digest=geometry_digest(ledger),
        backend=settings.backend,
    )
    limit, cache_limit, reserve = default_limits(settings.elastic, ledger.reserved_bytes)
    side.scheduler = {
        "limit_bytes": limit,
        "cache_limit_bytes": cache_limit,
        "reserve_bytes": reserve,
    }
    side.touch()
    return side


def engine_name(dump_dir: Path | None) -> str:
    """How ``kvplan top`` names this engine: ``KVPLAN_ENGINE_NAME``, else the dump dir's name."""
    name = os.environ.get("KVPLAN_ENGINE_NAME", "").strip()
    if name:
        return name[:80]
    return dump_dir.name if dump_dir is not None else "engine"


class StatsReporter:
    """Writes ``<dump dir>/rank<N>.stats.json`` atomically: at bind, within
    :data:`STATS_PERIOD_SECONDS` of a change, and when the cache closes. Snapshots and writes
    (an fsync each) run on its own thread, off the step path."""

    def __init__(self, directory: Path, snapshot: Callable[[], Any]) -> None:
        self.directory = directory
        self.snapshot = snapshot
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._run, name="kvplan-stats", daemon=True)
        self._thread.start()

    def changed(self) -> None:
        self._dirty.set()

    def _write(self) -> None:
        from kvplan.elastic.files import write_stats

        try:
            write_stats(self.directory, self.snapshot())
        except (OSError, KVPlanError) as exc:
            logger.warning("kvplan: cannot write elastic stats: %s", exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._dirty.wait(STATS_PERIOD_SECONDS) and not self._stop.is_set():
                self._dirty.clear()
                self._write()
                self._stop.wait(STATS_PERIOD_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._thread.join(timeout=2)
        self._write()


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
    with _WORKERS_LOCK:
        side = _WORKERS.get(id(owner))
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


# -- handlers (named by the version adapters' ELASTIC targets) -------------------------------------


@dataclass
class EngineCoreState:
    """What the engine core process saw: every rank's config (for the scheduler's plan)."""

    rank_configs: list[Any] = field(default_factory=list)


def record_rank_configs(runtime: Runtime, call: Call) -> Any:
    """``generate_scheduler_kv_cache_config(kv_cache_configs)``: keep every rank's config."""
    configs = list(call.arguments["kv_cache_configs"])
    runtime.elastic_core.rank_configs = configs
    return call.run()


def scheduler_init(runtime: Runtime, call: Call) -> Any:
    """``Scheduler.__init__``: build the ledger and make the block pool elastic."""
    from kvplan.integrations.vllm import _refusals as refusals

    result = call.run()
    scheduler = call.arguments["self"]
    configs = runtime.elastic_core.rank_configs or [call.arguments["kv_cache_config"]]
    manager = getattr(scheduler, "kv_cache_manager", None)
    pool = getattr(manager, "block_pool", None)
    if pool is None or not hasattr(pool, "free_block_queue"):
        no_pool = refusals.elastic_unsupported("the scheduler has no block pool")
        raise runtime.refuse(KVPlanError(no_pool))
    if not configs[0].kv_cache_tensors:
        return result
    try:
        ledgers = [scheduler_ledger(runtime, config) for config in configs]
        digests = {geometry_digest(ledger) for ledger in ledgers}
        if len(digests) > 1:
            raise KVPlanError(
                refusals.elastic_unsupported(
                    "the ranks' KV caches have different block geometry (pipeline "
                    "parallelism gives each stage other layers); elastic serving needs one"
                )
            )
        ledger = ledgers[0]
        if ledger.num_blocks != pool.num_gpu_blocks:
            raise KVPlanError(
                refusals.elastic_unsupported(
                    f"the plan has {ledger.num_blocks} blocks, the block pool {pool.num_gpu_blocks}"
                )
            )
        side = SchedulerSide(ledger, runtime.settings.elastic, pool, runtime.settings.dump_dir)
        need = longest_request_bytes(ledger, configs[0], call.arguments["vllm_config"])
        side.floor = ledger.mapped_bytes + need
        if side.limit < side.floor:
            raise refusals.elastic_limit_too_small(side.limit, side.floor)
    except KVPlanError as exc:
        raise runtime.refuse(exc) from None
    make_elastic(pool, side)
    runtime.elastic_sides.append(side)
    logger.info(
        "kvplan: elastic block pool: %d blocks, %d bytes reserved, limit %d, cache limit %d, "
        "reserve %d, chunk %d bytes",
        ledger.num_blocks, ledger.reserved_bytes, side.limit, side.cache_limit, side.reserve,
        ledger.chunk_bytes,
    )  # fmt: skip
    return result


def longest_request_bytes(ledger: Ledger, config: Any, vllm_config: Any) -> int:
    """What one request of ``max_model_len`` tokens needs backed: in every KV cache group
    (each takes its own block ids from the one pool), the blocks vLLM's own
    ``max_memory_usage_bytes`` admits for it, at the pool's mean bytes per block id."""
    if not ledger.num_blocks:
        return 0
    blocks = 0
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        page = int(spec.page_size_bytes)
        if page > 0:
            blocks += -(-int(spec.max_memory_usage_bytes(vllm_config)) // page)
    blocks = min(blocks, ledger.num_blocks - 1)
    return blocks * -(-ledger.reserved_bytes // ledger.num_blocks)


def scheduler_ledger(runtime: Runtime, config: Any) -> Ledger:
    """Plan ``config`` as the workers do and index its pages (sharers own no memory)."""
    from kvplan.elastic.ledger import Ledger
    from kvplan.integrations.vllm._pipeline import plan_step

    document = runtime.adapter.capture(
        config,
        shared_kv_cache_layers={},
        metadata={"source": "kvplan vLLM plugin", "phase": "scheduler"},
    )
    plan, findings = plan_step(document, runtime.settings)
    findings.raise_for_errors(strict=plan is None)
    assert plan is not None
    chunk = elastic_chunk_bytes(runtime.settings.backend)
    return Ledger(plan, chunk, chunk)


def recover_failed_map(scheduler: Any, side: SchedulerSide, failed: MapFailed) -> list[str]:
    """A worker could not back step ``failed.seq``'s new blocks and rolled its maps back:
    make that running out of blocks, before vLLM reads the step's output. Returns the ids of
    the preempted requests.

    * The ledger unbacks exactly those blocks (the worker's state after its rollback).
    * Suspect blocks: the failed ones, then -- until nothing changes -- every block written
      since the failed step by a request holding a suspect block (its attention read the
      scratch page). Requests holding a suspect block are preempted the way vLLM's own
      ``reset_prefix_cache(reset_running_requests=True)`` does it, dropping the step's output
      (``drop_stale_output``), and the suspects' prefix-cache entries are evicted, so nothing
      computed from unbacked memory is ever returned or hit again. Requests that touched no
      suspect block ran correctly and keep their tokens.
    * No new memory is mapped for ``KVPLAN_MAP_RETRY`` seconds (the effective limit is what is
      mapped now): requests wait or are preempted as when vLLM runs out of blocks.
    """
    side.ledger.unback(failed.blocks)
    manager = scheduler.kv_cache_manager
    sizes = [int(g.kv_cache_spec.block_size) for g in scheduler.kv_cache_config.kv_cache_groups]
    suspect = {b for b in failed.blocks if b != 0}
    affected: dict[str, Any] = {}
    changed = True
    while changed:
        changed = False
        for request in scheduler.running:
            if request.request_id in affected:
                continue
            groups = manager.get_block_ids(request.request_id)
            if not any(b in suspect for ids in groups for b in ids):
                continue
            affected[request.request_id] = request
            changed = True
            # tokens computed before the failed step (later steps are in flight, not drained)
            start = max(0, request.num_computed_tokens - request.num_in_flight_tokens)
            for g, ids in enumerate(groups):
                first = start // sizes[g] if len(groups) == len(sizes) else 0
                suspect.update(b for b in ids[first:] if b != 0)
    now = time.monotonic()
    for request in reversed([r for r in scheduler.running if r.request_id in affected]):
        scheduler.running.remove(request)
        scheduler._preempt_request(request, now, drop_stale_output=True)
        scheduler.prev_step_scheduled_req_ids.discard(request.request_id)
    side.pool.evict_blocks(suspect)
    side.ceiling = side.ledger.mapped_bytes
    side.retry_at = now + side.settings.map_retry
    side.changed()
    side.recovered += 1
    first_problem = failed.error.diagnostics[0].message if failed.error.diagnostics else ""
    logger.warning(
        "kvplan: backing %d blocks of step %d failed (%s); its maps were rolled back, %d "
        "requests that used them are preempted and recomputed, and no new memory is mapped "
        "for %.1f s (as when vLLM runs out of blocks)",
        len(failed.blocks), failed.seq, first_problem, len(affected), side.settings.map_retry,
    )  # fmt: skip
    return list(affected)


def update_from_output(runtime: Runtime, call: Call) -> Any:
    """``Scheduler.update_from_output``: a step whose maps failed becomes out of blocks."""
    scheduler = call.arguments["self"]
    side = _scheduler_side(scheduler)
    if side is not None and side.failed:
        ops = getattr(call.arguments["scheduler_output"], OPS_ATTR, None)
        failed = side.failed.pop(ops.seq, None) if ops is not None else None
        if failed is not None:
            recover_failed_map(scheduler, side, failed)
    return call.run()


def _scheduler_side(scheduler: Any) -> SchedulerSide | None:
    pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
    side: SchedulerSide | None = getattr(pool, "_kvplan", None)
    return side


def schedule(runtime: Runtime, call: Call) -> Any:
    """``Scheduler.schedule``: give memory back, schedule, attach the step's operations."""
    side = _scheduler_side(call.arguments["self"])
    if side is None:
        return call.run()
    side.before_schedule()
    output = call.run()
    ops = side.ops()
    if ops is not None:
        setattr(output, OPS_ATTR, ops)
    return output


def execute_model(runtime: Runtime, call: Call) -> Any:
    """``Worker.execute_model``: unmap, then map, this step's blocks; then run vLLM."""
    ops = getattr(call.arguments["scheduler_output"], OPS_ATTR, None)
    if ops is not None:
        worker = call.arguments["self"]
        side = worker_of(getattr(worker, "model_runner", None))
        if side is None:
            from kvplan.integrations.vllm import _refusals as refusals

            why = "this worker received elastic operations but bound no elastic KV cache"
            raise runtime.refuse(KVPlanError(refusals.elastic_unsupported(why)))
        try:
            side.apply(ops)
        except MapFailed as failed:
            hand_over(runtime, side, ops, failed)
    return call.run()


def hand_over(runtime: Runtime, worker: WorkerSide, ops: ElasticOps, failed: MapFailed) -> None:
    """Give a failed map to this engine's scheduler (it preempts the requests that used the
    blocks before it reads the step's output; meanwhile unbacked pages read as scratch), or
    refuse the step with ``KVP532`` when that cannot work."""
    from kvplan.integrations.vllm import _refusals as refusals

    scheduler = next((s for s in runtime.elastic_sides if s.sent.get(ops.seq) is ops), None)
    why = None
    if worker.settings.poison:
        why = "KVPLAN_POISON=1 makes the unbacked pages fault, so the step cannot run"
    elif scheduler is None:
        why = (
            "the scheduler runs in another process (multiprocess executor, e.g. tensor "
            "parallelism), which hears only one rank's output"
        )
    if why is not None:
        raise runtime.refuse(
            refusals.elastic_map_failed(worker.label, len(failed.blocks), failed.error, why)
        ) from failed.error
    assert scheduler is not None
    scheduler.failed[failed.seq] = failed
