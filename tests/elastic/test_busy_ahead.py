"""A busy engine maps its next blocks ahead, off the step (``docs/elastic.md``, "Mapping ahead
while busy"), on real parts: vLLM's ``BlockPool`` made elastic, host-vmm caches on the worker
side (one per rank), the worker's own mapping thread. The engines: ``tests/engine``."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.elastic.group import read_snapshot, set_budget
from kvplan.executor.backends.faults import FaultyBackend
from kvplan.integrations.vllm.elastic import ElasticSettings, MapFailed
from kvplan.integrations.vllm.elastic import _reclaim as reclaim
from kvplan.integrations.vllm.elastic import _recovery as recovery
from kvplan.integrations.vllm.elastic import _worker as worker_state
from kvplan.integrations.vllm.elastic._ops import ElasticOps
from kvplan.integrations.vllm.elastic._scheduler import SchedulerSide
from kvplan.schemas.errors import KVPlanError
from tests.elastic.test_reclaim import BLOCK, _engine

pytestmark = pytest.mark.vllm


def sides_of(core: Any) -> list[worker_state.WorkerSide]:
    found = [worker_state.worker_of(w.model_runner) for w in core.model_executor.workers]
    assert all(s is not None for s in found)
    return found  # type: ignore[return-value]


def step(
    side: SchedulerSide,
    core: Any,
    scheduler: Any,
    allocate: Callable[[], None] = lambda: None,
) -> ElasticOps | None:
    """One engine step as kvplan's hooks run it: give back, vLLM schedules (``allocate``),
    the busy map ahead, the operations; every rank applies them (joining the last map ahead),
    the ranks agree, each starts mapping this step's ``ahead``; the output confirms."""
    side.before_schedule(scheduler)
    allocate()
    if side.step_taken() and side.busy:
        side.map_ahead_busy()
    ops = side.ops()
    if ops is None:
        return None
    for worker in sides_of(core):
        worker.apply(ops)
        worker.start_ahead(ops.ahead)
    side.confirm(ops.seq)
    return ops


def joined(core: Any) -> None:
    for worker in sides_of(core):
        assert worker.join_ahead()[1] is None


def test_a_busy_engines_next_blocks_are_mapped_on_a_thread_while_the_step_runs() -> None:
    pool, side, core, scheduler, caches = _engine(limit=32 * BLOCK)
    (worker,) = sides_of(core)
    threads: list[str] = []
    real = caches[0].ensure_mapped

    def ensure_mapped(blocks: Any) -> int:
        threads.append(threading.current_thread().name)
        return real(blocks)

    caches[0].ensure_mapped = ensure_mapped  # type: ignore[method-assign]
    try:
        held: list[Any] = []
        scheduler.unfinished = 1
        ops = step(side, core, scheduler, lambda: held.extend(pool.get_new_blocks(3)))
        assert ops is not None and len(ops.map) == 3
        assert len(ops.ahead) == 3  # a step's worth: the next blocks vLLM hands out
        assert list(ops.ahead) == list(side.free_ids())[:3]
        assert not set(ops.ahead) & set(ops.map)
        assert side.ledger.backed == {0, *ops.map, *ops.ahead}  # counted at once
        assert threads[0] == threading.current_thread().name  # the step's own maps
        joined(core)
        assert threads[1].startswith("kvplan-ahead-rank0")  # the worker's mapping thread
        assert caches[0].mapped_blocks == side.ledger.backed
        # the next step always carries operations, so that every rank joins in it
        again = step(side, core, scheduler)
        assert again is not None and again.map == () and again.ahead == ()
        assert step(side, core, scheduler) is None  # then nothing, as before
        # the blocks handed out next were mapped ahead: the step maps nothing
        grown = step(side, core, scheduler, lambda: held.extend(pool.get_new_blocks(3)))
        assert grown is not None and grown.map == ()  # and the next three go ahead again
        assert [b.block_id for b in held[3:]] == list(ops.ahead)
        assert len(grown.ahead) == 3
        assert worker.count["busy_ahead_calls"] >= 1 and worker.count["ahead_maps"] > 0
    finally:
        caches[0].close()


def test_where_the_backend_does_not_map_beside_the_compute_a_step_maps_its_own_blocks() -> None:
    """``busy_ahead`` off (host-vmm by default): nothing goes out in ``ahead``; the next step
    maps the blocks it takes itself, and freed pages are still kept backed for reuse."""
    pool, side, core, scheduler, caches = _engine(limit=32 * BLOCK)
    side.busy_ahead = False
    try:
        held: list[Any] = []
        scheduler.unfinished = 1
        ops = step(side, core, scheduler, lambda: held.extend(pool.get_new_blocks(3)))
        assert ops is not None and len(ops.map) == 3 and ops.ahead == ()
        assert side.ledger.backed == {0, *ops.map}
        grown = step(side, core, scheduler, lambda: held.extend(pool.get_new_blocks(2)))
        assert grown is not None and len(grown.map) == 2 and grown.ahead == ()
        pool.free_blocks(held[3:])  # freed while busy: kept backed, handed out first
        again = step(side, core, scheduler, lambda: held.extend(pool.get_new_blocks(2)))
        assert again is None or again.map == ()
        assert caches[0].mapped_blocks == side.ledger.backed
        assert sides_of(core)[0]._mapper is None  # no mapping thread was started
    finally:
        caches[0].close()


def test_an_engine_that_is_not_busy_maps_nothing_ahead_in_its_steps() -> None:
    pool, side, core, scheduler, caches = _engine(limit=32 * BLOCK)
    try:
        ops = step(side, core, scheduler, lambda: pool.get_new_blocks(3))  # nothing unfinished
        assert ops is not None and ops.ahead == ()
    finally:
        caches[0].close()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["alloc", "free", "limit", "step", "idle"]),
            st.integers(min_value=0, max_value=40),
        ),
        max_size=40,
    )
)
def test_mapping_ahead_while_busy_never_maps_past_the_effective_limit(
    events: list[tuple[str, int]],
) -> None:
    """Random allocations, frees, lowered and raised limits, steps and idle reclaims, on two
    ranks: the ledger never counts more than the effective limit (or the blocks in use, when a
    lowered limit binds), every block mapped ahead was free and uncached, and once joined every
    rank holds exactly what the ledger counts."""
    pool, side, core, scheduler, caches = _engine(ranks=2, limit=24 * BLOCK, reserve=2 * BLOCK)
    held: list[Any] = []
    try:
        for op, n in events:
            if op == "alloc":
                scheduler.unfinished = 1

                def take(n: int = n) -> None:
                    want = min(n % 6, pool.get_num_free_blocks())
                    if want:
                        held.extend(pool.get_new_blocks(want))

                ops = step(side, core, scheduler, take)
            elif op == "free" and held:
                cut = n % (len(held) + 1)
                pool.free_blocks(held[:cut])
                del held[:cut]
                ops = step(side, core, scheduler)
            elif op == "limit":
                side.limit = max(side.floor, (4 + n) * BLOCK // 2)
                side.dirty = True
                ops = step(side, core, scheduler)
            elif op == "idle":
                for b in held:
                    pool.free_blocks([b])
                held.clear()
                scheduler.unfinished = 0
                step(side, core, scheduler)  # the last step's output: no request unfinished
                reclaim.reclaim_idle(core, scheduler, side)
                ops = None
            else:
                ops = step(side, core, scheduler)
            in_use = BLOCK * (1 + len({b.block_id for b in held}))
            assert side.ledger.mapped_bytes <= max(side.effective_limit(), in_use)
            if ops is not None and ops.ahead:
                assert all(pool.blocks[b].ref_cnt == 0 for b in ops.ahead)
                assert all(pool.blocks[b].block_hash is None for b in ops.ahead)
            joined(core)
            for cache in caches:
                assert cache.mapped_blocks == side.ledger.backed
    finally:
        for cache in caches:
            cache.close()


def test_pages_mapped_ahead_go_back_at_the_next_step_when_the_limit_drops() -> None:
    pool, side, core, scheduler, caches = _engine(limit=32 * BLOCK)
    try:
        scheduler.unfinished = 1
        ops = step(side, core, scheduler, lambda: pool.get_new_blocks(3))
        assert ops is not None and len(ops.ahead) == 3
        side.limit = 5 * BLOCK  # null block + 3 in use + 1
        side.dirty = True
        lowered = step(side, core, scheduler)  # joins the map ahead, then unmaps
        assert lowered is not None and set(lowered.unmap) >= set(ops.ahead[1:])
        assert side.ledger.mapped_bytes <= 5 * BLOCK
        assert caches[0].mapped_blocks == side.ledger.backed
    finally:
        caches[0].close()


def test_a_members_claim_takes_the_pages_its_neighbour_mapped_ahead(tmp_path: Path) -> None:
    set_budget(tmp_path, 32 * BLOCK, create=True)
    pool_a, a, core_a, sched_a, caches_a = _engine(tmp_path, name="a", guarantee=8 * BLOCK)
    pool_b, b, _core_b, _sched_b, caches_b = _engine(tmp_path, name="b", guarantee=12 * BLOCK)
    assert a.group is not None and b.group is not None
    held: list[Any] = []
    try:
        sched_a.unfinished = 1
        for _ in range(3):  # a bursts, borrowing b's unused guarantee, and maps ahead
            step(a, core_a, sched_a, lambda: held.extend(pool_a.get_new_blocks(5)))
        ahead = a.ledger.backed - {0} - {b.block_id for b in held}
        assert ahead and 20 * BLOCK < a.ledger.mapped_bytes <= a.effective_limit()
        b.demand = 12  # b claims its guarantee
        assert pool_b.get_num_free_blocks() < 12
        assert next(m for m in read_snapshot(tmp_path).members if m.name == "b").claim_bytes
        a.group._next_tick = 0.0  # type: ignore[attr-defined]  # the next step looks
        ops = step(a, core_a, sched_a)  # one step of a: its tick sees the claim
        joined(core_a)
        assert ops is not None and set(ops.unmap) <= ahead  # only pages mapped ahead went
        assert caches_a[0].mapped_bytes == a.ledger.mapped_bytes <= a.effective_limit()
        assert a.effective_limit() <= 20 * BLOCK  # b's guarantee is b's again
        assert {b.block_id for b in held} <= a.ledger.backed  # no block in use lost a page
    finally:
        for cache in caches_a + caches_b:
            cache.close()


# -- the worker: a map ahead that fails ------------------------------------------------------


def _ops(worker: worker_state.WorkerSide, seq: int, **fields: Any) -> ElasticOps:
    base: dict[str, Any] = dict(
        seq=seq, unmap=(), map=(), live_blocks=0, cached_blocks=0, limit_bytes=0,
        cache_limit_bytes=0, reserve_bytes=0, mapped_bytes=0, digest=worker.digest,
    )  # fmt: skip
    return ElasticOps(**{**base, **fields})


def _failing_ahead(worker: worker_state.WorkerSide, times: int) -> None:
    """The next ``times`` maps of ``worker`` fail granting access and roll back (the worker's
    own fault injection, whatever ``KVPLAN_DEBUG_FAIL_MAP`` says)."""
    real = worker._map
    left = [times]

    def flaky(blocks: tuple[int, ...], inject: bool) -> None:
        inject = inject or left[0] > 0
        left[0] -= 1
        return real(blocks, inject)

    worker._map = flaky  # type: ignore[method-assign]


def test_an_unmap_of_a_block_still_being_mapped_ahead_waits_for_that_map() -> None:
    """The next operations give back a block whose map ahead has not even started: the worker
    joins first, so the unmap comes after the map and the block ends unmapped."""
    _pool, _side, core, _scheduler, caches = _engine(limit=32 * BLOCK)
    (worker,) = sides_of(core)
    go = threading.Event()
    real = worker._map

    def late(blocks: tuple[int, ...], inject: bool) -> None:
        go.wait(5)
        return real(blocks, inject)

    worker._map = late  # type: ignore[method-assign]
    try:
        worker.start_ahead((3, 4))
        threading.Timer(0.2, go.set).start()
        worker.apply(_ops(worker, 2, unmap=(4,)))
        assert caches[0].mapped_blocks == {0, 3}
        assert worker.step_blocks == (3,)
    finally:
        go.set()
        caches[0].close()


@pytest.mark.parametrize("failures", [0, 1, 2])
def test_a_failed_map_ahead_is_mapped_again_with_the_next_step(failures: int) -> None:
    """A map ahead that fails is rolled back on its thread; the next step maps those blocks
    again with its own. When that fails too, it is the step's failed map: every block of the
    step (its own and the ones mapped ahead) is released, and the failure names them all."""
    _pool, _side, core, _scheduler, caches = _engine(limit=32 * BLOCK)
    (worker,) = sides_of(core)
    try:
        worker.apply(_ops(worker, 1, map=(1, 2)))
        _failing_ahead(worker, failures)
        worker.start_ahead((3, 4, 5))
        nxt = _ops(worker, 2, map=(6,), unmap=(5,))  # 5 given back before it was used
        if failures < 2:
            worker.apply(nxt)
            assert caches[0].mapped_blocks == {0, 1, 2, 3, 4, 6}
        else:
            with pytest.raises(MapFailed) as failed:
                worker.apply(nxt)
            assert failed.value.blocks == (6, 3, 4) == worker.step_blocks
            assert caches[0].mapped_blocks == {0, 1, 2}
        assert worker.step_blocks == (6, 3, 4)  # joined the map ahead, less block 5
        assert worker.count["failed_maps"] == failures
    finally:
        caches[0].close()


def test_a_failed_step_map_releases_the_blocks_it_joined_mapped_ahead() -> None:
    _pool, _side, core, _scheduler, caches = _engine(limit=32 * BLOCK)
    (worker,) = sides_of(core)
    try:
        worker.start_ahead((3, 4, 5))
        assert worker.join_ahead() == ((3, 4, 5), None)
        worker.start_ahead((7, 8))  # mapped ahead, fine
        assert worker._ahead is not None and worker._ahead[1].result() is None  # done
        _failing_ahead(worker, 1)  # the step's own map fails
        with pytest.raises(MapFailed) as failed:
            worker.apply(_ops(worker, 2, map=(9,)))
        assert failed.value.blocks == (9, 7, 8)
        assert caches[0].mapped_blocks == {0, 3, 4, 5}
    finally:
        caches[0].close()


def test_debug_fail_map_counts_a_busy_engines_maps_ahead_and_fails_their_retry() -> None:
    _pool, _side, core, _scheduler, caches = _engine(limit=32 * BLOCK)
    (worker,) = sides_of(core)
    worker.settings = ElasticSettings(fail_map=2)
    try:
        worker.apply(_ops(worker, 1, map=(1,)))  # map 1
        worker.start_ahead((2, 3))  # map 2: fails on the thread
        with pytest.raises(MapFailed) as failed:
            worker.apply(_ops(worker, 2))  # its retry fails too
        assert failed.value.blocks == (2, 3)
        assert worker.count["failed_maps"] == 2
        worker.apply(_ops(worker, 3, map=(2, 3)))  # injected once: the next map succeeds
        assert caches[0].mapped_blocks == {0, 1, 2, 3}
    finally:
        caches[0].close()


def test_a_peer_that_failed_makes_every_rank_release_the_blocks_it_joined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _pool, _side, core, _scheduler, caches = _engine(limit=32 * BLOCK)
    (worker,) = sides_of(core)
    try:
        worker.start_ahead((3, 4))
        worker.apply(_ops(worker, 2, map=(5,)))  # joined and mapped here
        assert caches[0].mapped_blocks == {0, 3, 4, 5}
        monkeypatch.setattr(recovery, "failed_ranks", lambda failed, groups: (1,))
        failed = recovery.agree_across_ranks(worker, 2, worker.step_blocks, None, [object()])
        assert failed is not None and failed.blocks == (5, 3, 4) and failed.ranks == (1,)
        assert caches[0].mapped_blocks == {0}
    finally:
        caches[0].close()


def test_an_idle_engine_undoes_a_busy_map_ahead_that_failed_on_one_rank() -> None:
    """The engine went idle right after a step that mapped ahead: the idle reclaim's
    operations join that map; it failed on rank 1 and fails again, so every rank unmaps those
    blocks and the scheduler unbacks them (free blocks: no request's concern)."""
    pool, side, core, scheduler, caches = _engine(ranks=2, limit=32 * BLOCK)
    ranks = sides_of(core)
    try:
        scheduler.unfinished = 1
        held = []
        ahead_ops = step(side, core, scheduler, lambda: held.extend(pool.get_new_blocks(3)))
        assert ahead_ops is not None and ahead_ops.ahead
        ranks[1].join_ahead()  # rank 1's map ahead: done over, as failed
        caches[1].release_blocks(ahead_ops.ahead)
        failing: Any = FaultyBackend(caches[1].backend, fail_ops={"set_access", "map_run"})
        ranks[1]._ahead = (ahead_ops.ahead, _done(KVPlanError(_problem())))
        caches[1].backend = failing
        pool.free_blocks(held)
        scheduler.unfinished = 0
        side.busy = False
        assert reclaim.reclaim_idle(core, scheduler, side)
        assert not set(ahead_ops.ahead) & side.ledger.backed
        for cache in caches:
            assert not set(ahead_ops.ahead) & cache.mapped_blocks
        caches[1].backend = failing.inner
    finally:
        for cache in caches:
            cache.close()


def _problem() -> Any:
    from kvplan.schemas.errors import Code, error

    return error(Code.DRIVER_CALL_FAILED, "test", "map ahead failed", "none")


def _done(outcome: Any) -> Any:
    from concurrent.futures import Future

    future: Future[Any] = Future()
    future.set_result(outcome)
    return future


def test_closing_the_cache_waits_for_a_map_ahead_in_flight() -> None:
    """The worker's cache may be closed (engine shutdown) while its thread maps ahead: the
    cache's lock makes the close wait, and everything is released."""
    with tempfile.TemporaryDirectory():
        _pool, _side, core, _scheduler, caches = _engine(limit=32 * BLOCK)
        (worker,) = sides_of(core)
        started, go = threading.Event(), threading.Event()
        real = caches[0].backend
        map_run = real.map_run

        def slow_map_run(*args: Any, **kwargs: Any) -> Any:
            started.set()
            go.wait(5)
            return map_run(*args, **kwargs)

        real.map_run = slow_map_run  # type: ignore[method-assign]
        worker.start_ahead((1, 2, 3))
        assert started.wait(5)
        closer = threading.Thread(target=caches[0].close)
        closer.start()
        closer.join(0.2)
        assert closer.is_alive()  # waiting for the map in flight
        go.set()
        closer.join(5)
        assert caches[0].closed and caches[0].mapped_bytes == 0
        worker_state.detach_cache(caches[0])
        assert worker._mapper is not None and worker._mapper._shutdown  # type: ignore[attr-defined]
