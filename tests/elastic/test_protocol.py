"""The elastic protocol's two sides on real parts: vLLM's own ``BlockPool`` (the installed
release) made elastic, and a host-vmm cache applying the operations a step carries."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from harness import _builders as builders
from kvplan.elastic.ledger import Ledger
from kvplan.executor import apply
from kvplan.executor.backends.faults import FaultyBackend
from kvplan.executor.backends.host_vmm import HostVmmBackend
from kvplan.integrations.vllm import elastic
from kvplan.integrations.vllm.elastic import (
    ElasticOps,
    ElasticSettings,
    SchedulerSide,
    WorkerSide,
    geometry_digest,
    make_elastic,
    read_elastic_settings,
)
from kvplan.schemas.errors import Code, KVPlanError, error
from tests.elastic.test_ledger import PAGE, plan_of

NUM_BLOCKS = 64


def _pool() -> Any:
    from vllm.v1.core.block_pool import BlockPool

    return BlockPool(NUM_BLOCKS, enable_caching=True, hash_block_size=16)


def _side(**limits: int) -> tuple[Any, SchedulerSide, int]:
    plan = plan_of(builders.llama(num_blocks=NUM_BLOCKS))
    ledger = Ledger(plan, PAGE)
    block = sum(ledger.chunk_size(c) for c in ledger.chunks(1))  # 4 layers x 4 KiB
    pool = _pool()
    settings = ElasticSettings(
        limit=limits.get("blocks", NUM_BLOCKS) * block + block,
        cache_limit=limits.get("cache", 0),
        reserve=limits.get("reserve", 0),
    )
    side = SchedulerSide(ledger, settings, pool, None)
    make_elastic(pool, side)
    return pool, side, block


def _cache(pool: Any, block: Any, n: int) -> None:
    """Give ``block`` a prefix-cache entry, as ``cache_full_blocks`` does."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    key = make_block_hash_with_group_id(bytes([n]) * 32, 0)  # type: ignore[arg-type]
    pool._insert_block_hash(key, block, num_tokens=16)


def test_a_tight_limit_is_vllms_own_admission_check() -> None:
    pool, side, block = _side(blocks=4)
    assert type(pool).__name__ == "ElasticBlockPool"  # same object, new class
    assert pool.get_num_free_blocks() == 4  # vanilla: 63
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [1, 2, 3]
    assert side.ledger.mapped_bytes == 4 * block  # null block + 3
    assert pool.get_num_free_blocks() == 1
    with pytest.raises(ValueError):  # vLLM's own "cannot get N free blocks"
        pool.get_new_blocks(2)
    ops = side.ops()
    assert ops is not None and ops.map == (1, 2, 3) and ops.unmap == ()
    assert ops.live_blocks == 3 and ops.mapped_bytes == 4 * block
    assert side.ops() is None  # nothing changed: nothing sent
    assert pickle.loads(pickle.dumps(ops)) == ops  # it crosses to worker processes


def test_default_limit_is_the_reservation_and_costs_nothing() -> None:
    pool, side, _ = _side()
    assert not side.tight()
    assert pool.get_num_free_blocks() == NUM_BLOCKS - 1
    assert [b.block_id for b in pool.get_new_blocks(2)] == [1, 2]


def test_freed_blocks_are_given_back_page_aware_and_cache_entries_first() -> None:
    pool, side, block = _side(blocks=8, cache=block_bytes_of_one(), reserve=0)
    got = pool.get_new_blocks(4)
    side.ops()
    for n, b in enumerate(got[:3]):
        _cache(pool, b, n)  # three blocks hold prefix-cache entries
    pool.free_blocks(reversed(got))
    side.before_schedule()
    ops = side.ops()
    assert ops is not None
    unbacked = set(ops.unmap)
    # one cached block's pages fit under the cache limit; the others and the uncached one
    # are given back; none of the unbacked blocks still has a cache entry
    assert len(unbacked) == 3 and 4 in unbacked
    assert all(pool.blocks[b].block_hash is None for b in unbacked)
    kept = [b for b in (1, 2, 3) if b not in unbacked]
    assert len(kept) == 1 and pool.blocks[kept[0]].block_hash is not None
    assert side.ledger.mapped_bytes == 2 * block  # null block + the cached one
    assert ops.cached_blocks == 1


def block_bytes_of_one() -> int:
    ledger = Ledger(plan_of(builders.llama(num_blocks=NUM_BLOCKS)), PAGE)
    return sum(ledger.chunk_size(c) for c in ledger.chunks(1))


def test_a_prefix_hit_on_a_cached_block_needs_no_map() -> None:
    pool, side, _ = _side(blocks=8, cache=10**9)
    (b,) = pool.get_new_blocks(1)
    _cache(pool, b, 1)
    pool.free_blocks([b])
    side.before_schedule()
    side.ops()
    pool.touch([b])  # a later request hits the cached block
    assert b.block_id in side.ledger.backed
    assert side.ops() is None or side.ops() is None  # no map for a hit


def test_limit_file_changes_the_budget(tmp_path: Any) -> None:
    from kvplan.elastic.files import write_limit

    pool, side, block = _side(blocks=8)
    side.dump_dir = tmp_path
    write_limit(tmp_path, 20 * block)
    side._limit_polled = -1e9
    side.before_schedule()
    assert side.limit == 20 * block
    assert pool.get_num_free_blocks() == 19


def _worker(settings: ElasticSettings | None = None, backend: Any = "host-vmm") -> WorkerSide:
    plan = plan_of(builders.llama(num_blocks=NUM_BLOCKS))
    cache = apply(plan, backend=backend, mode="elastic", chunk_size=PAGE)
    cache.ensure_mapped([0])
    ledger = Ledger(plan, cache.chunk_bytes)
    return WorkerSide(
        cache=cache, label="rank0", settings=settings or ElasticSettings(), dump_dir=None,
        digest=geometry_digest(ledger), backend="host-vmm",
    )  # fmt: skip


def _ops(worker: WorkerSide, **kw: Any) -> ElasticOps:
    fields: dict[str, Any] = dict(
        seq=1, unmap=(), map=(), live_blocks=0, cached_blocks=0, limit_bytes=1 << 30,
        cache_limit_bytes=0, reserve_bytes=0, mapped_bytes=0, digest=worker.digest,
    )  # fmt: skip
    fields.update(kw)
    return ElasticOps(**fields)


def test_worker_maps_then_unmaps_what_the_scheduler_says() -> None:
    worker = _worker()
    with worker.cache:
        worker.apply(_ops(worker, map=(1, 2, 3), live_blocks=3))
        assert worker.cache.mapped_blocks == {0, 1, 2, 3}
        assert worker.count["maps"] == 12  # 3 blocks x 4 layers, 4 KiB
        assert worker.scheduler["live_blocks"] == 3
        worker.apply(_ops(worker, seq=2, unmap=(2, 3), map=(5,)))
        assert worker.cache.mapped_blocks == {0, 1, 5}
        assert worker.count["unmaps"] == 8 and worker.peak_mapped_bytes == 4 * 4 * PAGE


def test_worker_refuses_another_geometry() -> None:
    worker = _worker()
    with worker.cache:
        with pytest.raises(KVPlanError) as refused:
            worker.apply(_ops(worker, digest="0" * 16, map=(1,)))
        assert refused.value.code is Code.ELASTIC_GEOMETRY
        assert worker.cache.mapped_blocks == {0}


def test_a_failed_map_rolls_the_steps_maps_back_and_says_which_blocks() -> None:
    inner = HostVmmBackend(unbacked="fault")
    faulty = FaultyBackend(inner)
    worker = _worker(backend=faulty)
    faulty.fail_ops = {"map", "map_run"}
    with pytest.raises(elastic.MapFailed) as failed:
        worker.apply(_ops(worker, seq=7, map=(1, 2), live_blocks=2))
    assert failed.value.seq == 7 and failed.value.blocks == (1, 2)
    assert failed.value.error.code is Code.DRIVER_CALL_FAILED
    assert worker.cache.mapped_blocks == {0} and worker.count["failed_maps"] == 1
    assert worker.count["maps"] == 0 and inner.live().clean is False  # reservations only
    assert worker.scheduler["live_blocks"] == 2  # the rest of the step was applied
    worker.cache.close()
    assert inner.live().clean


def test_debug_fail_map_fails_the_nth_map_after_mapping_its_chunks() -> None:
    worker = _worker(ElasticSettings(fail_map=2))
    with worker.cache:
        worker.apply(_ops(worker, map=(1,)))
        with pytest.raises(elastic.MapFailed) as failed:
            worker.apply(_ops(worker, seq=2, map=(2, 3)))
        assert "injected failure" in failed.value.error.diagnostics[0].message
        assert "Rolled back: " in failed.value.error.diagnostics[0].message
        assert worker.cache.mapped_blocks == {0, 1}
        assert worker.cache.mapped_bytes == 2 * 4 * PAGE  # the rollback unmapped 2 and 3
        worker.apply(_ops(worker, seq=3, map=(2, 3)))  # the next try maps them
        assert worker.cache.mapped_blocks == {0, 1, 2, 3}


def test_debug_skip_map_leaves_one_block_unbacked() -> None:
    worker = _worker(ElasticSettings(skip_map=1))
    with worker.cache:
        worker.apply(_ops(worker, map=(1, 2, 3)))
        assert worker.cache.mapped_blocks == {0, 2, 3}  # the first: what vLLM uses first


def test_debug_skip_map_counts_an_idle_engines_map_ahead_too() -> None:
    worker = _worker(ElasticSettings(skip_map=2, fail_map=2))
    with worker.cache:
        worker.apply(_ops(worker, map=(1, 2)), between_steps=True)  # ahead: never injected
        assert worker.cache.mapped_blocks == {0, 1, 2}
        worker.apply(_ops(worker, seq=2, map=(3, 4)))  # map 2 of any kind, a step's first
        assert worker.cache.mapped_blocks == {0, 1, 2, 4}


@pytest.mark.parametrize(
    ("env", "fields"),
    [
        ({}, {"limit": None, "cache_limit": None, "reserve": None, "poison": False}),
        (
            {"KVPLAN_MEMORY_LIMIT": "24GiB", "KVPLAN_CACHE_LIMIT": "0", "KVPLAN_POISON": "1"},
            {"limit": 24 << 30, "cache_limit": 0, "poison": True},
        ),
        (
            {"KVPLAN_RESERVE": "64MiB", "KVPLAN_DEBUG_SKIP_MAP": "3"},
            {"reserve": 64 << 20, "skip_map": 3, "fail_map": None},
        ),
        (
            {"KVPLAN_DEBUG_FAIL_MAP": "2", "KVPLAN_MAP_RETRY": "0"},
            {"skip_map": None, "fail_map": 2, "map_retry": 0.0},
        ),
        (
            {"KVPLAN_MAP_RETRY": "2.5s"},
            {"map_retry": 2.5},
        ),
        (
            {"KVPLAN_BUSY_RESERVE": "2GiB"},
            {"busy_reserve": 2 << 30, "reserve": None},
        ),
        ({"KVPLAN_BUSY_RESERVE": "0"}, {"busy_reserve": 0}),
        ({}, {"busy_ahead": None, "device_latency": None}),
        ({"KVPLAN_BUSY_AHEAD": "1"}, {"busy_ahead": True}),
        ({"KVPLAN_BUSY_AHEAD": "off"}, {"busy_ahead": False}),
        ({"KVPLAN_HOST_VMM_LATENCY": "h100"}, {"device_latency": "h100"}),
    ],
)
def test_settings(env: dict[str, str], fields: dict[str, Any]) -> None:
    settings, problems = read_elastic_settings(env)
    assert problems == []
    for key, value in fields.items():
        assert getattr(settings, key) == value


@pytest.mark.parametrize(
    "env",
    [
        {"KVPLAN_MEMORY_LIMIT": "lots"},
        {"KVPLAN_MEMORY_LIMIT": "0"},
        {"KVPLAN_CACHE_LIMIT": "-1GiB"},
        {"KVPLAN_POISON": "maybe"},
        {"KVPLAN_DEBUG_SKIP_MAP": "first"},
        {"KVPLAN_DEBUG_FAIL_MAP": "0"},
        {"KVPLAN_MAP_RETRY": "-1"},
        {"KVPLAN_MAP_RETRY": "nan"},
        {"KVPLAN_MAP_RETRY": "1e9"},
        {"KVPLAN_MAP_RETRY": "soon"},
    ],
)
def test_bad_settings_are_refused(env: dict[str, str]) -> None:
    _, problems = read_elastic_settings(env)
    (problem,) = problems
    assert problem.code is Code.INTEGRATION and problem.location == next(iter(env))


def test_default_limits() -> None:
    assert elastic.default_limits(ElasticSettings(), 64 << 30) == (
        64 << 30,
        (64 << 30) // 10,
        256 << 20,
    )
    assert elastic.default_limits(ElasticSettings(limit=640 << 20), 1 << 40) == (
        640 << 20,
        64 << 20,
        10 << 20,
    )


@pytest.mark.parametrize("chunk", [PAGE, 4 * PAGE])
@pytest.mark.parametrize("seed", range(4))
def test_free_count_is_the_walk_it_shortcuts(chunk: int, seed: int) -> None:
    """Random allocations, frees, prefix hits, trims and limits on vLLM's pool: what the
    elastic pool reports free is always what the greedy walk admits — over the free queue with
    a uniform block cost (O(1)), over the admission index's order when blocks share chunks
    (``AdmissionIndex``, O(log n)) — and vLLM can always take it."""
    import random

    from kvplan.elastic.ledger import admit
    from tests.elastic.test_admission import admit_until_one_does_not_fit, model_order

    rng = random.Random(seed)
    plan = plan_of(builders.llama(num_blocks=NUM_BLOCKS))
    ledger = Ledger(plan, chunk, chunk)
    assert (ledger.uniform_block_cost is None) == (chunk != PAGE)  # 4 blocks share a chunk
    pool = _pool()
    full = ledger.full_cost(1)
    side = SchedulerSide(ledger, ElasticSettings(limit=16 * full, reserve=0), pool, None)
    make_elastic(pool, side)
    held: list[Any] = []
    tight = 0
    for step in range(200):
        side.before_schedule()
        side.ops()
        headroom = max(0, side.headroom())
        if side.index is None:
            exact = len(admit(ledger, side.free_ids(), headroom))
        else:
            free = pool.free_block_queue.get_all_free_blocks()
            cached = {b.block_id for b in free if b.block_hash is not None}
            order = model_order(ledger, [b.block_id for b in free], cached)
            exact = len(admit_until_one_does_not_fit(ledger, order, headroom))
        assert (side.index is None) == (chunk == PAGE)
        count = pool.get_num_free_blocks()
        assert count == (exact if side.tight() else pool.free_block_queue.num_free_blocks)
        tight += side.tight() and 0 < count < pool.free_block_queue.num_free_blocks
        action = rng.random()
        if action < 0.45 and count:
            got = pool.get_new_blocks(rng.randint(1, min(count, 4)))
            if rng.random() < 0.5:
                _cache(pool, got[0], step % 200)
            held.extend(got)
        elif action < 0.8 and held:
            rng.shuffle(held)
            n = rng.randint(1, len(held))
            pool.free_blocks(held[:n])
            held = held[n:]
        elif action < 0.9:
            side.limit = rng.choice([3, 5, 8, 16, 64]) * full
            side.cache_limit = rng.choice([0, 2 * full, 1 << 30])
            side.changed()
        else:
            cached = [b for b in pool.free_block_queue.get_all_free_blocks() if b.block_hash]
            if cached:
                pool.touch([cached[0]])  # a prefix hit
                held.append(cached[0])
    assert tight > 20  # the limit bound often enough for the walk to matter


def test_reset_prefix_cache_works_under_a_binding_limit() -> None:
    """vLLM resets the prefix cache only when every block but the null one is free; a binding
    limit makes fewer blocks count as free, which must not make the reset fail."""
    pool, side, _ = _side(blocks=4, cache=1 << 30)
    got = pool.get_new_blocks(3)
    _cache(pool, got[0], 1)
    pool.free_blocks(got)
    assert side.tight() and pool.get_num_free_blocks() < NUM_BLOCKS - 1
    assert pool.reset_prefix_cache()
    assert got[0].block_hash is None


def _failure(worker: WorkerSide, ops: ElasticOps) -> elastic.MapFailed:
    problem = KVPlanError(error(Code.DRIVER_CALL_FAILED, "pools.kv", "out of memory", "-"))
    return elastic.MapFailed(ops.seq, ops.map, problem)


def test_a_failed_map_that_cannot_run_refuses_the_step() -> None:
    pool, side, _ = _side()
    pool.get_new_blocks(2)
    ops = side.ops()
    assert ops is not None
    worker = _worker(ElasticSettings(poison=True))
    with worker.cache:
        with pytest.raises(KVPlanError) as refused:
            elastic.report_failure(worker, _failure(worker, ops))
        assert refused.value.code is Code.ELASTIC_MAP_FAILED
        assert "KVPLAN_POISON" in refused.value.diagnostics[0].message
        assert Code.DRIVER_CALL_FAILED in [d.code for d in refused.value.diagnostics]
        assert worker.pending_report is None


class _Output:
    """A ``ModelRunnerOutput``'s shape: a plain object with ``req_ids``."""

    req_ids = ("a",)


@pytest.mark.parametrize("executor", ["in-process", "multiprocess"])
def test_a_failed_map_rides_on_the_steps_output_to_the_scheduler(executor: str) -> None:
    """One route for every executor: the failure becomes a report on the step's output,
    which the scheduler reads back (a worker in another process holds an unpickled copy of
    the operations, and its output is pickled on the way back)."""
    pool, side, _ = _side()
    pool.get_new_blocks(2)
    ops = side.ops()
    assert ops is not None
    worker = _worker()
    with worker.cache:
        sent = ops if executor == "in-process" else pickle.loads(pickle.dumps(ops))
        report = elastic.report_failure(worker, _failure(worker, sent))
        assert (report.seq, report.blocks, report.ranks) == (ops.seq, ops.map, (0,))
        assert "out of memory" in report.message
        shared = _Output()
        carried = elastic.with_report(shared, report)
        assert carried is not shared and elastic.report_of(shared) is None
        if executor == "multiprocess":
            carried = pickle.loads(pickle.dumps(carried))  # the trip back
        back = elastic.report_of(carried)
        assert back is not None
        failed = back.failure()
        assert (failed.seq, failed.blocks) == (ops.seq, ops.map)
        assert failed.error.code is Code.ELASTIC_MAP_FAILED
        assert "out of memory" in failed.error.diagnostics[0].message


class _Worker:
    """A vLLM ``Worker``'s shape for the mode's step handlers: a runner, a step, a sampler."""

    def __init__(self) -> None:
        self.model_runner = object()

    def execute_model(self, scheduler_output: Any) -> Any:
        return None  # the V1 runner: the output comes from sample_tokens

    def sample_tokens(self, grammar_output: Any) -> Any:
        return _Output()


@pytest.mark.parametrize("carrier", ["sample_tokens", "execute_model"])
def test_a_workers_failed_map_report_rides_on_one_output_then_none(carrier: str) -> None:
    """``before_step`` holds a failed map's report; the next output carries it, once (from
    ``sample_tokens``, or from ``execute_model`` where that returns the output); the mode
    counts the reports it holds, and with none held the outputs pass as they are."""
    from kvplan.integrations.vllm.elastic import _worker as worker_state
    from kvplan.integrations.vllm.elastic._mode import ElasticMode
    from tests.elastic._calls import wrapped_call

    pool, side, _ = _side()
    pool.get_new_blocks(2)
    ops = side.ops()
    assert ops is not None
    settings = ElasticSettings(fail_map=1)  # the step's first map fails (rolled back)
    worker, vllm_worker = _worker(settings), _Worker()
    mode = ElasticMode(settings, backend="host-vmm")
    worker_state.attach_worker(vllm_worker.model_runner, worker)
    with worker.cache:

        def step(ops: ElasticOps) -> None:
            scheduled = type("SchedulerOutput", (), {elastic.OPS_ATTR: ops})()
            mode.before_step(None, wrapped_call(vllm_worker, "execute_model", scheduled))  # type: ignore[arg-type]

        def carried() -> Any:
            if carrier == "sample_tokens":
                return mode.sample_tokens(None, wrapped_call(vllm_worker, "sample_tokens", None))  # type: ignore[arg-type]
            call = wrapped_call(vllm_worker, "execute_model", type("Idle", (), {})())
            return mode.after_step(None, call, _Output())  # type: ignore[arg-type]

        step(ops)  # map #1 fails
        assert mode.reports == 1 and worker.pending_report is not None
        step(_ops(worker, seq=2, map=(5,)))  # the next step maps: the uncarried report goes
        assert mode.reports == 0 and elastic.report_of(carried()) is None
        worker.settings = ElasticSettings(fail_map=3)
        failing = _ops(worker, seq=3, map=(6, 7))
        step(failing)  # map #3 fails
        assert mode.reports == 1
        report = elastic.report_of(carried())
        assert report is not None and (report.seq, report.blocks) == (3, (6, 7))
        assert mode.reports == 0 and worker.pending_report is None
        assert elastic.report_of(carried()) is None  # carried once
    worker_state.detach_cache(worker.cache)


def test_free_ids_follow_vllms_queue_lazily() -> None:
    pool, side, _ = _side(blocks=8)
    got = pool.get_new_blocks(5)
    pool.free_blocks(got[1:3])
    expected = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    assert list(side.free_ids()) == expected  # front first, freed blocks at the back
    walk = side.free_ids()
    assert [next(walk), next(walk)] == expected[:2]  # read only as far as asked

    class Listed:  # a queue without the links: its public list is used
        def get_all_free_blocks(self) -> list[Any]:
            return pool.free_block_queue.get_all_free_blocks()

    side.pool = type("Pool", (), {"free_block_queue": Listed()})()
    assert list(side.free_ids()) == expected


def test_a_workers_snapshot_says_what_is_mapped_and_which_limit_holds() -> None:
    """The fields ``kvplan top`` shows: writer identity, the plan, the mapped chunks as runs,
    the floor and the limit asked next to the one in force (from the scheduler's ops)."""
    plan = plan_of(builders.llama(num_blocks=NUM_BLOCKS))
    cache = apply(plan, backend="host-vmm", mode="elastic", chunk_size=PAGE)
    cache.ensure_mapped([0])
    settings = ElasticSettings(limit=1 << 20)
    worker = elastic.worker_side(cache, settings, dump_dir=None, backend="host-vmm", label="rank0")
    with worker.cache:
        before = worker.snapshot()
        assert before.host and before.plan_fingerprint == worker.cache.plan.fingerprint
        assert before.asked_limit_bytes == 1 << 20 and before.floor_bytes is None
        worker.apply(_ops(worker, map=(3, 4, 5), floor_bytes=5 * PAGE, asked_limit_bytes=PAGE))
        after = worker.snapshot()
        assert after.floor_bytes == 5 * PAGE and after.asked_limit_bytes == PAGE
        chunks = worker.cache.mapped_chunk_ids()
        assert after.mapped_runs_unit == 1
        assert {pool: sum(n for _, n in runs) for pool, runs in after.mapped_runs.items()} == {
            pool: len(ids) for pool, ids in chunks.items() if ids
        }


def test_over_limit_preemptions_reach_the_snapshot_and_metrics(tmp_path: Any) -> None:
    """The scheduler's count of requests it preempted to get under the limit rides on the
    step's ops (a new count alone sends them), the worker's snapshot reports it, and
    ``/metrics`` shows it as a counter."""
    from dataclasses import replace

    from kvplan.elastic.files import write_stats
    from kvplan.integrations.vllm.metrics import EngineSource, Reader
    from tests.integrations.vllm.metrics._helpers import only, scrape

    _, side, _ = _side()
    first = side.ops()
    assert first is not None and first.over_limit_preemptions == 0
    assert side.ops() is None
    side.preempted += 3  # what before_schedule adds from preempt_over_limit
    ops = side.ops()
    assert ops is not None and ops.over_limit_preemptions == 3 and ops.map == ops.unmap == ()
    assert pickle.loads(pickle.dumps(ops)) == ops
    worker = _worker()
    with worker.cache:
        assert worker.snapshot().over_limit_preemptions == 0  # none before the first step
        worker.apply(replace(ops, digest=worker.digest))
        snap = worker.snapshot()
    assert snap.over_limit_preemptions == 3
    write_stats(tmp_path, snap)
    reader = Reader()
    reader.add(EngineSource("tiny", "0", tmp_path))
    found = scrape(reader)
    assert only(found, "kvplan_kv_over_limit_preemptions_total", rank="0") == 3


@pytest.mark.parametrize(
    ("env", "backend", "ahead"),
    [
        ({}, "host-vmm", False),  # its maps take the CPU the forward needs
        ({}, "cuda-vmm", True),  # the GPU computes while the driver's calls wait
        ({"KVPLAN_HOST_VMM_LATENCY": "h100"}, "host-vmm", True),  # sleeps, as a driver waits
        ({"KVPLAN_BUSY_AHEAD": "1"}, "host-vmm", True),
        ({"KVPLAN_BUSY_AHEAD": "0"}, "cuda-vmm", False),
        ({"KVPLAN_BUSY_AHEAD": "0", "KVPLAN_HOST_VMM_LATENCY": "a100"}, "host-vmm", False),
    ],
)
def test_a_busy_engine_maps_ahead_where_the_backend_maps_beside_the_compute(
    env: dict[str, str], backend: str, ahead: bool
) -> None:
    settings, problems = read_elastic_settings(env)
    assert problems == [] and settings.maps_ahead_busy(backend) is ahead


def test_busy_ahead_is_on_or_off() -> None:
    _settings, problems = read_elastic_settings({"KVPLAN_BUSY_AHEAD": "sometimes"})
    (problem,) = problems
    assert problem.code.value == "KVP501" and "KVPLAN_BUSY_AHEAD" in problem.message


def test_busy_ahead_with_no_reserve_to_map_ahead_in_is_refused() -> None:
    env = {"KVPLAN_BUSY_AHEAD": "1", "KVPLAN_RESERVE": "0", "KVPLAN_BUSY_RESERVE": "0"}
    _settings, problems = read_elastic_settings(env)
    (problem,) = problems
    assert problem.code.value == "KVP501" and problem.location == "KVPLAN_BUSY_AHEAD"
    assert "nothing could be mapped ahead" in problem.message
    for either in ({**env, "KVPLAN_RESERVE": "1MiB"}, {**env, "KVPLAN_BUSY_AHEAD": "0"}):
        assert read_elastic_settings(either)[1] == []


def test_a_limit_file_of_another_user_is_refused_and_logged(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine obeys a ``limit.json`` of its own user or root only; another user's (here
    ``nobody``'s, chowned: CI runs as root) is logged with its owner and ignored."""
    import logging
    import os

    from kvplan.elastic.files import write_limit

    assert os.geteuid() == 0, "CI runs as root: the test chowns to nobody"
    _, side, block = _side(blocks=8)
    before = side.limit
    side.dump_dir = tmp_path
    write_limit(tmp_path, 20 * block)
    os.chown(tmp_path / "limit.json", 65534, 65534)
    side._limit_polled = -1e9
    with caplog.at_level(logging.INFO, logger="vllm.kvplan"):
        side.before_schedule()
    assert side.limit == before
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "limit file ignored" in logged and "uid 65534" in logged, logged
    os.chown(tmp_path / "limit.json", 0, 0)  # the operator's (root's) file is obeyed
    side._limit_polled = -1e9
    with caplog.at_level(logging.INFO, logger="vllm.kvplan"):
        side.before_schedule()
    assert side.limit == 20 * block
    assert any("of uid 0" in r.getMessage() for r in caplog.records)


def test_a_limit_copied_with_its_old_time_is_noticed(tmp_path: Any) -> None:
    """``cp -p`` / ``rsync -t`` write a new limit with the old file's modification time: the
    change is seen (inode, size, change time), not missed for an unchanged mtime."""
    import os
    import shutil

    from kvplan.elastic.files import write_limit

    _, side, block = _side(blocks=8)
    side.dump_dir = tmp_path
    write_limit(tmp_path, 20 * block)
    side._limit_polled = -1e9
    side.before_schedule()
    assert side.limit == 20 * block
    old = os.stat(tmp_path / "limit.json")
    staged = tmp_path / "staged"
    staged.mkdir()
    write_limit(staged, 30 * block)
    os.utime(staged / "limit.json", ns=(old.st_atime_ns, old.st_mtime_ns))
    shutil.copy2(staged / "limit.json", tmp_path / "limit.json")  # cp -p: in place, old mtime
    assert os.stat(tmp_path / "limit.json").st_mtime_ns == old.st_mtime_ns
    side._limit_polled = -1e9
    side.before_schedule()
    assert side.limit == 30 * block
