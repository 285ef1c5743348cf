"""Strategy ``kvcached`` == what kvcached 0.1.6 itself binds, fixture by fixture.

The recordings (``tests/data/kvcached``) come from kvcached's unmodified vLLM patches run on
vLLM 0.24.0's real V1 ``GPUModelRunner``/``KVCacheCoordinator`` classes with only its compiled VMM
module stubbed (``tools/make_kvcached_fixtures.py``). Where kvplan refuses, the recording shows
why: kvcached's views disagree with what vLLM 0.24's runner lays out for the attention backend
(``metadata.vllm_0_24_views`` of the legacy fixture).
"""

from __future__ import annotations

import math

import pytest

from kvplan.planner.legacy import build_legacy_plan, kvcached_geometry
from kvplan.schemas.dtypes import itemsize
from kvplan.schemas.errors import Code
from kvplan.schemas.legacy import PoolLayout
from tests.planner.legacy._helpers import FIXTURES, load, raw, recorded
from tests.planner.legacy._kvcached_real import (
    KVCACHED_VERSION,
    RECORDED,
    VLLM_VERSION,
    layout_of,
    plan_views,
    recording,
)

LAYOUTS: list[PoolLayout] = ["noncontiguous", "contiguous"]
# kvplan refuses these; the tests below show kvcached's recorded views are wrong there
REFUSED = {
    ("qwen2.5-7b-hnd", "noncontiguous"): Code.KVCACHED_UNSUPPORTED,
    ("qwen2.5-7b-hnd", "contiguous"): Code.KVCACHED_UNSUPPORTED,
    ("deepseek-v2-lite-mla-bs128", "contiguous"): Code.CONTIGUOUS_KERNEL_SPLIT,
}
# kvcached itself raises on these (its _validate_kv_cache_groups)
KVCACHED_RAISES = {"gemma-4-e2b-nohma"}


def test_every_fixture_has_a_recording_of_kvcached_0_1_6_on_vllm_0_24() -> None:
    assert sorted(p.stem for p in RECORDED.glob("*.json")) == FIXTURES
    for name in FIXTURES:
        data = recording(name)
        assert data["format"] == "kvplan.kvcached-recording/1" and data["fixture"] == name
        assert (data["kvcached_version"], data["vllm_version"]) == (KVCACHED_VERSION, VLLM_VERSION)
        assert set(data["layouts"]) == {"noncontiguous", "contiguous", "per-layer"}
        raised = {k for k, v in data["layouts"].items() if "error" in v["worker"]}
        if name in KVCACHED_RAISES:
            assert raised == set(data["layouts"])
        elif name != "jamba-v0.1-hybrid":  # its per-layer (v0.8) run raises: test_per_layer
            assert raised == set()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", FIXTURES)
def test_kvplan_binds_what_kvcached_binds(name: str, layout: PoolLayout) -> None:
    doc = load(name)
    rec = recording(name)
    sched, worker = layout_of(name, layout)["scheduler"], layout_of(name, layout)["worker"]
    if name in KVCACHED_RAISES:
        assert "kvcached only supports" in worker["error"]
        plan, problems = build_legacy_plan(doc, strategy="kvcached", pool_layout=layout)
        assert plan is None and problems[0].code is Code.KVCACHED_UNSUPPORTED
        return
    pools = sched["num_layers"]  # the scheduler's ElasticBlockPool(num_layers=...)
    created = worker["create_kv_tensors"]
    assert pools == created["num_layers"] == doc.scheduler_num_layers
    capacity = rec["device_total_memory"] // pools  # kvcached sizes a pool as device // L
    plan, problems = build_legacy_plan(
        doc, strategy="kvcached", pool_layout=layout, virtual_capacity_bytes=capacity
    )
    if (name, layout) in REFUSED:
        assert plan is None and problems[0].code is REFUSED[name, layout]
        return
    assert plan is not None, problems
    expected = {k: v for k, v in worker["views"].items() if "alias_of" not in v}
    assert len(expected) == len(plan.views) > 0 and plan_views(plan) == expected
    sharers = {k: v["alias_of"] for k, v in worker["views"].items() if "alias_of" in v}
    assert {a.layer for a in plan.aliases} == set(sharers)
    for alias in plan.aliases:  # kvcached: the very tensor object of the target
        assert alias.target in sharers[alias.layer]
    assert [p.size_bytes for p in plan.pools] == worker["pools"]
    geo = kvcached_geometry(doc, pool_layout=layout, virtual_capacity_bytes=capacity)
    assert (geo.num_pools, geo.num_kv_buffers, geo.cell_size) == (
        sched["num_layers"],
        sched["num_kv_buffers"],
        sched["cell_size"],
    )
    assert geo.ftensor_bytes == created["size"]
    assert (geo.attention_type == "HYBRID_LINEAR") == created["unified_pool"]
    # the C++ compound page (contiguous): page x L x the num_kv_buffers kvcached passes
    compound = rec["page_size"] * pools * created["num_kv_buffers"]
    assert geo.compound_page_bytes == (compound if layout == "contiguous" else rec["page_size"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_hnd_refusal_kvcached_lays_the_cache_out_nhd(layout: str) -> None:
    """VLLM_KV_CACHE_LAYOUT=HND: vLLM's runner puts heads outside tokens; kvcached 0.1.6 never
    asks the backend's stride order for 5-dim shapes and builds token-major (NHD) views."""
    name = "qwen2.5-7b-hnd"
    doc = load(name)
    assert doc.kv_cache_layout == "HND" and doc.attn_groups[0].stride_order == [0, 1, 3, 2, 4]
    vllm = recorded(name)
    views = layout_of(name, layout)["worker"]["views"]
    assert set(views) == set(vllm)
    for layer, mine in views.items():
        theirs = vllm[layer]
        assert mine["shape"][2:] == theirs["shape"][2:]  # same logical (tokens, heads, dim)
        tokens, heads, dim = mine["shape"][2:]
        # vLLM 0.24 (HND): token step = dim, head step = tokens x dim
        assert theirs["stride"][2:] == [dim, tokens * dim, 1]
        # kvcached: token step = heads x dim, head step = dim -- other bytes for one element
        assert mine["stride"][2:] == [heads * dim, dim, 1]
        assert mine["stride"][2:] != theirs["stride"][2:]
    plan, problems = build_legacy_plan(doc, strategy="kvcached", pool_layout=layout)  # type: ignore[arg-type]
    assert plan is None and "NHD" in problems[0].message


def test_contiguous_kernel_split_refusal_kvcached_views_whole_blocks() -> None:
    """--block-size 128 with FlashMLA's 64-token kernel blocks: vLLM's runner hands the kernel a
    (2N, 64, D) cache and block ids scaled by 2; kvcached's contiguous layout views (N, 128, D),
    so kernel block 1 (tokens 64..127 of block 0) reads the bytes of block 1."""
    name = "deepseek-v2-lite-mla-bs128"
    doc = load(name)
    kernel = (doc.kernel_block_sizes or [])[0]
    spec = doc.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    assert (spec.block_size, kernel) == (128, 64)
    vllm = recorded(name)
    contiguous = layout_of(name, "contiguous")["worker"]["views"]
    noncontiguous = layout_of(name, "noncontiguous")["worker"]["views"]
    pools = layout_of(name, "contiguous")["scheduler"]["num_layers"]
    for layer, mine in contiguous.items():
        assert vllm[layer]["shape"][1] == noncontiguous[layer]["shape"][1] == kernel
        assert mine["shape"][1] == spec.block_size  # whole virtual blocks
        head = mine["shape"][2]
        isz = itemsize(mine["dtype"])
        # where the kernel reads kernel block 1 vs where its tokens 64.. really are
        read = mine["offset_bytes"] + 1 * mine["stride"][0] * isz
        actual = mine["offset_bytes"] + kernel * head * isz
        assert mine["stride"][0] == pools * spec.block_size * head and read != actual
    plan, problems = build_legacy_plan(doc, strategy="kvcached", pool_layout="contiguous")
    assert plan is None and problems[0].code is Code.CONTIGUOUS_KERNEL_SPLIT


def test_recorded_views_stay_inside_their_pools() -> None:
    """Sanity of the recordings themselves: every view's last element lies in its pool."""
    for name in FIXTURES:
        for layout, data in recording(name)["layouts"].items():
            worker = data["worker"]
            if "error" in worker:
                continue
            for layer, v in worker["views"].items():
                if "alias_of" in v:
                    continue
                isz = itemsize(v["dtype"])
                last = sum((n - 1) * s for n, s in zip(v["shape"], v["stride"], strict=True))
                end = v["offset_bytes"] + (last + 1) * isz
                assert end <= worker["pools"][v["pool"]], (name, layout, layer)
                assert math.prod(v["shape"]) > 0


def test_legacy_fixture_and_recording_agree_on_the_model() -> None:
    for name in FIXTURES:
        groups = raw(name)["kv_cache_config"]["kv_cache_groups"]
        layers = {n for g in groups for n in g["layer_names"]}
        for layout, data in recording(name)["layouts"].items():
            if layout == "per-layer" or "error" in data["worker"]:
                continue
            got = {k.split("#")[0] for k in data["worker"]["views"]}
            assert got == layers, (name, layout)
