"""Strategy ``vanilla`` against what vLLM 0.24.0's runner really produced (the fixtures)."""

from __future__ import annotations

import pytest

from kvplan import planner
from kvplan.planner.legacy import plan_legacy
from kvplan.schemas.errors import Code, KVPlanError
from tests.planner.legacy._helpers import FIXTURES, load, raw, recorded


def test_every_case_is_committed() -> None:
    assert set(FIXTURES) >= {
        "llama-3.1-8b",
        "qwen2.5-7b-hnd",
        "gemma-3-1b",
        "gemma-4-e2b",
        "gemma-4-e2b-nohma",
        "deepseek-v2-lite-mla",
        "deepseek-v2-lite-mla-bs128",
        "jamba-v0.1-hybrid",
    }
    for name in FIXTURES:
        doc = load(name)
        assert doc.vllm_version == "0.24.0"
        assert doc.metadata["tool"] == "tools/make_legacy_fixtures.py"


@pytest.mark.parametrize("name", FIXTURES)
def test_vanilla_views_equal_vllm_0_24(name: str) -> None:
    doc = load(name)
    plan = plan_legacy(doc, strategy="vanilla")
    seen = recorded(name)
    allocation = {pool.name: i for i, pool in enumerate(plan.pools)}
    got = {
        v.layer: {
            "allocation": allocation[v.pool],
            "dtype": v.dtype,
            "shape": v.shape,
            "stride": v.stride,
            "offset_bytes": v.offset_bytes,
        }
        for v in plan.views
    }
    expected = {k: v for k, v in seen.items() if "alias_of" not in v}
    assert got == expected
    aliases = {a.layer: a.target for a in plan.aliases}
    assert aliases == {k: v["alias_of"] for k, v in seen.items() if "alias_of" in v}
    assert all(v["same_object"] for v in seen.values() if "alias_of" in v)
    # one pool per allocation vLLM made, each of the tensor's size
    sizes = [t.size for t in doc.kv_cache_config.kv_cache_tensors]
    assert [p.size_bytes for p in plan.pools] == sizes


def test_gemma4_e2b_real_grouping_and_sharing() -> None:
    doc = load("gemma-4-e2b")
    cfg = doc.kv_cache_config
    assert [len(g.layer_names) for g in cfg.kv_cache_groups] == [3, 3, 3, 19, 7]
    assert len(cfg.kv_cache_tensors) == 3 and doc.scheduler_num_layers == 3
    name = "language_model.model.layers.{}.self_attn.attn".format
    assert doc.shared_kv_cache_layers == {
        name(i): name(14) if i % 5 == 4 else name(13) for i in range(15, 35)
    }
    assert set(doc.runner_only_attn_layers) == set(doc.shared_kv_cache_layers)
    plan = plan_legacy(doc)
    assert len(plan.pools) == 3 and len(plan.aliases) == 20
    assert plan.summary.tensor_backed_layers == 15
    # each pool is shared by layer i of each of the 5 groups
    by_pool = {p.name: sorted(v.group for v in plan.views if v.pool == p.name) for p in plan.pools}
    assert all(groups == [0, 1, 2, 3, 4] for groups in by_pool.values())
    views = plan.view_by_layer
    assert views[name(0)].shape == [341, 2, 32, 1, 256]  # sliding: 32-token blocks
    assert views[name(4)].shape == [341, 2, 16, 1, 512]  # full: head 512


def test_gemma4_e2b_without_hybrid_manager_has_15_pools() -> None:
    """HMA off: one UniformTypeKVCacheSpecs group, one tensor per tensor-backed layer.

    vLLM 0.24 itself raises KeyError here (it looks sharers up in ``kv_cache_specs``); kvplan
    resolves a sharer's spec through its target.
    """
    doc = load("gemma-4-e2b-nohma")
    plan = plan_legacy(doc)
    assert len(plan.pools) == 15 and len(plan.aliases) == 20
    assert doc.scheduler_num_layers == 15
    with pytest.raises(KVPlanError) as info:
        plan_legacy(doc, strategy="kvcached")
    assert info.value.code is Code.KVCACHED_UNSUPPORTED


def test_hnd_stride_order_permutes_heads_outside_tokens() -> None:
    plan = plan_legacy(load("qwen2.5-7b-hnd"))
    view = plan.views[0]
    assert view.shape == [36, 2, 16, 4, 128]
    assert view.stride == [16384, 8192, 128, 2048, 1]


def test_kernel_block_split_is_in_the_backend_shape() -> None:
    plan = plan_legacy(load("deepseek-v2-lite-mla-bs128"))
    assert load("deepseek-v2-lite-mla-bs128").kernel_block_sizes == [64]
    assert plan.views[0].shape == [16, 64, 576]  # 8 blocks of 128 tokens, kernel 64


def test_mamba_states_are_views_named_layer_hash_i() -> None:
    plan = plan_legacy(load("jamba-v0.1-hybrid"))
    states = [v for v in plan.views if v.layer.startswith("model.layers.0.mamba#")]
    assert [v.layer for v in states] == ["model.layers.0.mamba#0", "model.layers.0.mamba#1"]
    assert states[1].offset_bytes == 3 * 8192 * 2  # after the conv state
    assert states[0].stride[0] == 327680 // 2  # padded page, in bf16 elements
    assert plan.summary.tensor_backed_layers == 32


def test_kvplan_plan_dispatches_legacy_documents() -> None:
    doc = load("gemma-4-e2b")
    assert planner.plan(doc) == plan_legacy(doc)
    assert planner.validate(doc) == planner.build_plan(doc)[1]


def test_strategy_changes_the_fingerprint_but_not_the_document() -> None:
    doc = load("gemma-3-1b")
    a = plan_legacy(doc)
    b = plan_legacy(doc, strategy="kvcached")
    assert a.fingerprint != b.fingerprint
    assert raw("gemma-3-1b")["binding"]["strategy"] == "vanilla"
