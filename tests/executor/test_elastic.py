"""Elastic mode on host-vmm: exactly the requested blocks' chunks are mapped, refcounted."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from harness.executor import _plans as plans
from kvplan.executor import apply
from kvplan.executor.backends.host_vmm import HostVmmBackend
from kvplan.planner.page_index import PageIndex
from kvplan.schemas.errors import Code, KVPlanError
from tests.executor.conftest import memfd_lines, perms_at

MiB = 1 << 20
P = 64 * 1024  # llama page per layer and block (bs16, 8 heads, head 128, bf16)


def test_nothing_mapped_until_asked(no_leaks: None) -> None:
    plan = plans.llama_plan(layers=4, num_blocks=64)  # 4 layers x 4 MiB
    backend = HostVmmBackend()
    with apply(plan, backend=backend, mode="elastic") as cache:
        assert cache.mapped_bytes == 0 and cache.reserved_bytes == 16 * MiB
        assert backend.live().mappings == 0 and memfd_lines(backend.memfd_name) == []
        address = cache.pools["kv"].data_ptr()
        assert perms_at(address) == "---p"  # reserved, PROT_NONE


def test_layer_outermost_maps_one_chunk_per_layer(no_leaks: None) -> None:
    plan = plans.llama_plan(layers=4, num_blocks=64)  # a 2 MiB chunk holds 32 blocks of a layer
    backend = HostVmmBackend(runs=False)  # one mapping per chunk, as on CUDA
    with apply(plan, backend=backend, mode="elastic", chunk_size=2 * MiB) as cache:
        assert cache.ensure_mapped([0]) == 4 * 2 * MiB
        assert cache.mapped_chunks == {"kv": 4} and cache.mapped_bytes == 8 * MiB
        assert len(memfd_lines(backend.memfd_name)) == 4
        assert cache.ensure_mapped([0, 1, 31]) == 0  # same chunks
        assert cache.ensure_mapped([32]) == 8 * MiB
        assert cache.mapped_blocks == {0, 1, 31, 32}
        assert backend.live().mappings == 8 and backend.calls.counts["map"] == 8


def test_exact_bytes_with_page_sized_chunks() -> None:
    plan = plans.llama_plan(layers=4, num_blocks=64)
    index = PageIndex(plan)
    with apply(plan, backend="host-vmm", mode="elastic", chunk_size=P) as cache:
        blocks = [0, 5, 6, 63]
        mapped = cache.ensure_mapped(blocks)
        want = sum(e - s for s, e in index.blocks_ranges(blocks)["kv"])
        assert mapped == cache.mapped_bytes == want == len(blocks) * 4 * P


def test_block_outermost_maps_contiguous_blocks() -> None:
    plan = plans.llama_plan(layers=4, num_blocks=64, layout="block")  # 256 KiB per block
    with apply(plan, backend="host-vmm", mode="elastic", chunk_size=MiB) as cache:
        cache.ensure_mapped([0])
        assert cache.mapped_chunks == {"kv": 1}
        cache.ensure_mapped([1, 2, 3])  # same MiB
        assert cache.mapped_chunks == {"kv": 1}
        cache.ensure_mapped([4])
        assert cache.mapped_chunks == {"kv": 2} and cache.mapped_bytes == 2 * MiB


def test_kernel_split_maps_like_unsplit() -> None:
    for ratio in (1, 4):
        plan = plans.llama_plan(layers=4, num_blocks=64, ratio=ratio)
        with apply(plan, backend="host-vmm", mode="elastic", chunk_size=P) as cache:
            cache.ensure_mapped([3, 40])
            assert cache.mapped_bytes == 2 * 4 * P


def test_gemma_overlay_maps_shared_slots_once() -> None:
    plan = plans.gemma_plan(num_blocks=256)  # 3 slots x 4 MiB
    with apply(plan, backend="host-vmm", mode="elastic", chunk_size=2 * MiB) as cache:
        cache.ensure_mapped([10])
        assert cache.mapped_chunks == {"kv": 3}  # one chunk per slot, shared by 5 groups
        for layer in (plans.layer_name(i) for i in (0, 4, 13, 14, 20, 34)):
            cache.tensors[layer][10].fill_(2.0)
        assert float(cache.tensors[plans.layer_name(4)][10].sum()) == 2.0 * 8 * 1024


def test_whole_pool_view_maps_everything() -> None:
    plan = plans.whole_pool_plan(size=3 * MiB, num_blocks=8)
    with apply(plan, backend="host-vmm", mode="elastic") as cache:
        cache.ensure_mapped([5])
        assert cache.mapped_bytes == 3 * MiB
        assert cache.release_blocks([5]) == 3 * MiB and cache.mapped_bytes == 0


def test_refcounts_and_stable_addresses(no_leaks: None) -> None:
    plan = plans.llama_plan(layers=2, num_blocks=64)
    backend = HostVmmBackend()
    with apply(plan, backend=backend, mode="elastic", chunk_size=2 * MiB) as cache:
        t = cache.tensors[plans.layer_name(1)]
        ptr = t.data_ptr()
        cache.ensure_mapped([0, 1])
        assert cache.release_blocks([0]) == 0  # block 1 still uses the chunks
        assert cache.mapped_bytes == 4 * MiB
        assert cache.release_blocks([0, 7]) == 0  # not resident: ignored
        assert cache.release_blocks([1]) == 4 * MiB
        assert cache.mapped_bytes == 0 and backend.live().mappings == 0
        assert memfd_lines(backend.memfd_name) == []
        assert perms_at(ptr) == "---p"  # back to a PROT_NONE reservation, same address
        cache.ensure_mapped([1])
        assert cache.tensors[plans.layer_name(1)].data_ptr() == ptr == t.data_ptr()
        assert next(iter(backend._reservations)) == cache.pools["kv"].data_ptr()


@pytest.mark.parametrize("assume_zeroed", [True, False])
def test_remapped_chunks_are_zero(assume_zeroed: bool) -> None:
    plan = plans.llama_plan(layers=2, num_blocks=64)
    backend = HostVmmBackend(assume_zeroed=assume_zeroed)
    with apply(plan, backend=backend, mode="elastic") as cache:
        t = cache.tensors[plans.layer_name(0)]
        cache.ensure_mapped([2])
        t[2].fill_(3.0)
        assert float(t[2].sum()) != 0
        cache.release_blocks([2])
        cache.ensure_mapped([2])
        assert float(t[2].abs().sum()) == 0
        assert backend.calls.counts["zero"] == (0 if assume_zeroed else 4)  # 2 runs x 2 maps


def test_block_ids_are_checked() -> None:
    plan = plans.llama_plan(layers=2, num_blocks=8)
    with apply(plan, backend="host-vmm", mode="elastic") as cache:
        for bad in ([8], [-1], [0, 100]):
            with pytest.raises(KVPlanError) as e:
                cache.ensure_mapped(bad)
            assert e.value.code is Code.BLOCK_OUT_OF_RANGE
        with pytest.raises(KVPlanError):
            cache.release_blocks([9])
        assert cache.mapped_bytes == 0


def test_eager_mode_block_calls_are_noops() -> None:
    with apply(plans.llama_plan(layers=2, num_blocks=8), backend="host-vmm") as cache:
        before = cache.mapped_bytes
        assert cache.ensure_mapped([1]) == 0 and cache.release_blocks([1]) == 0
        assert cache.mapped_bytes == before
        with pytest.raises(KVPlanError):
            cache.ensure_mapped([8])


def test_meta_elastic_accounting_matches_host_vmm() -> None:
    plan = plans.gemma_plan(num_blocks=512)
    blocks = [0, 1, 100, 300, 511]
    got = {}
    for backend in ("meta", "host-vmm"):
        with apply(plan, backend=backend, mode="elastic", chunk_size=MiB) as cache:
            cache.ensure_mapped(blocks)
            got[backend] = (cache.mapped_bytes, cache.mapped_chunks)
            cache.release_blocks(blocks[:2])
            got[backend + "-after"] = (cache.mapped_bytes, cache.mapped_chunks)
    assert got["meta"] == got["host-vmm"] and got["meta-after"] == got["host-vmm-after"]


def test_two_pools_map_per_pool() -> None:
    plan = plans.two_pool_plan(num_blocks=16)
    with apply(plan, backend="host-vmm", mode="elastic", chunk_size=4096) as cache:
        cache.ensure_mapped([3])
        index = PageIndex(plan)
        want = {
            name: -(-sum(e - s for s, e in r) // 4096) for name, r in index.block_ranges(3).items()
        }
        assert cache.mapped_chunks == want and all(want.values())


def test_unmapped_pages_fault() -> None:
    """Touching a block that was never ensured faults: the memory is really not there."""
    code = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, ".")
        from kvplan.executor import apply
        from harness.executor import _plans as plans
        cache = apply(plans.llama_plan(layers=1, num_blocks=64), backend="host-vmm", mode="elastic")
        t = cache.tensors[plans.layer_name(0)]
        cache.ensure_mapped([0])
        t[0].fill_(1.0)
        print("mapped ok", flush=True)
        t[40].fill_(1.0)  # chunk 1: never mapped
        print("unreachable", flush=True)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "mapped ok" in proc.stdout and "unreachable" not in proc.stdout
    assert proc.returncode != 0


def test_write_read_after_growth() -> None:
    plan = plans.llama_plan(layers=2, num_blocks=64, layout="block")
    with apply(plan, backend="host-vmm", mode="elastic", chunk_size=4096) as cache:
        t = cache.tensors[plans.layer_name(1)]
        for b in range(0, 64, 7):
            cache.ensure_mapped([b])
            t[b].copy_(torch.full_like(t[b], float(b)))
        for b in range(0, 64, 7):
            assert bool((t[b] == float(b)).all())
