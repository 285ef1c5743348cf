"""The engine core's elastic state: the ledger, the budget, and the operations of the next step.

:class:`SchedulerSide` decides; the block pool (``_pool``) asks it how many free blocks fit
and tells it what vLLM handed out, freed, hit or evicted. Before each ``schedule()`` it picks up
a new limit (``kvplan limit``) and gives memory back (:func:`~kvplan.elastic.ledger.trim`);
after it, :meth:`SchedulerSide.ops` is the step's :class:`~kvplan.integrations.vllm.elastic.
_ops.ElasticOps`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.elastic._ahead import MappingAhead
from kvplan.integrations.vllm.elastic._ops import ElasticOps, geometry_digest
from kvplan.integrations.vllm.elastic._requests import demand_blocks, preempt_over_limit
from kvplan.integrations.vllm.elastic._settings import (
    ElasticSettings,
    busy_reserve,
    default_limits,
)
from kvplan.schemas.errors import Diagnostic, KVPlanError, printable
from kvplan.schemas.loading import owner_text

if TYPE_CHECKING:
    from kvplan.elastic.admission import AdmissionIndex
    from kvplan.elastic.group import GroupMember
    from kvplan.elastic.ledger import Ledger

logger = logging.getLogger("vllm.kvplan")

ASK_BLOCKS = 256
"""Blocks' worth asked of the group before the scheduler's demand is known."""
ASK_SECONDS = 0.05
"""A waiting member asks the group again at most this often (at most 20 ledger writes a
second), and before that only for more than it asked last."""
ASK_LOOK_SECONDS = 0.005
"""After :data:`ASK_SECONDS`, how often a waiting member looks whether the ledger changed (one
``lstat``): vLLM counts the free blocks several times a step, and a look at every count was
a fifth of a group member's scheduling time in a burst."""
ASK_AGAIN_SECONDS = 1.0
"""A refused ask is repeated after this long even when the ledger did not change (a dead
member is reaped by the next accounting operation of any member)."""
GROUP_RETRY_SECONDS = 2.0
"""After the group's accounting failed, how often the engine looks at the group again."""
LIMIT_POLL_SECONDS = 0.5
"""How often the scheduler looks at ``<KVPLAN_DUMP_DIR>/limit.json`` (``kvplan limit``)."""
DEMAND_STEPS = 32
"""A busy engine's reserve follows the most blocks one of its last this many steps took."""
DEMAND_FACTOR = 2
"""... times this many: a step's allocations and the next one's find their pages backed."""


class SchedulerSide(MappingAhead):
    """The engine core's elastic state: ledger, budget, the operations of the next step."""

    def __init__(
        self,
        ledger: Ledger,
        settings: ElasticSettings,
        pool: Any,
        dump_dir: Path | None,
        *,
        busy_ahead: bool = True,
    ) -> None:
        self.ledger = ledger
        self.busy_ahead = busy_ahead
        """A busy engine maps its next blocks ahead (:meth:`map_ahead_busy`;
        ``ElasticSettings.maps_ahead_busy``: where the backend maps beside the compute)."""
        self.settings = settings
        self.pool = pool
        self.dump_dir = dump_dir
        self.limit, self.cache_limit, self.reserve = default_limits(settings, ledger.reserved_bytes)
        self.busy_reserve = busy_reserve(settings, self.limit)
        """The most a busy engine's reserve may grow to (``KVPLAN_BUSY_RESERVE``)."""
        self.busy = False
        """The scheduler had unfinished requests when it last scheduled."""
        self.quiet = threading.Event()
        """Set while no request is unfinished (kept by the steps): the watcher looks only then
        (``_reclaim``; a stepping engine looks at its group and its limit at every step)."""
        self.quiet.set()
        self.taken: deque[int] = deque(maxlen=DEMAND_STEPS)
        """Blocks vLLM's pool handed out in each of the last steps (see :meth:`reserve_target`)."""
        self._taking = 0
        self.asked_limit: int | None = settings.limit
        """What was asked (``KVPLAN_MEMORY_LIMIT``, then ``kvplan limit``); ``None``: default."""
        self.digest = geometry_digest(ledger)
        self.pending_map: dict[int, None] = {}
        """Blocks to map with the next operations (in order; see :meth:`queue`)."""
        self.pending_unmap: dict[int, None] = {}
        self.pending_ahead: dict[int, None] = {}
        """Blocks a busy engine backs ahead, for the next operations' ``ahead``."""
        self.ahead_out: tuple[int, ...] = ()
        """The ``ahead`` of the operations sent last: the workers map them while that step
        runs and join the mapping with the next operations (always sent: :meth:`ops`)."""
        self.joining: tuple[int, ...] = ()
        """The ``ahead`` the operations built last join (:attr:`ahead_out` before them)."""
        self.seq = 0
        self.dirty = True
        self.cached_blocks = 0
        self._limit_stamp: tuple[int, ...] | None = None
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
        self.demand: int | None = None
        """Blocks the scheduler's requests want in the next step (the waiting queue's first
        prompt, a block per running request), from :func:`demand_blocks`: what a member
        short of memory asks its group for (``None`` before the first step: up to
        :data:`ASK_BLOCKS`)."""
        self.asked = 0
        """The bytes (in all) the last group ask wanted."""
        self.refused = 0
        """The last ask the group could not meet (0: none): repeated as :meth:`ask_group`
        says."""
        self._asked_at = 0.0
        self._asked_stamp: object = None
        self._looked_at = 0.0
        """When a refused ask last looked whether the ledger changed (:data:`ASK_LOOK_SECONDS`)."""
        self.preempted = 0
        """Requests preempted because the engine was over its effective limit (a lowered
        limit, another member's claim)."""
        self.watcher: Any = None
        """The engine core's ``_reclaim.Watcher`` of this side (``None`` in tests)."""
        self.reserve_bytes = 0
        """Bytes of free, uncached pages kept backed after the last trim or map ahead."""
        self.ahead_version = -1
        """:attr:`version` at the last map ahead (none again until the pool changed)."""
        self.ahead_retry_at = 0.0
        """After a map ahead failed: no map ahead before this (monotonic seconds)."""
        self.waiting = False
        """Requests were waiting when the last trim was decided (:meth:`reserve_target`)."""
        self.stepping = False
        """A step was scheduled and its output has not arrived yet (its operations may be
        running on the workers): the reclaim of an idle engine waits for it."""
        self.lock = threading.RLock()
        """Held while the scheduler's state is read or changed by kvplan (around
        ``schedule`` and ``update_from_output``, and by the reclaim of an idle engine, which
        runs on another thread: ``_reclaim``)."""
        self.unconfirmed: dict[int, int] = {}
        """Bytes unbacked by the operations of step ``seq`` that no step's output has confirmed
        yet (the workers may not have unmapped them): still counted against the grant."""
        self.step_unbacked = 0
        self.group_failed = False
        self.group_failed_at = 0.0
        """When the group's accounting last started failing (monotonic seconds)."""
        self.unservable_ids: list[str] = []
        """Requests of the step just scheduled to finish with an error (``_unservable``)."""
        self.unservable = 0
        """Requests finished with an error because the engine could not serve them."""
        self.group_retry_at = 0.0
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
    def ask_group(self, want: int) -> bool:
        """Ask the group for a grant of ``want`` bytes in all (its need: what is mapped plus
        the blocks the requests want, see :meth:`free_count`). One ask per change: a refused
        ask is repeated for more bytes while the member is below its guarantee (its claim
        stays what it needs; past it only free bytes grow a grant, and bytes set free change
        the ledger), or once the ledger changed (a release, a budget change, a claim served)
        and :data:`ASK_SECONDS` passed, or after
        :data:`ASK_AGAIN_SECONDS` -- so a waiting member writes the ledger at most 20 times a
        second, and its claim stays what it needs; it looks whether the ledger changed at most
        every :data:`ASK_LOOK_SECONDS`. True when the effective limit rose."""
        group = self.group
        if group is None or self.group_failed:
            return False
        own = self.limit if self.ceiling is None else min(self.limit, self.ceiling)
        want = min(own, max(want, self.ledger.mapped_bytes + group.quantum))
        if want <= group.effective_limit:
            return False
        now = time.monotonic()
        if want <= self.refused or (self.refused and group.granted >= group.guarantee):
            since = now - self._asked_at
            if since < ASK_SECONDS:
                return False
            if since < ASK_AGAIN_SECONDS:
                if now - self._looked_at < ASK_LOOK_SECONDS:
                    return False
                self._looked_at = now
                if group.stamp() == self._asked_stamp:
                    return False
        before = group.effective_limit
        self.asked, self._asked_at = want, now
        try:
            group.request(want)
        except KVPlanError as exc:
            self.fail_group(exc)
            return False
        self.refused = want if group.effective_limit < want else 0
        self._asked_stamp = group.stamp()
        if group.effective_limit != before:
            self.version += 1
            return True
        return False

    def fail_group(self, exc: KVPlanError) -> None:
        """The group's accounting cannot be reached: map nothing new (the grant is all the
        engine has), say so once, and look again every :data:`GROUP_RETRY_SECONDS` (another
        member's bad file, once fixed, must not stop this one for the rest of its life)."""
        self.group_retry_at = time.monotonic() + GROUP_RETRY_SECONDS
        if self.group_failed:
            return
        self.group_failed = True
        self.group_failed_at = time.monotonic()
        logger.error(
            "kvplan: the group's accounting failed (%s); this engine maps no new memory "
            "until it can be reached again (looked at every %.0f s)",
            exc.diagnostics[0].render() if exc.diagnostics else exc, GROUP_RETRY_SECONDS,
        )  # fmt: skip

    def retry_group(self) -> None:
        """After a failure, once :attr:`group_retry_at` passed: one look at the group
        (:meth:`GroupMember.check`: the lock, the ledger, this member's lease); the accounting
        resumes when it succeeds."""
        group = self.group
        if group is None or not self.group_failed or time.monotonic() < self.group_retry_at:
            return
        try:
            group.check()
        except KVPlanError as exc:
            self.fail_group(exc)
            return
        self.group_failed = False
        self.refused = 0
        self.dirty = True
        self.version += 1
        logger.info("kvplan: the group's accounting can be reached again; mapping resumes")

    def confirm(self, seq: int, *, idle: bool = False) -> None:
        """The output of the step scheduled after operations ``seq`` arrived: the workers ran
        them, so the bytes they unbacked are unmapped; give the grant back down to what may
        still be mapped (the group's hysteresis decides how much). ``idle``: the scheduler
        has nothing left to schedule, so vLLM will not step (and this engine not tick) until
        a request arrives; everything above what is mapped goes back now, whatever the
        hysteresis says — else a grant that grew in the last second would stay borrowed for
        as long as the engine idles."""
        if self.unconfirmed:
            for done in [s for s in self.unconfirmed if s <= seq]:
                del self.unconfirmed[done]
        group = self.group
        if group is None or self.group_failed:
            return
        mapped = self.ledger.mapped_bytes + sum(self.unconfirmed.values())
        try:
            if idle and not self.unconfirmed:
                freed = group.give_back(mapped)
            else:
                freed = group.release(mapped)
        except KVPlanError as exc:
            self.fail_group(exc)
            return
        if freed:
            self.refused = 0  # the grant changed: a refused ask may be made again at once

    def tight(self) -> bool:
        """Whether the limit can bind at all (below the whole reservation): vLLM asks
        several times a step, so the common case -- no group, no failed map -- is one read."""
        if self.group is None and self.ceiling is None:
            return self.limit < self.ledger.reserved_bytes
        return self.effective_limit() < self.ledger.reserved_bytes

    def headroom(self) -> int:
        return self.effective_limit() - self.ledger.mapped_bytes

    def reserve_target(self) -> int:
        """The bytes of free, uncached pages to keep backed now: ``KVPLAN_RESERVE``, and while
        the engine is busy what its steps take -- :data:`DEMAND_FACTOR` times the most blocks
        one of its last :data:`DEMAND_STEPS` steps took -- up to ``KVPLAN_BUSY_RESERVE``, so
        the blocks its requests free are used again without giving their pages back and
        mapping others in between (they are handed out first: ``_pool``). An idle engine
        goes back to ``KVPLAN_RESERVE`` (its watcher trims within a tick), or to nothing while
        its default reserve yields (:meth:`reserve_yields`). An engine outside a group whose
        limit binds keeps every page its requests free, up to the limit, while requests wait
        (:attr:`waiting`): they take those pages in the step being scheduled, and giving them
        back would only unmap what that step maps again (``KVPLAN_BUSY_RESERVE=0`` keeps the
        plain reserve; a group member gives them back, for a neighbour to take)."""
        if not self.busy or not self.taken:
            return 0 if self.reserve_yields() else self.reserve
        if self.waiting and self.busy_reserve and self.group is None and self.tight():
            return max(self.reserve, self.limit)  # what the requests free, the waiting take
        cost = self.ledger.uniform_block_cost or self.ledger.max_block_cost
        demand = DEMAND_FACTOR * max(self.taken) * cost
        return max(self.reserve, min(self.busy_reserve, demand, self.limit))

    def reserve_yields(self) -> bool:
        """An idle member of a group keeps no default reserve while the group has less than
        a quantum free: a neighbour that grows takes the free bytes first, then what the idle
        members keep backed ahead of a burst of their own (each gives it back at its watcher's
        next look, and maps its next burst's first blocks in the step). A reserve the user
        set (``KVPLAN_RESERVE``) is kept: it never yields."""
        group = self.group
        if group is None or self.group_failed or self.busy or self.settings.reserve is not None:
            return False
        return group.free < group.quantum

    def handed_out(self, count: int) -> None:
        """vLLM's pool handed out ``count`` blocks in the step being scheduled."""
        self._taking += count

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

    def queue_positions(self, wanted: Collection[int], count: int | None = None) -> dict[int, int]:
        """The positions in vLLM's free queue (0: its front) of the ``wanted`` blocks in it,
        walking in from both ends until ``count`` of them (all of ``wanted`` unless told) are
        found -- the backed free blocks sit near the ends (uncached ones at the front, where
        the pool puts them; blocks freed with cache entries at the back), so a step's trim
        reads a few links, not the whole queue of a pool of 100,000 blocks. Through the
        queue's public list when its links are not there."""
        if count is None:
            count = len(wanted)
        queue = self.pool.free_block_queue
        head = getattr(getattr(queue, "fake_free_list_head", None), "next_free_block", None)
        tail = getattr(getattr(queue, "fake_free_list_tail", None), "prev_free_block", None)
        if head is None or tail is None:
            listed = queue.get_all_free_blocks()
            return {b.block_id: i for i, b in enumerate(listed) if b.block_id in wanted}
        size = int(queue.num_free_blocks)
        found: dict[int, int] = {}
        front, back = head, tail
        for i in range((size + 1) // 2):
            if len(found) >= count:
                break
            if front.block_id in wanted:
                found[front.block_id] = i
            j = size - 1 - i
            if j > i and back.block_id in wanted:
                found[back.block_id] = j
            front, back = front.next_free_block, back.prev_free_block
        return found

    def free_backed(self) -> dict[int, int]:
        """The free, backed blocks, with their positions in vLLM's free queue (0: its front).
        Every block in use is backed, and so is the null block (never free): there are as many
        as the ledger's backed blocks less the blocks in use, found in from the ends of the
        queue (:meth:`queue_positions`) -- a pass proportional to them, not to every backed
        block of the pool."""
        pool, backed = self.pool, self.ledger.backed
        in_use = pool.num_gpu_blocks - int(pool.free_block_queue.num_free_blocks)
        return self.queue_positions(backed, len(backed) - in_use)

    def free_count(self, vanilla: int) -> int:
        """:meth:`count_free`, after asking the group for more when its grant is what binds:
        for the bytes of the blocks the requests want (:attr:`demand`, at most vLLM's free
        count) beyond what admission counts now, on top of the effective limit."""
        count = self.count_free(vanilla)
        if count < vanilla and self.group is not None:
            wanted = ASK_BLOCKS if self.demand is None else max(self.demand, 1)
            short = min(vanilla, wanted) - count
            if short > 0:
                cost = self.ledger.uniform_block_cost or self.ledger.max_block_cost
                want = max(self.effective_limit(), self.ledger.mapped_bytes) + short * cost
                if self.ask_group(want):
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
        if len(chosen) < wanted:
            short = (wanted - len(chosen)) * self.ledger.max_block_cost
            if self.ask_group(max(self.effective_limit(), self.ledger.mapped_bytes) + short):
                chosen = pick()
        return chosen

    def backed(self, block_ids: list[int]) -> None:
        self.queue(mapped=self.ledger.back(block_ids))
        self.version += 1

    def queue(
        self, *, mapped: Iterable[int] = (), unmapped: Iterable[int] = (), ahead: Iterable[int] = ()
    ) -> None:
        """Queue maps (``ahead``: maps ahead) and unmaps for the next operations, a block's last
        word winning. The workers apply an operation's unmaps before its maps, so a block
        backed and unbacked again before the operations went out (a request preempted in the
        schedule that gave it the block, an idle engine's blocks freed before any step) must
        leave the maps -- the workers never mapped it -- rather than join the unmaps too,
        where its map would win on the workers while the ledger counts it unbacked. Unbacked
        and backed again before they went out, it stays mapped on the workers: neither
        list."""
        unmap = self.pending_unmap
        for maps, blocks in ((self.pending_map, mapped), (self.pending_ahead, ahead)):
            for b in blocks:
                if b in unmap:  # the workers hold it mapped: it stays so
                    del unmap[b]
                else:
                    maps[b] = None
        for b in unmapped:
            if b in self.pending_map:  # the workers never mapped it: nothing to undo
                del self.pending_map[b]
            elif b in self.pending_ahead:
                del self.pending_ahead[b]
            else:
                self.pending_unmap[b] = None

    def changed(self, *, freed: bool = True) -> None:
        """vLLM's pool changed: count free blocks anew; when blocks were freed or lost their
        cache entries (``freed``), also see what to give back before the next step."""
        self.version += 1
        if freed:
            self.dirty = True

    # -- between steps --------------------------------------------------------------------
    def _limit_file_stamp(self) -> tuple[int, ...] | None:
        """``limit.json``'s device, inode, size, owner, mode and modification and change
        times (one ``lstat``): a rename over it changes the inode, a write in place the size
        or the change time, which no one can set back (``cp -p`` and ``rsync -t`` restore the
        modification time only)."""
        from kvplan.elastic.files import LIMIT_FILE

        assert self.dump_dir is not None
        try:
            st = os.lstat(self.dump_dir / LIMIT_FILE)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_uid, st.st_mode,
                st.st_mtime_ns, st.st_ctime_ns)  # fmt: skip

    def limit_file_changed(self) -> bool:
        """Whether ``limit.json`` changed since it was last read (one ``lstat``)."""
        if self.dump_dir is None:
            return False
        stamp = self._limit_file_stamp()
        return stamp is not None and stamp != self._limit_stamp

    def poll_limit(self, *, force: bool = False) -> None:
        """Pick up a new limit written by ``kvplan limit`` (at most every half second, unless
        ``force``)."""
        if self.dump_dir is None:
            return
        now = time.monotonic()
        if not force and now - self._limit_polled < LIMIT_POLL_SECONDS:
            return
        self._limit_polled = now
        from kvplan.elastic.files import read_limit

        stamp = self._limit_file_stamp()
        if stamp is None:
            return
        if stamp == self._limit_stamp:
            return
        self._limit_stamp = stamp
        found = read_limit(self.dump_dir)
        if found is None:
            return
        if isinstance(found, Diagnostic):  # another user's file among them, named
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
            "kvplan: elastic memory limit now %d bytes (cache limit %d), from %s of %s",
            self.limit, self.cache_limit, printable(str(self.dump_dir / "limit.json")),
            owner_text(stamp[3]),
        )  # fmt: skip

    def before_schedule(self, scheduler: Any = None, *, force_tick: bool = False) -> None:
        """Before the step allocates: pick up a new limit, look at the group, give memory back
        (see :func:`kvplan.elastic.ledger.trim`), and -- when blocks in use are still above
        the effective limit (a lowered limit, another member's claim) -- preempt the newest
        running requests until they fit (:func:`preempt_over_limit`), as vLLM does when it
        runs out of blocks. ``force_tick``: look at the group and the limit file now (the
        reclaim of an idle engine), not at most every tick."""
        self.poll_limit(force=force_tick)
        self.retry_group()
        if self.group is not None and not self.group_failed:
            try:
                if self.group.tick(force=force_tick):  # a budget, a claim to serve, served
                    self.dirty = True
                    self.version += 1
            except KVPlanError as exc:
                self.fail_group(exc)
        if self.ceiling is not None and time.monotonic() >= self.retry_at:
            self.ceiling = None
            self.dirty = True
            logger.info("kvplan: elastic mapping resumes after the failed map")
        if scheduler is not None and self.group is not None:
            self.demand = demand_blocks(scheduler)
        unfinished = getattr(scheduler, "get_num_unfinished_requests", None)
        if unfinished is not None:
            self.busy = bool(unfinished())
            if self.busy and self.quiet.is_set():  # (clear() takes the event's lock)
                self.quiet.clear()
        # an engine gone idle keeps only KVPLAN_RESERVE (the target is at least that unless an
        # idle member's reserve yields); a busy one trims its reserve to the target when it
        # trims anyway (blocks freed, a limit), not each time its demand's window moves on
        over = self.reserve_bytes > (self.reserve if self.group is None else 0)
        if over and not self.busy and self.reserve_bytes > self.reserve_target():
            self.dirty = True
        limit = self.effective_limit()
        if not self.dirty and self.ledger.mapped_bytes <= limit:
            return
        self.waiting = scheduler is not None and bool(getattr(scheduler, "waiting", None))
        self.trim()
        if self.ledger.mapped_bytes > limit and scheduler is not None:
            self.preempted += preempt_over_limit(scheduler, self)
        if self.ledger.mapped_bytes > limit and not self._warned_over:
            self._warned_over = True
            logger.warning(
                "kvplan: %d bytes are mapped for blocks in use, above the elastic limit of %d "
                "bytes; no new memory is mapped until requests finish or are preempted",
                self.ledger.mapped_bytes, limit,
            )  # fmt: skip

    def trim(self) -> None:
        """Give back what the limits ask (:func:`kvplan.elastic.ledger.trim`): evict the cache
        entries of the pages it frees, queue their unmaps for the next operations."""
        from kvplan.elastic.ledger import FreeBlock, trim

        pool = self.pool
        blocks = pool.blocks
        free = [
            FreeBlock(b, blocks[b].block_hash is not None, at)
            for b, at in self.free_backed().items()
        ]
        mapped = self.ledger.mapped_bytes
        result = trim(
            self.ledger,
            free,
            limit=self.effective_limit(),
            cache_limit=self.cache_limit,
            reserve=self.reserve_target(),
        )
        self.step_unbacked += mapped - self.ledger.mapped_bytes
        for b in result.evict:
            pool._maybe_evict_cached_block(blocks[b])
        self.queue(unmapped=result.unback)
        self.cached_blocks = sum(1 for f in free if f.cached) - len(result.evict)
        self.reserve_bytes = result.reserve_bytes
        self.dirty = False

    def step_taken(self) -> int:
        """The step is scheduled: what its allocations took joins :attr:`taken` (returned)."""
        taking = self._taking
        if taking:
            self.taken.append(taking)
            self._taking = 0
        return taking

    def ops(self) -> ElasticOps | None:
        """The operations for the step just scheduled (``None`` when nothing changed and the
        last operations mapped nothing ahead)."""
        self.step_taken()
        pool = self.pool
        live = pool.num_gpu_blocks - 1 - pool.free_block_queue.num_free_blocks
        state = (
            live, self.cached_blocks, self.limit, self.cache_limit, self.reserve, self.floor,
            self.asked_limit, self.preempted,
        )  # fmt: skip
        if (
            not self.pending_map
            and not self.pending_unmap
            and not self.pending_ahead
            and not self.ahead_out  # the workers join that mapping with these operations
            and state == self._last_sent
        ):
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
            over_limit_preemptions=self.preempted,
            ahead=tuple(self.pending_ahead),
        )
        self.pending_map, self.pending_unmap, self.pending_ahead = {}, {}, {}
        self.joining, self.ahead_out = self.ahead_out, ops.ahead
        if self.step_unbacked:
            self.unconfirmed[ops.seq] = self.step_unbacked
            self.step_unbacked = 0
        self._last_sent = state
        return ops
