"""kvcached's ``per-layer`` pool layout (its v0.8 ``patch_initialize_kv_cache`` binding): one
non-contiguous pool per tensor-backed layer, bound sequentially; sharers alias their target.

Expected geometry is written out by hand from each fixture's page geometry (see the comments),
not computed by the code under test, and checked against kvcached 0.1.6's own code as recorded in
``tests/data/kvcached`` (its v0.8 binding and its V1 views, see ``test_kvcached_real``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.executor import apply, verify
from kvplan.planner import validate
from kvplan.planner.legacy import build_legacy_plan, kvcached_geometry, plan_legacy
from kvplan.schemas.errors import Code, KVPlanError
from kvplan.schemas.legacy import LegacyInputDocument
from kvplan.schemas.plan import BindingPlan
from tests.planner.legacy._helpers import ROOT, load, recorded
from tests.planner.legacy._kvcached_real import geometry, layout_of, plan_views, recording

MiB = 1 << 20
GEMMA_LAYER = "language_model.model.layers.{}.self_attn.attn".format
# layers in group order (groups [0,5,10] [1,6,11] [2,7,12] [3,8,13] [4,9,14]): pool kv_<i>
GEMMA_POOL_ORDER = [0, 5, 10, 1, 6, 11, 2, 7, 12, 3, 8, 13, 4, 9, 14]


def gemma() -> LegacyInputDocument:
    """The gemma-4-E2B fixture as a per-layer engine core records it: 15 pools.

    The fixture's ``scheduler_num_layers`` (3) is the group-index coordinator's count; kvcached's
    v0.8 engine core counts one pool per KV-cache tensor, i.e. per tensor-backed layer.
    """
    return load("gemma-4-e2b").model_copy(update={"scheduler_num_layers": 15})


def per_layer(doc: LegacyInputDocument) -> BindingPlan:
    plan, problems = build_legacy_plan(doc, strategy="kvcached", pool_layout="per-layer")
    assert plan is not None and [d for d in problems if d.is_error] == [], problems
    return plan


# -- gemma-4-E2B: 15 pools, 20 aliases --------------------------------------------------------

# bm = 32 tok x 1 head x 256 x 2 B = 16384 B (= 16 x 1 x 512 x 2 B for the full group);
# 341 blocks x 16384 B = 5 586 944 B -> 3 pages of 2 MiB: kv_bytes = 6 MiB per K or V half,
# N_v = 6 MiB / 16384 = 384; V half at 6291456 / 2 B = 3145728 elements; h = 32 x 256 = 16 x 512.
SLIDING = ([384, 2, 32, 1, 256], [8192, 3145728, 256, 256, 1])
FULL = ([384, 2, 16, 1, 512], [8192, 3145728, 512, 512, 1])


def test_gemma4_pools_are_one_per_tensor_backed_layer() -> None:
    plan = per_layer(gemma())
    assert plan.source.layout == "kvcached/per-layer"
    assert [p.name for p in plan.pools] == [f"kv_{i}" for i in range(15)]
    for pool in plan.pools:
        assert (pool.size_bytes, pool.num_blocks, pool.alignment_bytes) == (12 * MiB, 384, 2 * MiB)
    views = {v.layer: v for v in plan.views}
    assert {views[GEMMA_LAYER(n)].pool for n in range(15)} == {p.name for p in plan.pools}
    for i, n in enumerate(GEMMA_POOL_ORDER):
        assert views[GEMMA_LAYER(n)].pool == f"kv_{i}"
    s = plan.summary
    assert (s.tensor_backed_layers, s.aliased_layers) == (15, 20)
    assert s.pool_bytes == 15 * 12 * MiB == 188_743_680
    assert s.bytes_per_block == 15 * 2 * 16384


def test_gemma4_geometry() -> None:
    g = kvcached_geometry(gemma(), pool_layout="per-layer")
    assert (g.per_layer, g.contiguous, g.attention_type) == (True, False, "MHA")
    assert (g.num_pools, g.num_kv_buffers, g.cell_size, g.block_mem_bytes) == (15, 2, 512, 16384)
    assert (g.kv_bytes, g.ftensor_bytes, g.num_blocks) == (6 * MiB, 12 * MiB, 384)
    assert g.compound_page_bytes == 2 * MiB  # one page per pool, not P x L x 2


def test_gemma4_views_are_kvcached_per_layer_tensors() -> None:
    plan = per_layer(gemma())
    assert len(plan.views) == 15
    for v in plan.views:
        full = int(v.layer.split(".")[3]) % 5 == 4  # every fifth gemma-4 layer is full attention
        assert (v.shape, v.stride) == (FULL if full else SLIDING), v.layer
        assert v.offset_bytes == 0 and v.dtype == "bfloat16"
        assert v.kind == ("FullAttentionSpec" if full else "SlidingWindowSpec")


def test_gemma4_sharers_alias_their_target() -> None:
    plan = per_layer(gemma())
    aliases = {a.layer: a.target for a in plan.aliases}
    # layers 15..34 share the last layer of their type before them: 13 (sliding) or 14 (full)
    expected = {GEMMA_LAYER(n): GEMMA_LAYER(14 if n % 5 == 4 else 13) for n in range(15, 35)}
    assert aliases == expected
    views = {v.layer: v for v in plan.views}
    assert views[GEMMA_LAYER(13)].pool == "kv_11" and views[GEMMA_LAYER(14)].pool == "kv_14"
    assert not set(aliases) & set(views)


def test_the_fixture_as_recorded_plans_per_layer_with_15_pools() -> None:
    # its scheduler count (3) was recorded for the group-index engine core, not per-layer's
    doc = load("gemma-4-e2b")
    assert (doc.binding.pool_layout, doc.scheduler_num_layers) == ("noncontiguous", 3)
    plan = per_layer(doc)
    assert len(plan.pools) == 15 and len(plan.aliases) == 20


def test_a_count_recorded_for_the_other_layout_family_is_reported() -> None:
    recorded = load("gemma-4-e2b")
    per_layer_doc = recorded.model_copy(
        update={"binding": recorded.binding.model_copy(update={"pool_layout": "per-layer"})}
    )
    plan, problems = build_legacy_plan(per_layer_doc)  # per-layer engine core said 3
    assert plan is None and problems[0].code is Code.POOL_COUNT_MISMATCH
    assert "counts 3 pools" in problems[0].message and "binds 15" in problems[0].message
    # and the per-layer count is wrong for the group-index layouts
    _, problems = build_legacy_plan(gemma())
    assert problems[0].code is Code.POOL_COUNT_MISMATCH and "per-layer" in problems[0].message


def test_inflated_per_layer_count_is_reported() -> None:
    data = json.loads((ROOT / "tests/data/bad/KVP602-per-layer-inflated-pools.json").read_text())
    doc = LegacyInputDocument.model_validate(data)
    assert (doc.binding.pool_layout, doc.scheduler_num_layers) == ("per-layer", 35)
    errors = [d for d in validate(doc) if d.is_error]
    assert [d.code for d in errors] == [Code.POOL_COUNT_MISMATCH]
    assert "counts 35 pools" in errors[0].message and "20 runner-only" in errors[0].message
    with pytest.raises(KVPlanError) as info:
        kvcached_geometry(doc)
    assert info.value.code is Code.POOL_COUNT_MISMATCH


# -- llama and MLA ----------------------------------------------------------------------------

# (fixture, pools, pool bytes, blocks per pool, view shape, view stride)
OTHERS = {
    # bm = 16 x 8 x 128 x 2 B = 32768 B; 32 blocks = 1 MiB -> kv_bytes 2 MiB, N_v = 64;
    # h = 16 x 8 x 128 = 16384; V half at 2 MiB / 2 B = 1048576 elements; pool = K + V = 4 MiB
    "llama-3.1-8b": (32, 4 * MiB, 64, [64, 2, 16, 8, 128], [16384, 1048576, 1024, 128, 1]),
    # MLA, one buffer aligned to 2 pages: bm = 64 x 576 x 2 B = 73728 B; 16 blocks -> 4 MiB,
    # N_v = 4194304 // 73728 = 56; dense (56, 64, 576)
    "deepseek-v2-lite-mla": (27, 4 * MiB, 56, [56, 64, 576], [36864, 576, 1]),
    # bs 128 with 64-token kernel blocks: bm = 147456 B; 8 blocks -> 4 MiB, N_v = 28,
    # viewed as 28 x 2 kernel blocks (the contiguous layout refuses this split)
    "deepseek-v2-lite-mla-bs128": (27, 4 * MiB, 28, [56, 64, 576], [36864, 576, 1]),
}


@pytest.mark.parametrize("name", list(OTHERS))
def test_single_group_fixtures(name: str) -> None:
    pools, size, blocks, shape, stride = OTHERS[name]
    doc = load(name)
    assert doc.scheduler_num_layers == pools  # one group: per-layer = group-index count
    plan = per_layer(doc)
    assert [p.name for p in plan.pools] == [f"kv_{i}" for i in range(pools)]
    assert {(p.size_bytes, p.num_blocks) for p in plan.pools} == {(size, blocks)}
    assert [v.pool for v in plan.views] == [f"kv_{i}" for i in range(pools)]
    assert {(tuple(v.shape), tuple(v.stride), v.offset_bytes) for v in plan.views} == {
        (tuple(shape), tuple(stride), 0)
    }
    assert plan.aliases == []


# -- against kvcached 0.1.6's own code (tests/data/kvcached, see test_kvcached_real) ---------

# kvcached's v0.8 binding (patch_initialize_kv_cache) run on these models: one pool per layer,
# group 0's geometry for every layer, no kernel block size, no sharing
V08_EXACT = ["llama-3.1-8b", "deepseek-v2-lite-mla", "gemma-3-1b"]


def _per_layer_as_kvcached_sized(name: str, pools: int, capacity: int) -> BindingPlan:
    """``name`` planned per-layer with ``pools`` pools of ``capacity`` bytes reserved each."""
    doc = load(name).model_copy(update={"scheduler_num_layers": pools})
    plan, problems = build_legacy_plan(
        doc, strategy="kvcached", pool_layout="per-layer", virtual_capacity_bytes=capacity
    )
    assert plan is not None, problems
    return plan


@pytest.mark.parametrize("name", V08_EXACT)
def test_equals_kvcached_v08_binding(name: str) -> None:
    """Homogeneous, unsplit models: per-layer is exactly what kvcached's v0.8 path binds."""
    worker = layout_of(name, "per-layer")["worker"]
    pools = worker["create_kv_tensors"]["num_layers"]
    device = recording(name)["device_total_memory"]
    plan = _per_layer_as_kvcached_sized(name, pools, device // pools)
    assert plan_views(plan) == worker["views"] and len(plan.views) == pools
    assert [p.size_bytes for p in plan.pools] == worker["pools"]


@pytest.mark.parametrize("name", ["gemma-4-e2b", *V08_EXACT, "deepseek-v2-lite-mla-bs128"])
def test_views_are_kvcached_v1_views_one_pool_each(name: str) -> None:
    """The corrected form: each layer gets the very view kvcached's V1 path (non-contiguous)
    builds for its group, over a pool of its own of the same size."""
    v1 = layout_of(name, "noncontiguous")
    pools = v1["scheduler"]["num_layers"]
    device = recording(name)["device_total_memory"]
    doc = load(name)
    backed = [n for g in doc.kv_cache_config.kv_cache_groups for n in g.layer_names]
    backed = [n for n in backed if n not in set(doc.runner_only_attn_layers)]
    plan = _per_layer_as_kvcached_sized(name, len(backed), device // pools)
    assert [p.size_bytes for p in plan.pools] == [v1["worker"]["pools"][0]] * len(backed)
    expected = v1["worker"]["views"]
    assert [v.layer for v in plan.views] == backed
    for i, view in enumerate(plan.views):
        assert view.pool == f"kv_{i}" and view.offset_bytes == 0
        assert geometry(view) == {k: v for k, v in expected[view.layer].items() if k != "pool"}
    sharers = {k: v["alias_of"] for k, v in expected.items() if "alias_of" in v}
    assert {a.layer: [a.target] for a in plan.aliases} == sharers


def test_kvcached_v08_binding_is_wrong_where_per_layer_differs() -> None:
    """Where kvplan's per-layer departs from kvcached's v0.8 binding, v0.8 disagrees with what
    vLLM 0.24's runner hands the attention backend (``metadata.vllm_0_24_views``)."""
    # gemma-4-E2B: group 0's sliding geometry (32 tok x 1 x 256) for the full layers too
    v08 = layout_of("gemma-4-e2b", "per-layer")["worker"]["views"]
    vllm = recorded("gemma-4-e2b")
    full = GEMMA_LAYER(4)
    assert v08[full]["shape"][2:] == [32, 1, 256] != vllm[full]["shape"][2:] == [16, 1, 512]
    assert not set(v08) & set(load("gemma-4-e2b").shared_kv_cache_layers)  # no sharers bound
    # --block-size 128 on FlashMLA's 64-token kernel blocks: v0.8 views whole blocks
    v08 = layout_of("deepseek-v2-lite-mla-bs128", "per-layer")["worker"]["views"]
    layer = next(iter(v08))
    assert (
        v08[layer]["shape"][1] == 128 != recorded("deepseek-v2-lite-mla-bs128")[layer]["shape"][1]
    )
    # attention+Mamba: v0.8 never handled it (kvplan refuses, test_mamba_is_refused_...)
    error = layout_of("jamba-v0.1-hybrid", "per-layer")["worker"]["error"]
    assert error.startswith("AttributeError") and "MambaSpec" in error


def test_mamba_is_refused_with_the_reason() -> None:
    doc = load("jamba-v0.1-hybrid").model_copy(update={"scheduler_num_layers": None})
    with pytest.raises(KVPlanError) as info:
        plan_legacy(doc, strategy="kvcached", pool_layout="per-layer")
    assert info.value.code is Code.KVCACHED_UNSUPPORTED
    assert "no Mamba state views" in str(info.value)
    with pytest.raises(KVPlanError):
        kvcached_geometry(doc, pool_layout="per-layer")


# -- execution --------------------------------------------------------------------------------

PLANS = {"gemma-4-e2b": lambda: per_layer(gemma())} | {
    name: (lambda n=name: per_layer(load(n))) for name in OTHERS
}


@pytest.mark.parametrize("backend", ["host-vmm", "torch"])
@pytest.mark.parametrize("name", list(PLANS))
def test_apply_and_verify(name: str, backend: str) -> None:
    plan = PLANS[name]()
    assert validate(plan) == []
    bound = apply(plan, backend=backend, device="cpu")
    try:
        assert verify(plan, bound.tensors, pools=bound.pools) == []
        for alias in plan.aliases:
            assert bound.tensors[alias.layer] is bound.tensors[alias.target]
        assert len({bound.pools[p.name].data_ptr() for p in plan.pools}) == len(plan.pools)
    finally:
        bound.close()


@pytest.mark.parametrize("backend", ["host-vmm", "torch"])
def test_gemma4_sharers_read_their_targets_cache(backend: str) -> None:
    bound = apply(per_layer(gemma()), backend=backend, device="cpu")
    try:
        t = bound.tensors
        t[GEMMA_LAYER(13)][5, 1].fill_(3.0)
        assert torch.all(t[GEMMA_LAYER(33)][5, 1] == 3.0)  # 33 shares 13 (sliding)
        assert t[GEMMA_LAYER(34)] is t[GEMMA_LAYER(14)]  # full
        # unlike the group-index layouts, layers 5 (sliding) and 9 (full) own separate pools
        t[GEMMA_LAYER(5)][5].fill_(0)
        t[GEMMA_LAYER(9)][5].fill_(7.0)
        assert torch.all(t[GEMMA_LAYER(5)][5] == 0)
    finally:
        bound.close()


def test_cli_plans_per_layer(tmp_path: Path) -> None:
    path = tmp_path / "gemma.json"
    path.write_text(gemma().model_dump_json())
    args = ["plan", str(path), "--strategy", "kvcached", "--pool-layout", "per-layer"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["source"]["layout"] == "kvcached/per-layer"
    assert (len(data["pools"]), len(data["aliases"])) == (15, 20)
