"""cuda-vmm on a real GPU (``-m gpu``; skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from harness.executor import _plans as plans
from harness.executor._patterns import fill_pattern, vanilla
from kvplan.executor import apply, verify
from kvplan.executor.backends.faults import FaultyBackend
from kvplan.planner.page_index import PageIndex
from kvplan.schemas.errors import Code, KVPlanError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20


@pytest.fixture
def backend():  # type: ignore[no-untyped-def]
    from kvplan.executor.backends.cuda_vmm import CudaVmmBackend

    be = CudaVmmBackend()
    yield be
    be.close()


@pytest.mark.parametrize(
    "make",
    [
        lambda: plans.gemma_plan(num_blocks=512),
        lambda: plans.llama_plan(num_blocks=128, ratio=2),
        plans.two_pool_plan,
    ],
    ids=["gemma", "llama-split", "two-pools"],
)
def test_eager_matches_vanilla(make, backend) -> None:  # type: ignore[no-untyped-def]
    plan = make()
    raw, ref = vanilla(plan, device=backend.device)
    fill_pattern(plan, ref)
    with apply(plan, backend=backend) as cache:
        assert verify(plan, cache.tensors, pools=cache.pools) == []
        assert all(int(p.abs().sum()) == 0 for p in cache.pools.values())  # zeroed
        fill_pattern(plan, cache.tensors)
        torch.cuda.synchronize()
        for name, want in raw.items():
            assert torch.equal(cache.pools[name], want)
    assert backend.live().clean


@pytest.mark.parametrize("route", ["storage", "cai"])
def test_wrap_routes_are_zero_copy(route: str) -> None:
    from kvplan.executor.backends.cuda_vmm import CudaVmmBackend

    be = CudaVmmBackend(wrap_route=route)
    try:
        with apply(plans.gemma_plan(num_blocks=64), backend=be) as cache:
            sharer = cache.tensors[plans.layer_name(30)]
            sharer[1, 0, 2, 3] = 5.0
            assert float(cache.tensors[plans.layer_name(13)][1, 0, 2, 3]) == 5.0
            assert cache.pools["kv"].data_ptr() == next(iter(be._reservations))
    finally:
        be.close()


def test_elastic_maps_only_requested_blocks(backend) -> None:  # type: ignore[no-untyped-def]
    plan = plans.llama_plan(layers=4, num_blocks=256)  # 4 x 16 MiB
    index = PageIndex(plan)
    with apply(plan, backend=backend, mode="elastic") as cache:
        torch.cuda.empty_cache()
        free0, _ = backend.mem_info()
        got = cache.ensure_mapped([0, 100])
        want = 2 << 20
        assert got == cache.mapped_bytes == len(index.blocks_chunks([0, 100], want)["kv"]) * want
        free1, _ = backend.mem_info()
        assert free0 - free1 >= got - 2 * MiB
        t = cache.tensors[plans.layer_name(3)]
        t[100].fill_(1.0)
        assert float(t[100].sum()) == t[100].numel()
        cache.release_blocks([0, 100])
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free2, _ = backend.mem_info()
        assert cache.mapped_bytes == 0 and abs(free2 - free0) <= 2 * MiB


def test_rollback_leaves_no_memory(backend) -> None:  # type: ignore[no-untyped-def]
    plan = plans.llama_plan(layers=2, num_blocks=128)  # 8 chunks
    probe = FaultyBackend(backend)
    cache = apply(plan, backend=probe, chunk_size=2 * MiB)  # type: ignore[arg-type]
    total = probe.calls.total  # calls made by apply (close not counted)
    cache.close()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free0, _ = backend.mem_info()
    for n in range(total):
        faulty = FaultyBackend(backend, fail_at=n)
        with pytest.raises(KVPlanError) as e:
            apply(plan, backend=faulty, chunk_size=2 * MiB)  # type: ignore[arg-type]
        assert e.value.code is Code.DRIVER_CALL_FAILED
        assert backend.live().clean
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free1, _ = backend.mem_info()
    assert abs(free1 - free0) <= 2 * MiB


def test_scratch_makes_unbacked_blocks_harmless() -> None:
    """``unbacked="scratch"``: stray reads/writes of unmapped blocks hit one scratch granule."""
    from kvplan.executor.backends.cuda_vmm import CudaVmmBackend

    be = CudaVmmBackend(unbacked="scratch")
    try:
        plan = plans.llama_plan(layers=4, num_blocks=256)  # 4 x 16 MiB, 64 KiB per block
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free0, _ = be.mem_info()
        with apply(plan, backend=be, mode="elastic") as cache:
            gran = cache.chunk_bytes
            assert gran == be.granularity()  # elastic default: the granularity
            free1, _ = be.mem_info()
            assert free0 - free1 < 16 * MiB  # one scratch granule, not the 64 MiB reserved
            assert be.live().mappings == 0 and be.scratch_live()[1] == 64 * MiB // gran
            last, first = cache.tensors[plans.layer_name(3)], cache.tensors[plans.layer_name(0)]
            assert float(last[200].abs().sum()) == 0.0  # unbacked reads: zeros, no fault
            last[200].fill_(3.0)  # an unbacked write: harmless
            torch.cuda.synchronize()  # an illegal address would raise here
            # Every unbacked granule is the same memory: layer 0's block 200 sees the write.
            assert float(first[200].sum()) == 3.0 * first[200].numel()
            cache.ensure_mapped([200])
            assert float(last[200].abs().sum()) == 0.0  # a real, zeroed chunk now
            last[200].fill_(5.0)
            torch.cuda.synchronize()
            assert float(last[200].sum()) == 5.0 * last[200].numel()
            assert float(first[200].sum()) == 0.0  # layer 0's chunk was mapped and zeroed too
            # Block 104 sits at the same offset of another, still unbacked granule (104 % 32 ==
            # 200 % 32 with 32 blocks of 64 KiB per 2 MiB): it reads the stray write.
            assert float(last[104].sum()) == 3.0 * last[104].numel()
            cache.release_blocks([200])
            torch.cuda.synchronize()
            last[200].fill_(7.0)  # unbacked again: no fault
            torch.cuda.synchronize()
            assert be.live().mappings == 0
        torch.cuda.synchronize()
        assert be.live().clean and be.scratch_live() == (0, 0)
        torch.cuda.empty_cache()
        free2, _ = be.mem_info()
        assert abs(free2 - free0) <= 2 * MiB
    finally:
        be.close()
