"""apply + verify on the CPU backends: tensors, aliases, pools, accounting, lifetime."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness.executor import _plans as plans
from harness.executor._patterns import fill_pattern, vanilla
from kvplan.executor import BoundKVCache, apply, create_backend, verify
from kvplan.executor.backends.host_vmm import HostVmmBackend
from kvplan.schemas.errors import Code, KVPlanError
from kvplan.schemas.plan import BindingPlan
from tests.executor.conftest import memfd_lines, perms_at


def test_apply_verifies(any_plan: BindingPlan, cpu_backend: str) -> None:
    with apply(any_plan, backend=cpu_backend) as cache:
        assert isinstance(cache, BoundKVCache)
        assert set(cache.tensors) == set(any_plan.layers)
        assert verify(any_plan, cache.tensors, pools=cache.pools) == []
        assert verify(any_plan, cache.tensors) == []
        for a in any_plan.aliases:
            assert cache.tensors[a.layer] is cache.tensors[a.target]
        for p in any_plan.pools:
            assert cache.pools[p.name].dtype == torch.int8
            assert cache.pools[p.name].numel() == p.size_bytes
        assert (
            cache.mapped_bytes == cache.reserved_bytes >= sum(p.size_bytes for p in any_plan.pools)
        )
    assert cache.closed and cache.tensors == {} and cache.mapped_bytes == 0


def test_same_bytes_as_vanilla(any_plan: BindingPlan) -> None:
    """Writing one pattern through the views leaves identical pool bytes on every backend."""
    raw, ref = vanilla(any_plan)
    fill_pattern(any_plan, ref)
    for backend in ("torch", "host-vmm"):
        with apply(any_plan, backend=backend) as cache:
            fill_pattern(any_plan, cache.tensors)
            for name, want in raw.items():
                assert torch.equal(cache.pools[name], want), (backend, name)


def test_host_vmm_is_zero_copy_and_aligned(no_leaks: None) -> None:
    plan = plans.gemma_plan(num_blocks=64)
    backend = HostVmmBackend()
    with apply(plan, backend=backend) as cache:
        pool = cache.pools["kv"]
        address = next(iter(backend._reservations))
        assert pool.data_ptr() == address and address % plans.ALIGN == 0
        assert perms_at(address) is not None and perms_at(address).startswith("rw")
        assert cache.chunk_bytes == cache.reserved_bytes  # eager default: one chunk per pool
        assert len(memfd_lines(backend.memfd_name)) == 1
        assert int(pool.abs().sum()) == 0
        view = cache.tensors[plans.layer_name(0)]
        assert view.data_ptr() == address
    assert backend.live().clean and memfd_lines(backend.memfd_name) == []


def test_alias_writes_are_visible_through_target() -> None:
    plan = plans.gemma_plan(num_blocks=8)
    with apply(plan, backend="host-vmm") as cache:
        sharer, target = cache.tensors[plans.layer_name(20)], cache.tensors[plans.layer_name(13)]
        sharer[3, 0, 5, 7] = 42.0
        assert float(target[3, 0, 5, 7]) == 42.0
        full = cache.tensors[plans.layer_name(19)]
        assert full is cache.tensors[plans.layer_name(14)]


def test_groups_overlay_block_bytes() -> None:
    """Gemma groups overlay the pool: block b of slot 0 is the same bytes in every group."""
    plan = plans.gemma_plan(num_blocks=8)
    with apply(plan, backend="host-vmm") as cache:
        full0, sliding0 = cache.tensors[plans.layer_name(4)], cache.tensors[plans.layer_name(0)]
        assert full0.data_ptr() == sliding0.data_ptr()
        full0[5].fill_(1.5)
        assert bool((sliding0[5] == 1.5).all()) and bool((sliding0[4] == 0).all())


def test_explicit_zeroing_path() -> None:
    plan = plans.llama_plan(layers=2, num_blocks=8)
    backend = HostVmmBackend(assume_zeroed=False)
    with apply(plan, backend=backend) as cache:
        assert backend.calls.counts["zero"] == 1
        assert int(cache.pools["kv"].abs().sum()) == 0


def test_chunk_size_sets_call_counts() -> None:
    plan = plans.llama_plan(layers=4, num_blocks=64)  # 16 MiB
    for chunk, n in ((2 << 20, 8), (8 << 20, 2), (32 << 20, 1), (5000, 16 * 256 // 5 + 1)):
        backend = HostVmmBackend(runs=False)  # one handle per chunk, as on CUDA
        with apply(plan, backend=backend, chunk_size=chunk) as cache:
            rounded = -(-chunk // 4096) * 4096
            assert cache.chunk_bytes == rounded
            assert (
                backend.calls.counts["create"]
                == backend.calls.counts["map"]
                == -(-(16 << 20) // rounded)
            )
            assert backend.calls.counts["set_access"] == 1
            assert backend.calls.counts["release"] == backend.calls.counts["create"]
            assert backend.live().handles == 0
        del n


def test_eager_default_chunk_is_large_and_capped_per_pool() -> None:
    """Eager maps 128 MiB chunks by default: a 300 MiB pool is 3 chunks, not 150."""
    from kvplan.executor import EAGER_CHUNK_BYTES
    from kvplan.executor.backends.meta import MetaBackend

    assert EAGER_CHUNK_BYTES == 128 << 20
    plan = plans.llama_plan(layers=10, num_blocks=480)  # 300 MiB
    backend = MetaBackend()
    with apply(plan, backend=backend) as cache:
        assert cache.reserved_bytes == 300 << 20 and cache.chunk_bytes == 128 << 20
        assert backend.calls.counts["create"] == backend.calls.counts["map"] == 3
        assert cache.mapped_bytes == 300 << 20
    small = plans.llama_plan(layers=4, num_blocks=64)  # 16 MiB: one chunk of 16 MiB
    backend = HostVmmBackend(runs=False)
    with apply(small, backend=backend) as cache:
        assert cache.chunk_bytes == 16 << 20 and backend.calls.counts["map"] == 1
        assert cache.mapped_bytes == 16 << 20


def test_eager_default_caps_each_pool_by_its_reservation() -> None:
    plan = plans.two_pool_plan()
    backend = HostVmmBackend(runs=False)
    with apply(plan, backend=backend) as cache:
        sizes = {p.name: -(-p.size_bytes // 4096) * 4096 for p in plan.pools}
        assert backend.calls.counts["map"] == len(sizes)  # one chunk per pool
        assert cache.chunk_bytes == max(sizes.values())
        assert cache.mapped_bytes == sum(sizes.values()) == cache.reserved_bytes


def test_elastic_default_chunk_is_the_granularity() -> None:
    plan = plans.llama_plan(layers=4, num_blocks=64)
    with apply(plan, backend=HostVmmBackend(), mode="elastic") as cache:
        assert cache.chunk_bytes == 4096  # host-vmm granularity: the page size
        assert cache.ensure_mapped([0]) == 4 * (64 << 10)  # exactly block 0 in each layer
    with apply(plan, backend=HostVmmBackend(granularity=2 << 20), mode="elastic") as cache:
        assert cache.chunk_bytes == 2 << 20  # CUDA's usual granularity
        assert cache.ensure_mapped([0]) == 4 * (2 << 20)
    with apply(plan, backend=HostVmmBackend(), mode="elastic", chunk_size=1 << 20) as cache:
        assert cache.chunk_bytes == 1 << 20  # an explicit size wins in either mode


def test_granularity_rounds_reservation() -> None:
    plan = plans.llama_plan(layers=3, num_blocks=5, kv_heads=1, head=4, dtype="float32")
    backend = HostVmmBackend(granularity=2 << 20)
    with apply(plan, backend=backend, chunk_size=4096) as cache:
        assert cache.chunk_bytes == 2 << 20
        assert cache.reserved_bytes == 2 << 20
        assert cache.pools["kv"].numel() == plan.pools[0].size_bytes


def test_close_is_idempotent_and_releases(no_leaks: None) -> None:
    backend = HostVmmBackend()
    cache = apply(plans.two_pool_plan(), backend=backend)
    addresses = list(backend._reservations)
    cache.close()
    cache.close()
    assert backend.live().clean
    assert all(perms_at(a) is None or not perms_at(a).startswith("rw") for a in addresses)
    with pytest.raises(RuntimeError):
        cache.ensure_mapped([0])


def test_backend_instance_is_not_closed_by_cache() -> None:
    backend = create_backend("meta")
    with apply(plans.llama_plan(), backend=backend):
        pass
    with apply(plans.llama_plan(), backend=backend) as cache:
        assert cache.backend is backend
    assert backend.live().clean


def test_register_backend() -> None:
    from kvplan.executor import BACKENDS, backend_info, register_backend
    from kvplan.executor.backends.meta import MetaBackend

    made: list[MetaBackend] = []

    class Custom(MetaBackend):
        def __init__(self, **kw: object) -> None:
            super().__init__(granularity=1 << 16)
            made.append(self)

    register_backend("custom", Custom)
    try:
        assert backend_info("custom") is MetaBackend.info
        with apply(plans.llama_plan(), backend="custom") as cache:
            assert cache.backend is made[0] and cache.chunk_bytes == cache.reserved_bytes
    finally:
        BACKENDS.pop("custom")
    assert made[0].live().clean


def test_register_backend_needs_capabilities() -> None:
    from kvplan.executor import BACKENDS, register_backend
    from kvplan.executor.backends import TrackedBackend

    def factory(**kw: object) -> object:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match="BackendInfo"):
        register_backend("bare", factory)  # type: ignore[arg-type]

    class Undeclared(TrackedBackend):  # says nothing about what it can do
        pass

    with pytest.raises(TypeError, match="BackendInfo"):
        register_backend("bare", Undeclared)
    assert "bare" not in BACKENDS


def test_meta_backend_makes_meta_tensors() -> None:
    with apply(plans.gemma_plan(), backend="meta") as cache:
        assert all(t.device.type == "meta" for t in cache.tensors.values())
        assert cache.timings_ms["total"] >= cache.timings_ms["views"]
        assert cache.stats()["tensors"] == 35


def test_errors() -> None:
    plan = plans.llama_plan()
    with pytest.raises(KVPlanError) as e:
        apply(plan, backend="nope")
    assert e.value.code is Code.BACKEND_UNAVAILABLE and "host-vmm" in str(e.value)
    with pytest.raises(KVPlanError) as e:
        apply(plan, backend="meta", mode="lazy")  # type: ignore[arg-type]
    assert e.value.code is Code.UNKNOWN_ENUM
    with pytest.raises(KVPlanError) as e:
        apply(plan, backend="torch", mode="elastic")
    assert e.value.code is Code.BACKEND_UNAVAILABLE and "elastic" in str(e.value)
    with pytest.raises(KVPlanError) as e:
        apply(plan, backend="meta", device="cpu")
    assert e.value.code is Code.BACKEND_UNAVAILABLE
    with pytest.raises(KVPlanError) as e:
        apply(plan, backend="host-vmm", device="cuda:0")
    assert e.value.code is Code.BACKEND_UNAVAILABLE
    with pytest.raises(KVPlanError) as e:
        apply(plan, backend="meta", chunk_size=0)
    assert e.value.code is Code.SCHEMA
    with pytest.raises(KVPlanError) as e:
        apply(plan, backend="meta", bogus=1)
    assert e.value.code is Code.BACKEND_UNAVAILABLE


def test_bad_view_geometry_rolls_back(no_leaks: None) -> None:
    plan = plans.llama_plan(layers=2, num_blocks=4)
    bad = plan.views[1].model_copy(update={"offset_bytes": plan.pools[0].size_bytes})
    broken = plans.make_plan(list(plan.pools), [plan.views[0], bad])
    backend = HostVmmBackend()
    with pytest.raises(KVPlanError) as e:
        apply(broken, backend=backend)
    assert e.value.code is Code.VIEW_OUT_OF_BOUNDS and backend.live().clean
    odd = plan.views[1].model_copy(update={"offset_bytes": 3})
    with pytest.raises(KVPlanError) as e:
        apply(plans.make_plan(list(plan.pools), [odd]), backend=backend)
    assert e.value.code is Code.MISALIGNED and backend.live().clean


def test_import_does_not_load_torch() -> None:
    code = (
        "import sys, kvplan.executor, kvplan.executor.backends.cuda_vmm;"
        "import kvplan.executor.backends.host_vmm;"
        "bad = [m for m in ('torch', 'cuda.bindings.driver') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
