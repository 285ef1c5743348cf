"""Strategy ``kvcached``: kvcached's view math on synthetic models, checked against the reference
values measured with kvcached's code (``kvcached-binding-and-vmm.md`` §1.3: K/V-first
``(2, N, ...)`` shapes, small pretend devices), plus geometry and refusals on the fixtures.
The fixtures' views are compared with kvcached 0.1.6's own recorded binding in
``test_kvcached_real``."""

from __future__ import annotations

from typing import Any

import pytest

from kvplan.planner.legacy import kvcached_geometry, plan_legacy
from kvplan.schemas.errors import Code, KVPlanError
from kvplan.schemas.legacy import LegacyInputDocument
from kvplan.schemas.plan import BindingPlan
from tests.planner.legacy._helpers import load, synthetic

MiB = 1 << 20
GPU = 64 * MiB  # the reference's pretend device


def attn(kind: str = "FullAttentionSpec", **kw: Any) -> dict[str, Any]:
    return {"kind": kind, **kw}


def mha(shape: list[int], pools: int, kbs: int, layout: str, bs: int = 16) -> LegacyInputDocument:
    """A (2, N, ...) FlashAttention-style or (N, 2, ...) FlashInfer-style MHA model."""
    heads, head = shape[3], shape[4]
    ratio = bs // kbs
    kv_first = shape[0] == 2
    recorded = list(shape)
    recorded[1 if kv_first else 0] *= ratio
    recorded[2] = kbs
    return synthetic(
        groups=[attn(block_size=bs, num_kv_heads=heads, head_size=head, dtype="float16")],
        pools=pools,
        num_blocks=shape[1] if kv_first else shape[0],
        shapes=[recorded],
        kernel_block_sizes=[kbs],
        block_dims=[1 if kv_first else 0],
        binding={
            "strategy": "kvcached",
            "pool_layout": layout,
            "virtual_capacity_bytes": GPU // pools,
        },
    )


def mla(layout: str) -> LegacyInputDocument:
    return synthetic(
        groups=[
            attn("MLAAttentionSpec", block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16")
        ],
        pools=4,
        num_blocks=8,
        shapes=[[8, 16, 576]],
        kernel_block_sizes=[16],
        block_dims=[0],
        binding={"strategy": "kvcached", "pool_layout": layout, "virtual_capacity_bytes": GPU // 4},
    )


MAMBA = {
    "kind": "MambaSpec",
    "block_size": 16,
    "shapes": [[4, 8], [2, 16]],
    "dtypes": ["float16", "float32"],
    "page_size_padded": 1024,
}


def hybrid(kbs: int, layout: str) -> LegacyInputDocument:
    """Attention (2, N, 16, 2, 8) fp16 + Mamba, unified 1024 B pages, 3 pools."""
    return synthetic(
        groups=[attn(block_size=16, num_kv_heads=2, head_size=8, dtype="float16"), MAMBA],
        pools=3,
        num_blocks=8,
        shapes=[[2, 8 * (16 // kbs), kbs, 2, 8], []],
        kernel_block_sizes=[kbs, 16],
        block_dims=[1, 0],
        binding={"strategy": "kvcached", "pool_layout": layout, "virtual_capacity_bytes": GPU // 3},
    )


# kvcached-binding-and-vmm.md §1.3: (doc, view shape, view stride, byte offset pool 0 / 1,
# kv_bytes per pool, blocks per pool)
REFERENCE = {
    "mha_flashattn_noncontig": (
        lambda: mha([2, 8, 16, 8, 128], 4, 16, "noncontiguous"),
        [2, 256, 16, 8, 128],
        [4194304, 16384, 1024, 128, 1],
        (0, 0),
        8388608,
        256,
    ),
    "mha_flashinfer_noncontig": (
        lambda: mha([8, 2, 16, 8, 128], 4, 16, "noncontiguous"),
        [256, 2, 16, 8, 128],
        [16384, 4194304, 1024, 128, 1],
        (0, 0),
        8388608,
        256,
    ),
    "mla_noncontig": (
        lambda: mla("noncontiguous"),
        [910, 16, 576],
        [9216, 576, 1],
        (0, 0),
        16777216,
        910,
    ),
    "hybrid_linear_noncontig_ratio1": (
        lambda: hybrid(16, "noncontiguous"),
        [2, 20480, 16, 2, 8],
        [256, 512, 16, 8, 1],
        (0, 0),
        10485760,
        20480,
    ),
    "hybrid_linear_noncontig_ratio2": (
        lambda: hybrid(8, "noncontiguous"),
        [2, 40960, 8, 2, 8],
        [128, 256, 16, 8, 1],
        (0, 0),
        10485760,
        20480,
    ),
    "mha_flashattn_contig": (
        lambda: mha([2, 8, 16, 8, 128], 4, 16, "contiguous"),
        [2, 256, 16, 8, 128],
        [16384, 131072, 1024, 128, 1],
        (0, 65536),
        8388608,
        256,
    ),
    "mha_flashinfer_contig": (
        lambda: mha([8, 2, 16, 8, 128], 4, 16, "contiguous"),
        [256, 2, 16, 8, 128],
        [131072, 16384, 1024, 128, 1],
        (0, 65536),
        8388608,
        256,
    ),
    "mla_contig": (
        lambda: mla("contiguous"),
        [910, 16, 576],
        [36864, 576, 1],
        (0, 18432),
        16777216,
        910,
    ),
    "hybrid_linear_contig_ratio1": (
        lambda: hybrid(16, "contiguous"),
        [2, 20480, 16, 2, 8],
        [256, 1536, 16, 8, 1],
        (0, 1024),
        10485760,
        20480,
    ),
    "hybrid_linear_contig_ratio2": (
        lambda: hybrid(8, "contiguous"),
        [2, 40960, 8, 2, 8],
        [128, 768, 16, 8, 1],
        (0, 512),
        10485760,
        20480,
    ),
    "mha_flashattn_noncontig_ratio2": (
        lambda: mha([2, 8, 16, 8, 128], 4, 8, "noncontiguous"),
        [2, 512, 8, 8, 128],
        [4194304, 8192, 1024, 128, 1],
        (0, 0),
        8388608,
        256,
    ),
}


def views_of_group(plan: BindingPlan, group: int) -> list[Any]:
    return [v for v in plan.views if v.group == group and "#" not in v.layer]


@pytest.mark.parametrize("case", REFERENCE, ids=list(REFERENCE))
def test_reference_values(case: str) -> None:
    make, shape, stride, offsets, kv_bytes, blocks = REFERENCE[case]
    doc = make()
    plan = plan_legacy(doc)
    views = views_of_group(plan, 0)
    assert [views[0].shape, views[0].stride] == [shape, stride]
    assert (views[0].offset_bytes, views[1].offset_bytes) == offsets
    geometry = kvcached_geometry(doc)
    assert (geometry.kv_bytes, geometry.num_blocks) == (kv_bytes, blocks)


@pytest.mark.parametrize(
    "layout, sliding, full, offsets",
    [
        ("noncontiguous", [4194304, 32768, 2048, 256, 1], [4194304, 32768, 512, 512, 1], (0, 0)),
        ("contiguous", [32768, 262144, 2048, 256, 1], [32768, 262144, 512, 512, 1], (0, 131072)),
    ],
)
def test_reference_heterogeneous_groups(
    layout: str, sliding: list[int], full: list[int], offsets: tuple[int, int]
) -> None:
    doc = synthetic(
        groups=[
            attn(
                "SlidingWindowSpec",
                block_size=16,
                num_kv_heads=8,
                head_size=256,
                dtype="float16",
                sliding_window=512,
            ),
            attn(block_size=64, num_kv_heads=1, head_size=512, dtype="float16"),
        ],
        pools=4,
        num_blocks=8,
        shapes=[[2, 8, 16, 8, 256], [2, 8, 64, 1, 512]],
        kernel_block_sizes=[16, 64],
        block_dims=[1, 1],
        binding={"strategy": "kvcached", "pool_layout": layout, "virtual_capacity_bytes": GPU // 4},
    )
    plan = plan_legacy(doc)
    sw, fa = views_of_group(plan, 0), views_of_group(plan, 1)
    assert (sw[0].shape, sw[0].stride) == ([2, 128, 16, 8, 256], sliding)
    assert (fa[0].shape, fa[0].stride) == ([2, 128, 64, 1, 512], full)
    assert (sw[1].offset_bytes, fa[1].offset_bytes) == (offsets[1], offsets[1])
    assert kvcached_geometry(doc).num_blocks == 128


@pytest.mark.parametrize("layout, step", [("noncontiguous", 1024), ("contiguous", 3072)])
def test_reference_mamba_block_stride(layout: str, step: int) -> None:
    plan = plan_legacy(hybrid(16, layout))
    states = [v for v in plan.views if v.layer.startswith("g1.l1#")]
    assert [v.shape[0] for v in states] == [20480, 20480]
    assert states[0].stride[0] * 2 == step and states[1].stride[0] * 4 == step
    base = 1024 if layout == "contiguous" else 0
    assert [v.offset_bytes for v in states] == [base, base + 64]


# -- fixtures: kvplan == kvcached 0.1.6's own binding is in test_kvcached_real ----------------


def test_gemma4_e2b_pools_are_the_scheduler_group_size() -> None:
    doc = load("gemma-4-e2b")
    for layout in ("noncontiguous", "contiguous"):
        geometry = kvcached_geometry(doc, pool_layout=layout)
        assert geometry.num_pools == 3 == doc.scheduler_num_layers  # not 19 (#472)
        assert geometry.num_kv_buffers == 2 and geometry.block_mem_bytes == 16384
        assert geometry.num_blocks == 384 and geometry.kv_bytes == 3 * (2 << 20)
        plan = plan_legacy(doc, strategy="kvcached", pool_layout=layout)
        assert len(plan.aliases) == 20
        assert len(plan.pools) == (3 if layout == "noncontiguous" else 1)
    assert kvcached_geometry(doc, pool_layout="contiguous").compound_page_bytes == 12 * MiB


def test_heterogeneous_gemma_groups_address_the_same_block_bytes() -> None:
    plan = plan_legacy(load("gemma-4-e2b"), strategy="kvcached")
    views = {(v.pool, v.group): v for v in plan.views}
    sliding, full = views[("kv_1", 0)], views[("kv_1", 4)]
    assert sliding.shape[2:] == [32, 1, 256] and full.shape[2:] == [16, 1, 512]
    for b in (0, 7, 340):  # block b, K then V, starts at the same byte in both views
        for kv in (0, 1):
            assert (b * sliding.stride[0] + kv * sliding.stride[1]) == (
                b * full.stride[0] + kv * full.stride[1]
            )


def test_virtual_capacity_sets_the_reservation() -> None:
    doc = load("gemma-3-1b")
    default = kvcached_geometry(doc)
    assert default.num_blocks >= doc.kv_cache_config.num_blocks
    assert default.ftensor_bytes == 2 * default.kv_bytes and default.kv_bytes % (2 << 20) == 0
    big = kvcached_geometry(doc, virtual_capacity_bytes=1 << 30)
    assert big.kv_bytes == 512 * MiB and big.num_blocks == 512 * MiB // 8192
    plan = plan_legacy(doc, strategy="kvcached", virtual_capacity_bytes=1 << 30)
    assert {p.size_bytes for p in plan.pools} == {1 << 30}
    with pytest.raises(KVPlanError) as info:
        plan_legacy(doc, strategy="kvcached", virtual_capacity_bytes=4 << 20)
    assert info.value.code is Code.VIRTUAL_CAPACITY_TOO_SMALL


def test_kvcached_refuses_what_it_cannot_bind() -> None:
    with pytest.raises(KVPlanError) as info:
        plan_legacy(load("qwen2.5-7b-hnd"), strategy="kvcached")
    assert info.value.code is Code.KVCACHED_UNSUPPORTED and "NHD" in str(info.value)
    with pytest.raises(KVPlanError) as info:
        plan_legacy(
            load("deepseek-v2-lite-mla-bs128"), strategy="kvcached", pool_layout="contiguous"
        )
    assert info.value.code is Code.CONTIGUOUS_KERNEL_SPLIT
    # inline per-token-head scales: the scheduler's block bytes differ from the views' (#434)
    doc = mha([8, 2, 16, 8, 128], 2, 16, "noncontiguous")
    data = doc.model_dump(mode="json")
    spec = data["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]
    spec["page_size_padded"] = 2 * 65536
    for t in data["kv_cache_config"]["kv_cache_tensors"]:
        t["size"] = 2 * 65536 * 8
    with pytest.raises(KVPlanError) as info:
        plan_legacy(LegacyInputDocument.model_validate(data))
    assert info.value.code is Code.KVCACHED_UNSUPPORTED and "#399" in str(info.value)
