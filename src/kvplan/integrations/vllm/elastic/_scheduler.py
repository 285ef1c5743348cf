"""The engine core's elastic state: the ledger, the budget, and the operations of the next step.

:class:`SchedulerSide` decides; the block pool (``_pool``) asks it how many free blocks fit
and tells it what vLLM handed out, freed, hit or evicted. Before each ``schedule()`` it picks up
a new limit (``kvplan limit``) and gives memory back (:func:`~kvplan.elastic.ledger.trim`);
after it, :meth:`SchedulerSide.ops` is the step's :class:`~kvplan.integrations.vllm.elastic.
_ops.ElasticOps`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.elastic._ops import ElasticOps, geometry_digest
from kvplan.integrations.vllm.elastic._settings import ElasticSettings, default_limits
from kvplan.schemas.errors import Diagnostic, KVPlanError

if TYPE_CHECKING:
    from kvplan.elastic.admission import AdmissionIndex
    from kvplan.elastic.group import GroupMember
    from kvplan.elastic.ledger import Ledger

logger = logging.getLogger("vllm.kvplan")

GROW_ATTEMPTS = 3
"""Group requests a step may make when admission is short (each one flock + ledger write)."""
GROW_BLOCKS = 256
"""At most this many blocks' worth is asked of the group at once (then a quarter, a quantum)."""
LIMIT_POLL_SECONDS = 0.5
"""How often the scheduler looks at ``<KVPLAN_DUMP_DIR>/limit.json`` (``kvplan limit``)."""


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
        self.asked_limit: int | None = settings.limit
        """What was asked (``KVPLAN_MEMORY_LIMIT``, then ``kvplan limit``); ``None``: default."""
        self.digest = geometry_digest(ledger)
        self.pending_map: list[int] = []
        self.pending_unmap: list[int] = []
        self.seq = 0
        self.dirty = True
        self.cached_blocks = 0
        self._limit_stamp: float | None = None
        self._limit_polled = 0.0
        self._last_sent: tuple[int | None, ...] | None = None
        self._warned_over = False
        self.floor = 0
        """The smallest limit accepted: the null block plus one longest request."""
        self.ceiling: int | None = None
        """After a failed map: the mapped bytes then, the effective limit until ``retry_at``."""
        self.retry_at = 0.0
        self.recovered = 0
        """Failed maps turned into preemptions (see :func:`recover_failed_map`)."""
        self.version = 0
        """Bumped whenever vLLM's pool changes (see ``_pool.ElasticPool``)."""
        self.plain_count = False
        """Count free blocks as vLLM does: while vLLM checks that every block is free, and
        while it takes blocks already chosen within the limit."""
        self._counted: tuple[tuple[int, ...], int] | None = None
        self.index: AdmissionIndex | None = None
        """With chunk-sharing ledgers: admission's count and pick (``_pool.index_free_queue``)."""
        self.group: GroupMember | None = None
        """The engine's membership of a group (``KVPLAN_GROUP``): its grant bounds the limit."""
        self.grow_attempts = 0
        """Group requests made in this step (at most :data:`GROW_ATTEMPTS`)."""
        self.unconfirmed: dict[int, int] = {}
        """Bytes unbacked by the operations of step ``seq`` that no step's output has confirmed
        yet (the workers may not have unmapped them): still counted against the grant."""
        self.step_unbacked = 0
        self.group_failed = False
        ledger.back([0])  # vLLM's null block: always backed (the workers map it at bind)

    # -- budget ---------------------------------------------------------------------------
    def effective_limit(self) -> int:
        """The limit, or less while mapping is held after a failed map, or less when the
        group grants less (a claim of another member included)."""
        limit = self.limit if self.ceiling is None else min(self.limit, self.ceiling)
        if self.group is not None:
            limit = min(limit, self.group.effective_limit)
        return limit

    # -- the group --------------------------------------------------------------------------
    def grow(self, more: int) -> bool:
        """Ask the group for ``more`` bytes beyond what is mapped (halving down to a quantum
        when that much is not free; at most :data:`GROW_ATTEMPTS` requests a step). True
        when the effective limit rose."""
        group = self.group
        if group is None or self.group_failed:
            return False
        own = self.limit if self.ceiling is None else min(self.limit, self.ceiling)
        before = group.effective_limit
        ask = max(more, group.quantum)
        while self.grow_attempts < GROW_ATTEMPTS:
            want = min(own, self.ledger.mapped_bytes + ask)
            if want <= group.effective_limit:
                break
            self.grow_attempts += 1
            try:
                if group.request(want):
                    break
            except KVPlanError as exc:
                self.fail_group(exc)
                return False
            if ask <= group.quantum:
                break
            ask = max(group.quantum, ask // 4)
        if group.effective_limit != before:
            self.version += 1
            return True
        return False

    def fail_group(self, exc: KVPlanError) -> None:
        """The group's accounting cannot be reached any more: map nothing new (the grant is
        all the engine has), say so once."""
        self.group_failed = True
        logger.error(
            "kvplan: the group's accounting failed (%s); this engine maps no new memory",
            exc.diagnostics[0].render() if exc.diagnostics else exc,
        )

    def confirm(self, seq: int, *, idle: bool = False) -> None:
        """The output of the step scheduled after operations ``seq`` arrived: the workers ran
        them, so the bytes they unbacked are unmapped; give the grant back down to what may
        still be mapped (the group's hysteresis decides how much). ``idle``: the scheduler
        has nothing left to schedule, so vLLM will not step (and this engine not tick) until
        a request arrives; everything above what is mapped goes back now, whatever the
        hysteresis says — else a grant that grew in the last second would stay borrowed for
        as long as the engine idles."""
        for done in [s for s in self.unconfirmed if s <= seq]:
            del self.unconfirmed[done]
        group = self.group
        if group is None or self.group_failed:
            return
        mapped = self.ledger.mapped_bytes + sum(self.unconfirmed.values())
        try:
            if idle and not self.unconfirmed:
                group.give_back(mapped)
            else:
                group.release(mapped)
        except KVPlanError as exc:
            self.fail_group(exc)

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
        """:meth:`count_free`, after asking the group for more when its grant is what binds."""
        count = self.count_free(vanilla)
        if count < vanilla and self.group is not None and self.grow_attempts < GROW_ATTEMPTS:
            cost = self.ledger.uniform_block_cost or self.ledger.max_block_cost
            if self.grow(min(vanilla - count, GROW_BLOCKS) * cost):
                count = self.count_free(vanilla)
        return count

    def count_free(self, vanilla: int) -> int:
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
        if self.index is not None:
            return self.index.count(headroom)
        if headroom >= unbacked * ledger.max_block_cost:
            return vanilla
        key = (self.version, vanilla, len(ledger.backed), ledger.mapped_bytes, headroom)
        if self._counted is None or self._counted[0] != key:
            from kvplan.elastic.ledger import admit

            self._counted = (key, len(admit(ledger, self.free_ids(), headroom)))
        return self._counted[1]

    def choose(self, wanted: int) -> list[int]:
        from kvplan.elastic.ledger import admit

        def pick() -> list[int]:
            headroom = self.headroom()
            if self.index is not None:
                return self.index.pick(wanted, max(0, headroom))
            return admit(self.ledger, self.free_ids(), headroom, wanted)

        chosen = pick()
        if len(chosen) < wanted and self.grow((wanted - len(chosen)) * self.ledger.max_block_cost):
            chosen = pick()
        return chosen

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
        self.asked_limit = int(found.limit_bytes)
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
        self.grow_attempts = 0
        if self.group is not None and not self.group_failed:
            try:
                if self.group.tick():  # a new budget, a claim to serve, a claim served
                    self.dirty = True
                    self.version += 1
            except KVPlanError as exc:
                self.fail_group(exc)
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
        mapped = self.ledger.mapped_bytes
        result = trim(
            self.ledger, free, limit=limit, cache_limit=self.cache_limit, reserve=self.reserve
        )
        self.step_unbacked += mapped - self.ledger.mapped_bytes
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
        state = (
            live, self.cached_blocks, self.limit, self.cache_limit, self.reserve, self.floor,
            self.asked_limit,
        )  # fmt: skip
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
            floor_bytes=self.floor,
            asked_limit_bytes=self.asked_limit,
        )
        self.pending_map, self.pending_unmap = [], []
        if self.step_unbacked:
            self.unconfirmed[ops.seq] = self.step_unbacked
            self.step_unbacked = 0
        self._last_sent = state
        return ops
