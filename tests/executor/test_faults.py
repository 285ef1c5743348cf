"""Transactions: fail every backend call in turn; nothing may be left mapped or reserved."""

from __future__ import annotations

import pytest

from harness.executor import _plans as plans
from kvplan.executor import apply
from kvplan.executor.backends.faults import FaultyBackend
from kvplan.executor.backends.host_vmm import HostVmmBackend
from kvplan.executor.backends.meta import MetaBackend
from kvplan.schemas.errors import Code, KVPlanError
from kvplan.schemas.plan import BindingPlan
from tests.executor.conftest import memfd_lines, open_fds, perms_at

MiB = 1 << 20
RUNS = pytest.mark.parametrize("runs", [False, True], ids=["per-chunk", "runs"])
"""Both ways host-vmm backs memory: a handle per chunk (CUDA's path) and a run per call."""


def calls_needed(plan: BindingPlan, runs: bool, **kw: object) -> int:
    """Backend calls ``apply`` makes (close not counted)."""
    probe = FaultyBackend(HostVmmBackend(assume_zeroed=False, runs=runs))
    cache = apply(plan, backend=probe, **kw)  # type: ignore[arg-type]
    total = probe.calls.total
    cache.close()
    return total


def reserved_addresses(backend: HostVmmBackend) -> list[int]:
    return list(backend._reservations)


@pytest.mark.parametrize(
    ("plan", "kw"),
    [
        (plans.two_pool_plan(num_blocks=16), {"chunk_size": 64 * 1024}),
        (plans.gemma_plan(num_blocks=128), {"chunk_size": 2 << 20}),
    ],
    ids=["two-pools", "gemma"],
)
@RUNS
def test_apply_fails_at_every_call(plan: BindingPlan, kw: dict[str, object], runs: bool) -> None:
    total = calls_needed(plan, runs, **kw)
    assert total > (10 if not runs else 5)
    fds = open_fds()
    for n in range(total):
        inner = HostVmmBackend(assume_zeroed=False, runs=runs)
        seen: list[int] = []
        reserve = inner.reserve

        def spy(size: int, alignment: int, _reserve=reserve, _seen=seen) -> int:
            address = _reserve(size, alignment)
            _seen.append(address)
            return address

        inner.reserve = spy  # type: ignore[method-assign]
        faulty = FaultyBackend(inner, fail_at=n)
        with pytest.raises(KVPlanError) as e:
            apply(plan, backend=faulty, **kw)  # type: ignore[arg-type]
        assert e.value.code is Code.DRIVER_CALL_FAILED, e.value
        index, op = faulty.failed[0]
        assert index == n
        text = str(e.value)
        assert inner.call_names.get(op, op) in text and "Rolled back" in text
        if op not in ("granularity", "synchronize"):
            assert "pool '" in text and "bytes [" in text
        assert inner.live().clean, (n, inner.live())
        assert memfd_lines(inner.memfd_name) == [], n
        for address in seen:
            assert perms_at(address) is None or not perms_at(address).startswith("rw")
        assert open_fds() <= fds


@RUNS
def test_ensure_mapped_fails_at_every_call(runs: bool) -> None:
    plan = plans.llama_plan(layers=4, num_blocks=64)
    blocks = [0, 40]
    probe = FaultyBackend(HostVmmBackend(assume_zeroed=False, runs=runs))
    with apply(plan, backend=probe, mode="elastic") as cache:  # type: ignore[arg-type]
        start = probe.calls.total
        cache.ensure_mapped([5])
        base = probe.calls.total
        cache.ensure_mapped(blocks)
        per_call = probe.calls.total - base
    assert per_call > (8 if not runs else 4) and base > start
    for n in range(per_call):
        inner = HostVmmBackend(assume_zeroed=False, runs=runs)
        faulty = FaultyBackend(inner)
        with apply(plan, backend=faulty, mode="elastic") as cache:  # type: ignore[arg-type]
            cache.ensure_mapped([5])
            before = (cache.mapped_bytes, cache.mapped_chunks, inner.live())
            faulty.fail_at = faulty.calls.total + n
            with pytest.raises(KVPlanError) as e:
                cache.ensure_mapped(blocks)
            assert e.value.code is Code.DRIVER_CALL_FAILED
            assert (cache.mapped_bytes, cache.mapped_chunks, inner.live()) == before
            assert cache.mapped_blocks == {5}
            assert len(memfd_lines(inner.memfd_name)) == before[2].mappings
            cache.ensure_mapped(blocks)  # the cache is still usable
            assert cache.mapped_blocks == {0, 5, 40}
        assert inner.live().clean


@RUNS
def test_error_names_call_pool_and_bytes(runs: bool) -> None:
    plan = plans.llama_plan(layers=2, num_blocks=64)
    inner = HostVmmBackend(runs=runs)
    faulty = FaultyBackend(inner, fail_ops={"map", "map_run"})
    with pytest.raises(KVPlanError) as e:
        apply(plan, backend=faulty, chunk_size=2 << 20)  # type: ignore[arg-type]
    diag = e.value.diagnostics[0]
    assert diag.code is Code.DRIVER_CALL_FAILED and diag.location == "pools.kv"
    assert "mmap(MAP_FIXED|MAP_SHARED) failed during apply" in diag.message
    if runs:  # the pool's first run is all of it, nothing is left but its reservation
        assert "pool 'kv' bytes [0, 8388608) (8.00 MiB)" in diag.message
        assert "1 free" in diag.message and "release" not in diag.message
    else:
        assert "pool 'kv' bytes [0, 2097152) (2.00 MiB)" in diag.message
        assert "1 release" in diag.message and "1 free" in diag.message
    assert inner.live().clean


def test_rollback_errors_are_reported() -> None:
    inner = MetaBackend()
    faulty = FaultyBackend(inner, fail_ops={"set_access", "unmap"})
    with pytest.raises(KVPlanError) as e:
        apply(plans.llama_plan(layers=2, num_blocks=64), backend=faulty)  # type: ignore[arg-type]
    assert "Rollback errors" in str(e.value) and "unmap" in str(e.value)
    assert inner.live().mappings > 0 and inner.live().reservations == 1  # what could not be undone


@RUNS
def test_release_failure_keeps_chunk_mapped(runs: bool) -> None:
    inner = HostVmmBackend(runs=runs)
    faulty = FaultyBackend(inner)
    plan = plans.llama_plan(layers=1, num_blocks=64)
    with apply(plan, backend=faulty, mode="elastic", chunk_size=2 * MiB) as cache:  # type: ignore[arg-type]
        cache.ensure_mapped([0])
        faulty.fail_ops = {"unmap", "unmap_run"}
        with pytest.raises(KVPlanError) as e:
            cache.release_blocks([0])
        assert e.value.code is Code.DRIVER_CALL_FAILED and "stay mapped" in str(e.value)
        assert cache.mapped_bytes == 2 * MiB and cache.mapped_blocks == frozenset()
        faulty.fail_ops = set()
        assert cache.ensure_mapped([0]) == 0  # chunk still mapped: reused
    assert inner.live().clean


def test_close_reports_failures_and_is_retryable() -> None:
    # Before: a failed close marked the cache closed and the rest could never be released.
    inner = MetaBackend()
    faulty = FaultyBackend(inner)
    cache = apply(plans.llama_plan(layers=1, num_blocks=64), backend=faulty)  # type: ignore[arg-type]
    faulty.fail_ops = {"unmap"}
    with pytest.raises(KVPlanError) as e:
        cache.close()
    assert e.value.code is Code.CLOSE_INCOMPLETE
    text = str(e.value)
    assert "mapped chunks" in text and "reservation" in text and "close() again" in text
    assert not cache.closed and cache.closing and not cache.tensors
    assert not inner.live().clean
    with pytest.raises(RuntimeError):
        cache.ensure_mapped([0])
    faulty.fail_ops = set()
    cache.close()  # retries what was left
    assert cache.closed and inner.live().clean
    cache.close()  # idempotent once done


def _close_calls(plan: object, **kw: object) -> tuple[int, int]:
    probe = FaultyBackend(HostVmmBackend(assume_zeroed=False))
    cache = apply(plan, backend=probe, **kw)  # type: ignore[arg-type]
    cache.ensure_mapped(range(16))  # no-op in eager mode
    before = probe.calls.total
    cache.close()
    return before, probe.calls.total


@pytest.mark.parametrize("mode", ["eager", "elastic"])
def test_every_failed_close_call_can_be_retried(mode: str) -> None:
    plan = plans.two_pool_plan(num_blocks=16)
    kw = {"chunk_size": 64 * 1024, "mode": mode}
    start, end = _close_calls(plan, **kw)
    assert end > start
    for index in range(start, end):
        inner = HostVmmBackend(assume_zeroed=False)
        faulty = FaultyBackend(inner)
        cache = apply(plan, backend=faulty, **kw)  # type: ignore[arg-type]
        cache.ensure_mapped(range(16))
        assert faulty.calls.total == start
        faulty.fail_at = index
        with pytest.raises(KVPlanError) as e:
            cache.close()
        assert e.value.code is Code.CLOSE_INCOMPLETE, index
        if cache.closed:  # only a failed synchronize leaves nothing behind
            assert inner.live().clean
            continue
        cache.close()
        assert cache.closed and inner.live().clean, index


def test_backend_failure_in_view_building_rolls_back() -> None:
    inner = HostVmmBackend()
    faulty = FaultyBackend(inner, fail_ops={"wrap"})
    with pytest.raises(KVPlanError) as e:
        apply(plans.gemma_plan(num_blocks=16), backend=faulty)  # type: ignore[arg-type]
    assert "torch.frombuffer failed" in str(e.value)
    assert inner.live().clean
