"""cuda-vmm ``unbacked="scratch"`` on the CPU, against a fake driver that checks the calls.

The fake (``tests/executor/_fake_cuda.py``) refuses what CUDA refuses (mapping over a mapping,
unmapping part of one, access over a hole, freeing a reservation with mappings), so these
tests prove the call sequence; ``test_cuda_vmm_gpu.py`` runs the same on a real GPU.
"""

from __future__ import annotations

import pytest
import torch

from harness.executor import _plans as plans
from kvplan.executor import apply
from kvplan.executor.backends import cuda_vmm
from kvplan.executor.backends.base import BackendCallError
from kvplan.executor.backends.cuda_vmm import CudaVmmBackend
from kvplan.schemas.errors import Code, KVPlanError
from tests.executor._fake_cuda import FakeDriver

G = 2 << 20  # the fake's granularity, CUDA's usual one


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    drv = FakeDriver(gran=G)
    monkeypatch.setattr(cuda_vmm, "load_driver", lambda: drv)
    monkeypatch.setattr(cuda_vmm, "touch_torch_device", lambda device: 0)
    return drv


def make(fake: FakeDriver, unbacked: str = "scratch") -> CudaVmmBackend:
    be = CudaVmmBackend(unbacked=unbacked)

    def zero(address: int, size: int) -> None:
        assert fake.cuMemsetD8Async(address, 0, size, 0) == (0,)

    # What needs a real device: wrapping (meta tensors stand in) and stream work.
    be.wrap = lambda address, size: torch.empty(size, dtype=torch.int8, device="meta")  # type: ignore[method-assign]
    be.zero = zero  # type: ignore[method-assign]
    be.synchronize = lambda: None  # type: ignore[method-assign]
    be.device = "meta"
    return be


def granules(base: int, size: int) -> range:
    return range(base, base + size, G)


def scratch_handle(fake: FakeDriver) -> int:
    (handle,) = {h for (_, _, h) in fake.calls("cuMemMap")[:1]}
    return int(handle)


def test_unknown_unbacked_mode_is_refused_before_any_driver_call() -> None:
    with pytest.raises(KVPlanError) as e:
        CudaVmmBackend(unbacked="zero-page")
    assert e.value.code is Code.BACKEND_UNAVAILABLE and "'scratch'" in str(e.value)


def test_fault_mode_maps_nothing_at_reserve(fake: FakeDriver) -> None:
    be = make(fake, "fault")
    base = be.reserve(4 * G, G)
    assert fake.calls("cuMemMap") == [] and fake.calls("cuMemCreate") == []
    assert all(fake.access(a) == "fault" for a in granules(base, 4 * G))
    handle = be.create(G)
    be.map(base, G, handle)
    be.set_access(base, G)
    be.release(handle)
    be.unmap(base, G)
    assert fake.access(base) == "fault"
    be.free(base, 4 * G)
    assert be.live().clean and fake.reservations == {} and fake.allocations == {}


def test_reserve_maps_one_scratch_granule_everywhere(fake: FakeDriver) -> None:
    be = make(fake)
    base = be.reserve(4 * G, G)
    assert [args[0] for args in fake.calls("cuMemCreate")] == [G]  # ONE granule
    maps = fake.calls("cuMemMap")
    assert [(a, s) for a, s, _ in maps] == [(a, G) for a in granules(base, 4 * G)]
    assert len({h for _, _, h in maps}) == 1  # the same handle at every granule
    assert fake.calls("cuMemSetAccess") == [(base, 4 * G)]  # read/write, one call
    assert fake.calls("cuMemsetD8") == [(base, G)] and fake.calls("cuCtxSynchronize")
    scratch = f"handle:{scratch_handle(fake)}"
    assert all(fake.access(a) == scratch for a in granules(base, 4 * G))
    assert be.live().mappings == 0 and be.live().handles == 0  # not user mappings
    assert be.scratch_live() == (1, 4)
    second = be.reserve(2 * G, G)
    assert len(fake.calls("cuMemCreate")) == 1 and be.scratch_live() == (1, 6)
    assert len(fake.calls("cuMemsetD8")) == 1  # zeroed once
    be.free(second, 2 * G)
    assert be.scratch_live() == (1, 4)  # another reservation still uses it
    be.free(base, 4 * G)
    assert be.scratch_live() == (0, 0) and fake.allocations == {} and fake.mappings == {}
    assert be.live().clean and fake.reservations == {}


def test_map_replaces_scratch_and_unmap_restores_it(fake: FakeDriver) -> None:
    be = make(fake)
    base = be.reserve(4 * G, G)
    scratch = f"handle:{scratch_handle(fake)}"
    chunk = base + G
    handle = be.create(2 * G)
    start = len(fake.log)
    be.map(chunk, 2 * G, handle)
    sequence = [(name, args[:2]) for name, args in fake.log[start:]]
    assert sequence == [
        ("cuMemUnmap", (chunk, G)),
        ("cuMemUnmap", (chunk + G, G)),
        ("cuMemMap", (chunk, 2 * G)),
    ]
    be.set_access(chunk, 2 * G)
    be.release(handle)
    assert be.live().mappings == 1 and be.scratch_live() == (1, 2)
    assert [fake.access(a) for a in granules(base, 4 * G)] == [
        scratch,
        f"handle:{handle}",
        f"handle:{handle}",
        scratch,
    ]
    start = len(fake.log)
    be.unmap(chunk, 2 * G)
    sequence = [(name, args[:2]) for name, args in fake.log[start:]]
    assert sequence == [
        ("cuMemUnmap", (chunk, 2 * G)),
        ("cuMemMap", (chunk, G)),
        ("cuMemMap", (chunk + G, G)),
        ("cuMemSetAccess", (chunk, 2 * G)),
    ]
    assert all(fake.access(a) == scratch for a in granules(base, 4 * G))
    assert handle not in fake.allocations  # the chunk's memory is gone
    assert be.live().mappings == 0 and be.scratch_live() == (1, 4)
    be.free(base, 4 * G)
    assert be.live().clean and fake.allocations == {} and fake.reservations == {}


def test_failed_chunk_map_puts_scratch_back(fake: FakeDriver) -> None:
    be = make(fake)
    base = be.reserve(2 * G, G)
    scratch = f"handle:{scratch_handle(fake)}"
    handle = be.create(G)
    fake.fail["cuMemMap"] = 0  # the chunk's own map
    with pytest.raises(BackendCallError) as e:
        be.map(base, G, handle)
    assert e.value.call == "cuMemMap"
    assert all(fake.access(a) == scratch for a in granules(base, 2 * G))
    be.release(handle)
    be.free(base, 2 * G)
    assert fake.allocations == {} and fake.reservations == {} and be.live().clean


def test_failed_scratch_refill_is_reported_and_retried(fake: FakeDriver) -> None:
    be = make(fake)
    base = be.reserve(2 * G, G)
    scratch = f"handle:{scratch_handle(fake)}"
    handle = be.create(G)
    be.map(base, G, handle)
    be.set_access(base, G)
    be.release(handle)
    fake.fail["cuMemMap"] = 0  # the scratch refill after the unmap
    with pytest.raises(BackendCallError) as e:
        be.unmap(base, G)
    assert "scratch granule over unmapped" in str(e.value)
    assert fake.access(base) == "fault" and handle not in fake.allocations
    be.unmap(base, G)  # what the executor does next (release retry or close): refills
    assert fake.access(base) == scratch and be.live().mappings == 0
    be.free(base, 2 * G)
    assert fake.allocations == {} and fake.reservations == {} and be.live().clean


def test_failed_scratch_at_reserve_leaves_nothing(fake: FakeDriver) -> None:
    be = make(fake)
    fake.fail["cuMemMap"] = 2  # the third granule
    with pytest.raises(BackendCallError):
        be.reserve(4 * G, G)
    assert fake.reservations == {} and fake.mappings == {} and fake.allocations == {}
    assert be.scratch_live() == (0, 0) and be.live().clean


def test_elastic_apply_never_leaves_a_hole(fake: FakeDriver) -> None:
    """Through the executor: every granule reads memory at every step, blocks map and unmap."""
    plan = plans.llama_plan(layers=4, num_blocks=128)  # 4 layers x 8 MiB
    be = make(fake)
    with apply(plan, backend=be, mode="elastic") as cache:
        assert cache.chunk_bytes == G  # elastic default: the granularity
        (base,) = fake.reservations
        size = fake.reservations[base]
        scratch = f"handle:{scratch_handle(fake)}"

        def holes() -> list[int]:
            return [a for a in granules(base, size) if fake.access(a) == "fault"]

        assert holes() == [] and be.live().mappings == 0
        cache.ensure_mapped([0, 1, 100])
        assert holes() == [] and be.live().mappings == cache.mapped_chunks["kv"] == 8
        backed = [a for a in granules(base, size) if fake.access(a) != scratch]
        assert len(backed) == 8
        cache.release_blocks([0, 1])
        assert holes() == [] and be.live().mappings == 4
        cache.release_blocks([100])
        assert holes() == [] and be.live().mappings == 0 and cache.mapped_bytes == 0
        assert be.scratch_live() == (1, size // G)
    assert be.live().clean and be.scratch_live() == (0, 0)
    assert fake.reservations == {} and fake.mappings == {} and fake.allocations == {}


def _full_run(be: CudaVmmBackend) -> None:
    plan = plans.llama_plan(layers=2, num_blocks=64)  # 2 x 4 MiB
    cache = apply(plan, backend=be, mode="elastic")
    try:
        try:
            cache.ensure_mapped([0, 40])
        except KVPlanError as exc:
            assert exc.code is Code.DRIVER_CALL_FAILED
        try:
            cache.release_blocks([0, 40])
        except KVPlanError as exc:
            assert exc.code is Code.DRIVER_CALL_FAILED
    finally:
        try:
            cache.close()
        except KVPlanError:
            cache.close()  # retry what is left, as documented


@pytest.mark.parametrize("call", ["cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemCreate"])
def test_every_failure_leaves_the_driver_clean(fake: FakeDriver, call: str) -> None:
    """Fail each call of one kind in turn over a whole elastic lifetime: nothing leaks."""
    be = make(fake)
    _full_run(be)
    total = len(fake.calls(call))
    assert total >= 2
    for n in range(total):
        fake.log.clear()
        fake.fail = {call: n}
        be = make(fake)
        try:
            _full_run(be)
        except KVPlanError as exc:
            assert exc.code is Code.DRIVER_CALL_FAILED  # apply itself failed: rolled back
        assert call not in fake.fail, (call, n)  # the failure did happen
        assert fake.reservations == {}, (call, n)
        assert fake.mappings == {}, (call, n)
        assert fake.allocations == {}, (call, n)
        assert be.live().clean and be.scratch_live() == (0, 0)


def test_close_releases_a_leftover_scratch_handle(fake: FakeDriver) -> None:
    be = make(fake)
    base = be.reserve(G, G)
    fake.fail["cuMemRelease"] = 0
    be.free(base, G)
    assert be.scratch_live() == (1, 0)  # release failed: kept for close()
    be.close()
    assert be.scratch_live() == (0, 0) and fake.allocations == {}


def test_scratch_option_reaches_the_backend_through_apply(
    fake: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``apply(..., backend="cuda-vmm", unbacked="scratch")`` passes the option on."""
    meta = torch.empty(0, dtype=torch.int8, device="meta")
    monkeypatch.setattr(CudaVmmBackend, "wrap", lambda self, a, n: meta.new_empty(n))
    monkeypatch.setattr(CudaVmmBackend, "zero", lambda self, a, n: None)
    monkeypatch.setattr(CudaVmmBackend, "synchronize", lambda self: None)
    monkeypatch.setattr(CudaVmmBackend, "device", "meta", raising=False)
    plan = plans.llama_plan(layers=1, num_blocks=64)
    with apply(plan, backend="cuda-vmm", mode="elastic", unbacked="scratch") as cache:
        be = cache.backend
        assert isinstance(be, CudaVmmBackend) and be.unbacked == "scratch"
        assert be.scratch_live() == (1, 2) and be.live().mappings == 0
    assert fake.reservations == {} and fake.mappings == {} and fake.allocations == {}


def test_fresh_chunks_are_zeroed_on_a_stream_of_their_own(
    fake: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A map zeroes its fresh chunks on the backend's own non-blocking stream and waits for
    that stream alone (``wait_zeroed``): a map made on a worker's thread while a forward runs
    neither waits for the forward nor queues behind it. An unmap still waits for the device
    (``synchronize``); the stream is destroyed with the backend."""
    meta = torch.empty(0, dtype=torch.int8, device="meta")
    monkeypatch.setattr(CudaVmmBackend, "wrap", lambda self, a, n: meta.new_empty(n))
    device_syncs: list[str] = []
    monkeypatch.setattr(CudaVmmBackend, "synchronize", lambda self: device_syncs.append("sync"))
    monkeypatch.setattr(CudaVmmBackend, "device", "meta", raising=False)
    plan = plans.llama_plan(layers=1, num_blocks=64)
    with apply(plan, backend="cuda-vmm", mode="elastic", unbacked="fault") as cache:
        be = cache.backend
        assert fake.calls("cuStreamCreate") == []  # made on first use
        assert cache.ensure_mapped([1, 2]) > 0
        (stream,) = fake.streams
        assert fake.streams[stream] == fake.CUstream_flags.CU_STREAM_NON_BLOCKING
        sets = fake.calls("cuMemsetD8Async")
        assert sets and all(s == stream for _, _, s in sets)
        assert fake.calls("cuStreamSynchronize") == [(stream,)]
        assert device_syncs == [] and be.calls.counts["wait_zeroed"] == 1
        cache.release_blocks([1, 2])
        assert device_syncs == ["sync"]  # the forward may still read what is unmapped
        cache.ensure_mapped([3])
        assert len(fake.calls("cuStreamCreate")) == 1  # one stream for the backend's life
    assert fake.streams == {} and fake.calls("cuStreamDestroy") == [(stream,)]
