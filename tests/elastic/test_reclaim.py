"""Giving back and mapping ahead while vLLM does not step (``_reclaim``), on real parts: vLLM's
``BlockPool`` made elastic, a host-vmm cache on the worker side, and the engine core's
``collective_rpc`` played by a stand-in executor that calls the worker function kvplan
sends (what vLLM's executors do with a callable). The whole engines: ``tests/engine/
test_reclaim.py``."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness import _builders as builders
from kvplan.elastic.group import read_snapshot, set_budget
from kvplan.elastic.ledger import Ledger
from kvplan.executor import apply
from kvplan.executor.backends.faults import FaultyBackend
from kvplan.integrations.vllm.elastic import (
    ElasticSettings,
    SchedulerSide,
    geometry_digest,
    make_elastic,
)
from kvplan.integrations.vllm.elastic import _reclaim as reclaim
from kvplan.integrations.vllm.elastic import _worker as worker_state
from kvplan.integrations.vllm.elastic._group import join
from tests.elastic.test_ledger import PAGE, plan_of

pytestmark = pytest.mark.vllm
NUM_BLOCKS = 64
BLOCK = 4 * PAGE  # 4 layers x 4 KiB


@dataclass
class Scheduler:
    """What the reclaim reads of vLLM's ``Scheduler``."""

    unfinished: int = 0
    running: list[Any] = field(default_factory=list)
    waiting: list[Any] = field(default_factory=list)

    def get_num_unfinished_requests(self) -> int:
        return self.unfinished


class Runner:
    """A worker's model runner: what ``worker_of`` keys the worker side by."""


@dataclass
class Worker:
    model_runner: Runner


class Executor:
    """vLLM's executors run a callable ``method(worker, *args)`` on every rank."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.calls = 0

    def collective_rpc(self, method: Any, args: tuple[Any, ...] = ()) -> list[Any]:
        self.calls += 1
        return [method(w, *args) for w in self.workers]


@dataclass
class EngineCore:
    model_executor: Executor
    batch_queue: Any = None


def _engine(
    tmp_path: Path | None = None,
    *,
    ranks: int = 1,
    fail_rank: int | None = None,
    name: str = "a",
    **limits: int,
) -> tuple[Any, SchedulerSide, EngineCore, Scheduler, list[Any]]:
    from vllm.v1.core.block_pool import BlockPool

    plan = plan_of(builders.llama(num_blocks=NUM_BLOCKS))
    ledger = Ledger(plan, PAGE)
    pool = BlockPool(NUM_BLOCKS, enable_caching=True, hash_block_size=16)
    group = None if tmp_path is None else tmp_path
    settings = ElasticSettings(
        limit=limits.get("limit"),
        cache_limit=limits.get("cache", 0),
        reserve=limits.get("reserve", 0),
        group=group,
        group_guarantee=limits.get("guarantee"),
    )
    side = SchedulerSide(ledger, settings, pool, None)
    side.floor = 2 * BLOCK
    if group is not None:
        side.group = join(
            settings, name=name, floor=side.floor, ceiling=ledger.reserved_bytes,
            initial=ledger.mapped_bytes, factor=1,
        )  # fmt: skip
    make_elastic(pool, side)
    workers, caches = [], []
    for rank in range(ranks):
        cache = apply(plan, backend="host-vmm", mode="elastic", chunk_size=PAGE)
        cache.ensure_mapped([0])
        if rank == fail_rank:
            cache.backend = FaultyBackend(cache.backend, fail_ops={"set_access", "map_run"})
        runner = Runner()
        worker_state.attach_worker(
            runner,
            worker_state.WorkerSide(
                cache=cache,
                label=f"rank{rank}",
                settings=settings,
                dump_dir=None,
                digest=geometry_digest(Ledger(plan, PAGE)),
                backend="host-vmm",
            ),
        )
        workers.append(Worker(runner))
        caches.append(cache)
    core = EngineCore(Executor(workers))
    return pool, side, core, Scheduler(), caches


def _step(side: SchedulerSide, caches: list[Any], scheduler: Any = None) -> None:
    """One engine step: give back, then the operations on every rank, the output confirming
    (``scheduler``: whether requests are unfinished, which sizes the reserve)."""
    side.before_schedule(scheduler)
    ops = side.ops()
    if ops is not None:
        for cache in caches:
            cache.release_blocks(ops.unmap)
            cache.ensure_mapped(ops.map)
        side.confirm(ops.seq)


def test_an_idle_engine_maps_its_reserve_ahead_on_every_rank() -> None:
    pool, side, core, scheduler, caches = _engine(ranks=2, limit=32 * BLOCK, reserve=6 * BLOCK)
    try:
        assert side.reserve_bytes == 0 and side.wants_ahead()  # started: only block 0 backed
        assert reclaim.reclaim_idle(core, scheduler, side)  # idle: map ahead up to the reserve
        assert side.reserve_bytes == 6 * BLOCK
        for cache in caches:
            assert cache.mapped_blocks == side.ledger.backed == set(range(7))
        # what vLLM hands out next is backed already: the next step maps nothing
        assert {b.block_id for b in pool.get_new_blocks(6)} <= side.ledger.backed
        ops = side.ops()
        assert ops is not None and ops.map == ()
        assert not side.wants_ahead()
        # a burst's blocks freed: the trim keeps the reserve; an idle engine maps no more
        pool.free_blocks(pool.blocks[b] for b in range(1, 7))
        _step(side, caches)
        assert side.reserve_bytes == 6 * BLOCK and not side.wants_ahead()
    finally:
        for cache in caches:
            cache.close()


def test_a_busy_engine_is_left_to_its_steps() -> None:
    _pool, side, core, scheduler, caches = _engine(limit=32 * BLOCK, reserve=6 * BLOCK)
    try:
        scheduler.unfinished = 1
        assert not reclaim.reclaim_idle(core, scheduler, side)
        scheduler.unfinished = 0
        side.stepping = True  # scheduled, its output not back: the step may be running
        assert not reclaim.reclaim_idle(core, scheduler, side)
        assert core.model_executor.calls == 0
    finally:
        caches[0].close()


def test_a_map_ahead_that_fails_on_one_rank_is_undone_on_every_rank() -> None:
    _pool, side, core, scheduler, caches = _engine(
        ranks=2, fail_rank=1, limit=32 * BLOCK, reserve=6 * BLOCK
    )
    try:
        assert reclaim.reclaim_idle(core, scheduler, side)
        assert side.ledger.backed == {0}  # the scheduler unbacked them
        for cache in caches:
            assert cache.mapped_blocks == {0}  # rank 0 unmapped what it had mapped
        assert not side.wants_ahead()  # not again before KVPLAN_MAP_RETRY
    finally:
        for cache in caches:
            cache.close()


def test_an_idle_borrower_gives_back_when_a_member_claims(tmp_path: Path) -> None:
    set_budget(tmp_path, 32 * BLOCK, create=True)
    pool_a, a, core_a, sched_a, caches_a = _engine(
        tmp_path, name="a", guarantee=8 * BLOCK, cache=32 * BLOCK
    )
    pool_b, b, _core_b, _sched_b, caches_b = _engine(tmp_path, name="b", guarantee=8 * BLOCK)
    assert a.group is not None and b.group is not None
    try:
        got = []
        for _ in range(6):  # a bursts, borrowing b's unused guarantee
            n = pool_a.get_num_free_blocks()
            if n <= 0:
                break
            got += pool_a.get_new_blocks(min(n, 8))
            _step(a, caches_a)
        assert a.group.granted > 24 * BLOCK
        pool_a.free_blocks(got)  # a finishes, and no step follows (as LLM.generate steps it)
        watcher = reclaim.Watcher(core_a, sched_a, a)
        assert not watcher.due()  # nothing changed: an idle engine costs two stat calls
        # b claims its guarantee
        b.demand = 8
        assert pool_b.get_num_free_blocks() < 8
        claim = next(m for m in read_snapshot(tmp_path).members if m.name == "b")
        assert claim.claim_bytes > 0
        assert watcher.due()  # the ledger changed under a
        assert reclaim.reclaim_idle(core_a, sched_a, a)  # no step of a
        assert caches_a[0].mapped_bytes == a.ledger.mapped_bytes <= a.group.granted
        time.sleep(0.06)  # b asks again once the ledger changed, at most every 50 ms
        assert pool_b.get_num_free_blocks() >= 7  # b got its guarantee
        snap = {m.name: m for m in read_snapshot(tmp_path).members}
        assert snap["b"].claim_bytes == 0
        assert snap["a"].granted_bytes + snap["b"].granted_bytes <= 32 * BLOCK
    finally:
        for cache in caches_a + caches_b:
            cache.close()


def test_the_busy_loop_is_woken_through_its_input_queue() -> None:
    _pool, side, core, scheduler, caches = _engine(limit=32 * BLOCK, reserve=4 * BLOCK)
    try:
        inbox: queue.Queue[Any] = queue.Queue()
        core.input_queue = inbox  # type: ignore[attr-defined]
        watcher = reclaim.Watcher(core, scheduler, side)
        watcher.start()
        try:
            kind, _ = inbox.get(timeout=5)  # the reserve is short: the loop is woken
        finally:
            watcher.stop()
        assert kind == reclaim.WAKE
        assert core.model_executor.calls == 0  # nothing ran on the watcher's thread
        watcher.handle()  # the loop's thread runs it
        assert side.reserve_bytes == 4 * BLOCK
        assert caches[0].mapped_blocks == side.ledger.backed
    finally:
        caches[0].close()


def test_a_stepping_engines_watcher_sleeps_until_no_request_is_unfinished() -> None:
    """While requests are unfinished the engine steps, and each step looks at the group and
    the limit: the watcher does not wake (it took the GIL and a core from the forward every
    50 ms); once a step leaves none unfinished it looks within ``WATCH_SECONDS``."""
    _pool, side, core, scheduler, caches = _engine(limit=32 * BLOCK, reserve=4 * BLOCK)
    try:
        scheduler.unfinished = 2
        side.before_schedule(scheduler)  # a step schedules with requests unfinished
        assert not side.quiet.is_set()
        inbox: queue.Queue[Any] = queue.Queue()
        core.input_queue = inbox  # type: ignore[attr-defined]
        watcher = reclaim.Watcher(core, scheduler, side)
        looks = []
        due = watcher.due
        watcher.due = lambda: looks.append(1) or due()  # type: ignore[method-assign]
        watcher.start()
        try:
            time.sleep(6 * reclaim.WATCH_SECONDS)  # six looks, were it idle
            assert looks == [] and inbox.empty()  # the reserve is short, and nobody looked
            scheduler.unfinished = 0
            side.quiet.set()  # what the last step's ``update_from_output`` does
            kind, _ = inbox.get(timeout=5)
            assert kind == reclaim.WAKE and looks
            side.quiet.clear()  # busy again: stop() still ends it at once
            started = time.monotonic()
        finally:
            watcher.stop()
        assert time.monotonic() - started < reclaim.BUSY_WATCH_SECONDS
        assert not watcher._thread.is_alive()
    finally:
        caches[0].close()


@settings(max_examples=60, deadline=None)
# found by CI: nine blocks given out and freed with no step between, then a reclaim: block 9
# was in the operations' maps *and* unmaps (the workers unmap first, so it stayed mapped
# there while the ledger counted it unbacked); ``SchedulerSide.queue`` nets them now
@example(events=[("alloc", 16), ("alloc", 29), ("free", 9), ("free", 0)])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["alloc", "free", "limit", "ahead", "step"]),
            st.integers(min_value=0, max_value=40),
        ),
        max_size=40,
    )
)
def test_mapping_ahead_never_maps_past_the_effective_limit(events: list[tuple[str, int]]) -> None:
    pool, side, core, scheduler, caches = _engine(limit=24 * BLOCK, reserve=8 * BLOCK)
    held: list[Any] = []
    try:
        for op, n in events:
            if op == "alloc":
                want = min(n % 6, pool.get_num_free_blocks())
                if want:
                    held += pool.get_new_blocks(want)
                    scheduler.unfinished = 1
            elif op == "free" and held:
                pool.free_blocks(held[: n % (len(held) + 1)])
                held = held[n % (len(held) + 1) :]
                scheduler.unfinished = int(bool(held))
            elif op == "limit":
                side.limit = max(side.floor, (4 + n) * BLOCK // 2)
                side.dirty = True
            elif op == "step":
                _step(side, caches, scheduler)
                assert side.ledger.mapped_bytes <= max(
                    side.effective_limit(), BLOCK * (1 + len(held))
                )
                assert side.reserve_bytes <= max(side.reserve_target(), side.reserve)
            else:
                limit = side.effective_limit()
                before = side.ledger.mapped_bytes
                reclaim.reclaim_idle(core, scheduler, side)
                if not scheduler.unfinished:  # it ran: within the limit, on every rank
                    assert side.ledger.mapped_bytes <= max(limit, before)
                    assert caches[0].mapped_blocks == side.ledger.backed
                    if side.ledger.mapped_bytes > before:  # it mapped ahead: free blocks only
                        assert all(pool.blocks[b].ref_cnt == 0 for b in side.ledger.backed - {0})
    finally:
        caches[0].close()


def test_a_lowered_limit_takes_the_pages_mapped_ahead_back_at_the_next_look() -> None:
    _pool, side, core, scheduler, caches = _engine(limit=32 * BLOCK, reserve=8 * BLOCK)
    try:
        assert reclaim.reclaim_idle(core, scheduler, side)
        assert side.ledger.mapped_bytes == 9 * BLOCK
        side.limit = 4 * BLOCK
        side.dirty = True
        watcher = reclaim.Watcher(core, scheduler, side)
        assert watcher.due()  # over the limit
        started = time.monotonic()
        assert reclaim.reclaim_idle(core, scheduler, side)
        assert time.monotonic() - started < 1.0
        assert side.ledger.mapped_bytes <= 4 * BLOCK
        assert caches[0].mapped_bytes == side.ledger.mapped_bytes
    finally:
        caches[0].close()


def test_a_member_that_tripped_over_a_bad_file_resumes_once_it_is_fixed(tmp_path: Path) -> None:
    import os

    from kvplan.integrations.vllm.elastic import _scheduler

    set_budget(tmp_path, 32 * BLOCK, create=True)
    pool_a, a, _core_a, _sched_a, caches_a = _engine(tmp_path, name="a", guarantee=8 * BLOCK)
    _pool_b, b, _core_b, _sched_b, caches_b = _engine(tmp_path, name="b", guarantee=8 * BLOCK)
    assert a.group is not None and b.group is not None
    try:
        lease = b.group.lease_path
        planted = lease.with_name("planted")
        planted.write_text("")
        os.replace(planted, lease)  # b's lease is no longer the file b locked
        a.demand = 24
        pool_a.get_num_free_blocks()  # a's ask reaps first and trips over b's lease
        assert a.group_failed
        assert pool_a.get_num_free_blocks() <= 8  # accounted: no more than it was granted
        os.unlink(lease)  # the operator removes the bad file
        a.group_retry_at = time.monotonic() - 1  # the next look (every 2 s) is due
        a.before_schedule()
        assert not a.group_failed  # a looks again and resumes
        assert _scheduler.GROUP_RETRY_SECONDS <= 2.0
        time.sleep(0.06)
        assert pool_a.get_num_free_blocks() > 8  # and grows again
    finally:
        for cache in caches_a + caches_b:
            cache.close()


def test_a_busy_engine_keeps_the_pages_its_steps_free_and_uses_them_first() -> None:
    """While requests are unfinished the reserve follows what the steps take (twice the most
    one step took, up to ``KVPLAN_BUSY_RESERVE``): blocks a request frees stay backed and go to
    the front of vLLM's free queue, so the next request's step maps nothing; once idle, the
    watcher gives them back down to ``KVPLAN_RESERVE``."""
    pool, side, core, scheduler, caches = _engine(limit=32 * BLOCK, reserve=0)
    try:
        assert side.busy_reserve == 8 * BLOCK  # a quarter of the limit
        scheduler.unfinished = 1
        first = pool.get_new_blocks(4)
        _step(side, caches, scheduler)
        assert list(side.taken) == [4] and side.reserve_target() == 8 * BLOCK
        pool.free_blocks(first)  # the request finished; another one is running
        _step(side, caches, scheduler)
        assert side.reserve_bytes == 4 * BLOCK and side.ledger.backed == set(range(5))
        again = pool.get_new_blocks(4)  # handed out first: no page to map
        assert {b.block_id for b in again} == {b.block_id for b in first}
        ops = side.ops()
        assert ops is None or ops.map == ()
        assert caches[0].mapped_blocks == side.ledger.backed
        pool.free_blocks(again)
        _step(side, caches, scheduler)
        scheduler.unfinished = 0  # idle now: the watcher sees the busy reserve and gives it back
        assert reclaim.Watcher(core, scheduler, side).due()
        assert reclaim.reclaim_idle(core, scheduler, side)
        assert side.ledger.backed == {0} and caches[0].mapped_blocks == {0}
        assert not reclaim.Watcher(core, scheduler, side).due()
    finally:
        caches[0].close()


def test_while_requests_wait_a_limited_engine_keeps_what_its_requests_free(
    tmp_path: Path,
) -> None:
    """Outside a group, with a limit that binds and requests waiting for blocks, the pages a
    finished request frees stay backed (up to the limit) however little the busy reserve
    is: the waiting requests take them in the step being scheduled, so giving them back
    would unmap what that step maps again. Without waiting requests, with
    ``KVPLAN_BUSY_RESERVE=0`` or in a group, the busy reserve applies as before."""
    for case in ("waiting", "none-waiting", "busy-reserve-0", "group"):
        if case == "group":
            set_budget(tmp_path / case, 64 * BLOCK, create=True)
        pool, side, _core, scheduler, caches = _engine(
            tmp_path / case if case == "group" else None, limit=32 * BLOCK, reserve=0
        )
        try:
            side.busy_reserve = 0 if case == "busy-reserve-0" else 2 * BLOCK
            scheduler.unfinished = 3
            scheduler.waiting = [] if case == "none-waiting" else ["a request"]
            taken = pool.get_new_blocks(12)
            _step(side, caches, scheduler)
            assert list(side.taken) == [12]
            pool.free_blocks(taken)  # a request finished; others run, and one waits
            _step(side, caches, scheduler)
            kept = side.reserve_bytes
            if case == "waiting":
                assert kept == 12 * BLOCK and side.ledger.backed == set(range(13))
                assert caches[0].mapped_blocks == side.ledger.backed
                assert side.reserve_target() == 32 * BLOCK  # the limit, not the busy reserve
            else:
                assert kept == side.reserve_target() <= 2 * BLOCK, case
                assert len(side.ledger.backed) == 1 + kept // BLOCK
            assert side.ledger.mapped_bytes <= side.effective_limit()
        finally:
            caches[0].close()


def test_the_busy_reserve_follows_demand_within_its_cap_and_the_limit() -> None:
    pool, side, _core, scheduler, caches = _engine(limit=16 * BLOCK, reserve=BLOCK)
    try:
        scheduler.unfinished = 1
        assert side.reserve_target() == BLOCK  # no step yet: KVPLAN_RESERVE
        side.before_schedule(scheduler)
        for taken in (1, 3, 2):
            side.handed_out(taken)
            side.ops()
        assert side.reserve_target() == min(side.busy_reserve, 2 * 3 * BLOCK) == 4 * BLOCK
        side.busy_reserve = 64 * BLOCK  # never beyond the limit
        assert side.reserve_target() == 6 * BLOCK
        side.handed_out(20)
        side.ops()
        assert side.reserve_target() == 16 * BLOCK
        side.busy_reserve = 0  # KVPLAN_BUSY_RESERVE=0: the reserve is KVPLAN_RESERVE, busy or not
        assert side.reserve_target() == BLOCK
        scheduler.unfinished = 0
        side.before_schedule(scheduler)
        side.busy_reserve = 64 * BLOCK
        assert side.reserve_target() == BLOCK  # idle
        del pool
    finally:
        caches[0].close()


def test_a_lowered_effective_limit_takes_a_busy_engines_reserve_first() -> None:
    """A lowered limit, or a group member's claim (the effective limit is the lower of the
    limit and the grant), takes the busy reserve's pages before any block in use."""
    pool, side, _core, scheduler, caches = _engine(limit=32 * BLOCK, reserve=0)
    try:
        scheduler.unfinished = 1
        held = pool.get_new_blocks(6)
        _step(side, caches, scheduler)
        pool.free_blocks(held[:4])
        _step(side, caches, scheduler)
        assert side.reserve_bytes == 4 * BLOCK
        side.limit = 4 * BLOCK
        side.dirty = True
        _step(side, caches, scheduler)
        # null block + 2 in use + what is left of the reserve: exactly what the limit allows
        assert side.ledger.mapped_bytes == 4 * BLOCK and side.reserve_bytes == BLOCK
        assert {b.block_id for b in held[4:]} < side.ledger.backed
        assert caches[0].mapped_blocks == side.ledger.backed
    finally:
        caches[0].close()
