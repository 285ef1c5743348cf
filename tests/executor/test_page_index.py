"""The pure page index: block id → byte ranges → chunks, checked against brute force."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.executor import _plans as plans
from kvplan.planner.page_index import (
    MAX_RANGES_PER_ROW,
    PageIndex,
    merge_ranges,
    range_bytes,
    row_template,
)
from kvplan.schemas.plan import BindingPlan, Pool, View

P = 16 * 8 * 256 * 2  # llama page: bs16, 8 heads, K|V 256, bf16 = 64 KiB


def brute_force(plan: BindingPlan, block: int) -> dict[str, set[int]]:
    """Every byte ``block`` touches, enumerated element by element."""
    out: dict[str, set[int]] = {p.name: set() for p in plan.pools}
    for v in plan.views:
        pool = plan.pool_by_name[v.pool]
        ratio = v.shape[0] // pool.num_blocks
        isz = v.itemsize
        for r in range(block * ratio, (block + 1) * ratio):
            for idx in itertools.product(*(range(n) for n in v.shape[1:])):
                e = v.storage_offset + r * v.stride[0]
                e += sum(i * s for i, s in zip(idx, v.stride[1:], strict=True))
                out[v.pool].update(range(e * isz, (e + 1) * isz))
    return out


def as_bytes(ranges: list[tuple[int, int]]) -> set[int]:
    return {b for s, e in ranges for b in range(s, e)}


def test_merge_ranges() -> None:
    assert merge_ranges([(5, 6), (0, 2), (2, 3), (1, 2), (7, 7)]) == [(0, 3), (5, 6)]
    assert merge_ranges([]) == []


def test_row_template_dense_and_gapped() -> None:
    assert row_template([8, 16, 256], [256, 2048, 1], 2) == ((0, 65536),)
    # heads outside: 2 heads 100 elements apart, 10 contiguous elements each
    assert row_template([2, 10], [100, 1], 1) == ((0, 10), (100, 110))
    # size-1 and zero strides contribute nothing
    assert row_template([1, 4, 3], [999, 0, 1], 4) == ((0, 12),)
    assert row_template([0, 4], [4, 1], 1) == ()


def test_row_template_negative_stride() -> None:
    # elements at 0, -3, -6 (itemsize 1): bytes -6..0
    assert row_template([3], [-3], 1) == ((-6, -5), (-3, -2), (0, 1))


def test_row_template_caps_range_count() -> None:
    n = MAX_RANGES_PER_ROW + 1
    assert row_template([n, 1], [4, 1], 1) == ((0, (n - 1) * 4 + 1),)


def test_layer_outermost_one_range_per_layer() -> None:
    plan = plans.llama_plan(layers=4, num_blocks=64)
    index = PageIndex(plan)
    assert index.num_blocks == 64
    assert index.block_ranges(3) == {
        "kv": [(i * 64 * P + 3 * P, i * 64 * P + 4 * P) for i in range(4)]
    }


def test_block_outermost_one_contiguous_range() -> None:
    plan = plans.llama_plan(layers=4, num_blocks=64, layout="block")
    index = PageIndex(plan)
    assert index.block_ranges(5) == {"kv": [(5 * 4 * P, 6 * 4 * P)]}


def test_kernel_split_equals_unsplit() -> None:
    split = PageIndex(plans.llama_plan(ratio=4))
    whole = PageIndex(plans.llama_plan(ratio=1))
    for b in (0, 1, 63):
        assert split.block_ranges(b) == whole.block_ranges(b)


def test_gemma_groups_overlay_the_same_pages() -> None:
    plan = plans.gemma_plan(num_blocks=64)
    index = PageIndex(plan)
    page = 16384
    assert index.block_ranges(7) == {
        "kv": [(s * 64 * page + 7 * page, s * 64 * page + 8 * page) for s in range(3)]
    }
    assert all(not vr.whole for vr in index.views) and len(index.views) == 15


def test_whole_pool_view_charges_every_block_the_pool() -> None:
    plan = plans.whole_pool_plan(size=3 << 20, num_blocks=8)
    index = PageIndex(plan)
    assert index.views[0].whole
    assert index.block_ranges(0) == index.block_ranges(7) == {"hot": [(0, 3 << 20)]}
    assert index.blocks_ranges([]) == {"hot": []}


def test_rows_not_a_multiple_of_blocks_fall_back_to_extent() -> None:
    pool = Pool(name="p", size_bytes=1000, alignment_bytes=64, num_blocks=3)
    view = View(
        layer="x",
        group=0,
        pool="p",
        kind="MambaSpec",
        dtype="int8",
        shape=[10, 10],
        stride=[10, 1],
        offset_bytes=100,
    )
    index = PageIndex(plans.make_plan([pool], [view]))
    assert index.block_ranges(1) == {"p": [(100, 200)]}


def test_chunks_round_ranges_out() -> None:
    index = PageIndex(plans.llama_plan(layers=4, num_blocks=64))
    chunk = 2 << 20  # 32 blocks of one layer per chunk
    assert index.block_chunks(0, chunk) == {"kv": {0, 2, 4, 6}}
    assert index.block_chunks(33, chunk) == {"kv": {1, 3, 5, 7}}
    assert index.blocks_chunks(range(64), chunk) == {"kv": set(range(8))}
    with pytest.raises(ValueError):
        index.block_chunks(0, 0)


def test_two_pools_and_validity() -> None:
    index = PageIndex(plans.two_pool_plan(num_blocks=16))
    got = index.block_ranges(2)
    assert set(got) == {"kv", "aux"} and got["kv"] and got["aux"]
    assert index.check_block(15) and not index.check_block(16) and not index.check_block(-1)


@pytest.mark.parametrize(
    "plan",
    [
        plans.llama_plan(layers=2, num_blocks=4, kv_heads=2, head=4, block_size=4),
        plans.llama_plan(layers=3, num_blocks=4, kv_heads=2, head=4, block_size=4, layout="block"),
        plans.llama_plan(layers=2, num_blocks=4, kv_heads=3, head=4, block_size=4, layout="head"),
        plans.llama_plan(layers=2, num_blocks=4, kv_heads=2, head=4, block_size=4, ratio=2),
        plans.gemma_plan(num_blocks=2),
    ],
    ids=["layer", "block", "head", "split", "gemma"],
)
def test_matches_brute_force(plan: BindingPlan) -> None:
    index = PageIndex(plan)
    for b in range(index.num_blocks):
        got = index.block_ranges(b)
        want = brute_force(plan, b)
        assert {k: as_bytes(v) for k, v in got.items()} == want
        assert {k: range_bytes(v) for k, v in got.items()} == {k: len(v) for k, v in want.items()}


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 3),
    num_blocks=st.integers(1, 5),
    heads=st.integers(1, 3),
    head=st.integers(1, 3),
    bs_log=st.integers(0, 2),
    ratio_log=st.integers(0, 2),
    layout=st.sampled_from(["layer", "block", "head"]),
    dtype=st.sampled_from(["int8", "bfloat16", "float32"]),
)
def test_property_matches_brute_force(
    layers: int,
    num_blocks: int,
    heads: int,
    head: int,
    bs_log: int,
    ratio_log: int,
    layout: str,
    dtype: str,
) -> None:
    bs = 1 << bs_log
    ratio = 1 << min(ratio_log, bs_log) if layout == "layer" else 1
    plan = plans.llama_plan(
        layers=layers,
        num_blocks=num_blocks,
        kv_heads=heads,
        head=head,
        block_size=bs,
        ratio=ratio,
        layout=layout,
        dtype=dtype,
    )
    index = PageIndex(plan)
    for b in range(num_blocks):
        want = brute_force(plan, b)
        assert {k: as_bytes(v) for k, v in index.block_ranges(b).items()} == want
        for chunk in (1, 3, 16, 4096):  # a chunk is needed when any of its bytes is
            assert index.block_chunks(b, chunk) == {
                k: {byte // chunk for byte in v} for k, v in want.items()
            }
    blocks = list(range(num_blocks))[::2]
    union = {k: set().union(*(brute_force(plan, b)[k] for b in blocks)) for k in want}
    assert index.blocks_chunks(blocks, 16) == {k: {x // 16 for x in v} for k, v in union.items()}


def test_page_index_is_pure() -> None:
    code = "import sys, kvplan.planner.page_index; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
