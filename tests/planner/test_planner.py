"""Planner output against vLLM 0.33 numbers recorded in the reference (§4.1, verified on vLLM)."""

from __future__ import annotations

import pytest

import kvplan
from harness import _builders as b
from kvplan.planner import build_plan
from kvplan.schemas import KVPlanError
from kvplan.schemas.loading import parse_input


def _plan(doc: dict) -> kvplan.BindingPlan:
    return kvplan.plan(parse_input(doc))


def test_llama_layer_outermost_views_match_vllm() -> None:
    plan = _plan(b.llama(4, num_blocks=512))
    assert plan.pools[0].size_bytes == 8388608
    first, last = plan.views[0], plan.views[3]
    assert (first.shape, first.stride, first.offset_bytes) == (
        [512, 2, 16, 64],
        [2048, 64, 128, 1],
        0,
    )
    assert last.offset_bytes == 6291456
    assert plan.summary.bytes_per_block == 16384


def test_gemma4_e2b_lbnhc_matches_vllm_and_aliases_20_layers() -> None:
    plan = _plan(b.gemma4_e2b("LBNHC", num_blocks=2730))
    assert plan.pools[0].size_bytes == 268369920
    views = plan.view_by_layer
    l13 = views[b.name(13)]
    assert (l13.shape, l13.stride, l13.offset_bytes) == (
        [2730, 1, 32, 512],
        [16384, 512, 512, 1],
        178913280,
    )
    assert len(plan.views) == 15 and len(plan.aliases) == 20
    targets = {a.layer: a.target for a in plan.aliases}
    assert targets[b.name(15)] == b.name(13) and targets[b.name(19)] == b.name(14)
    assert plan.summary.alias_saved_bytes == 20 * 32768 * 2730


def test_gemma4_e2b_blhnc_packs_layers_per_block() -> None:
    plan = _plan(b.gemma4_e2b("BLHNC", num_blocks=2730))
    g0 = [v for v in plan.views if v.group == 0]
    assert [v.offset_bytes for v in g0] == [i * 16384 for i in range(6)]
    assert g0[0].shape == [2730, 1, 16, 512]
    assert g0[0].stride == [49152, 8192, 512, 1]  # block stride 98304 B
    assert not [d for d in kvplan.validate(plan) if d.is_error]


def test_mla_view_squeezes_nothing_and_keeps_one_head() -> None:
    plan = _plan(b.mla(4))
    view = plan.views[0]
    assert view.shape == [16, 1, 64, 576] and view.stride == [36864, 576, 576, 1]


def test_mla_fp8_padded_page_sets_the_block_stride() -> None:
    doc = b.mla(2, dtype="uint8", alignment=1024)
    plan = _plan(doc)
    page = -(-64 * 576 // 1024) * 1024
    assert plan.views[0].stride[0] == page and plan.views[0].dtype == "uint8"


def test_mamba_views_are_int8_pages_with_the_padded_stride() -> None:
    plan = _plan(b.mamba_hybrid(num_blocks=16))
    mamba = plan.view_by_layer["model.layers.0.mixer"]
    assert mamba.dtype == "int8" and mamba.kind == "MambaSpec"
    assert mamba.shape == [16, 1, 1, 137984]
    assert mamba.stride == [139264, 137984, 137984, 1]
    attn = plan.view_by_layer[b.name(3)]
    assert attn.shape == [16, 2, 272, 128] and attn.stride == [69632, 128, 256, 1]


@pytest.mark.parametrize(
    "layout,layer_stride,block_stride,expect_stride",
    [
        # (layer_stride, block_stride) as vLLM's get_kv_cache_config_from_groups places them
        ("LBHNC", 262144, 4096, [2048, 1024, 64, 1]),
        ("LBNHC", 262144, 4096, [2048, 64, 128, 1]),
        ("LHBNC", 262144, 2048, [1024, 65536, 64, 1]),
        ("BLHNC", 4096, 16384, [8192, 1024, 64, 1]),
        ("BLNHC", 4096, 16384, [8192, 64, 128, 1]),
        ("BHLNC", 2048, 16384, [8192, 4096, 64, 1]),
    ],
)
def test_all_six_layouts(
    layout: str, layer_stride: int, block_stride: int, expect_stride: list[int]
) -> None:
    # 4 layers, 2 heads, 16 tokens, hd 32 bf16: page 4096 B; 64 blocks
    doc = b.llama(4, num_blocks=64, layout=layout)
    doc["kv_cache_config"]["kv_cache_tensors"][0].update(
        layer_stride=layer_stride, block_stride=block_stride
    )
    plan = _plan(doc)
    assert plan.views[0].stride == expect_stride
    assert plan.views[1].offset_bytes == layer_stride
    assert [d.code.value for d in kvplan.validate(plan) if d.is_error] == []
    assert not [d for d in kvplan.validate(plan) if d.is_error]


def test_kernel_block_split_doubles_the_block_axis() -> None:
    doc = b.gemma4_e2b("LBNHC", num_blocks=64)
    doc["kernel_block_sizes"] = [16, 16, 16, 16, 16]
    plan = _plan(doc)
    sw = plan.view_by_layer[b.name(0)]
    assert sw.shape == [128, 1, 16, 512] and sw.stride == [8192, 512, 512, 1]


def test_kernel_split_of_a_packed_layout_is_refused_like_vllm() -> None:
    doc = b.gemma4_e2b("BLHNC")
    doc["kernel_block_sizes"] = [8, 8, 16]
    with pytest.raises(KVPlanError) as info:
        _plan(doc)
    assert info.value.code.value == "KVP111"
    assert "LBNHC" in info.value.diagnostics[0].hint


def test_specs_without_layer_views_get_the_whole_pool() -> None:
    doc = b.document(
        [
            (
                ["hot"],
                {
                    "kind": "HiSparseHotSpec",
                    "block_size": 64,
                    "page_size": 4096,
                    "blocks_per_request": 2,
                },
            )
        ],
        num_blocks=8,
    )
    doc["kv_cache_config"]["kv_cache_tensors"][0].update(layer_stride=4096, block_stride=4096)
    plan = _plan(doc)
    assert plan.views[0].shape == [plan.pools[0].size_bytes] and plan.views[0].dtype == "int8"


def test_runner_side_config_with_sharers_appended_plans_the_same() -> None:
    scheduler_side = b.gemma4_e2b()
    runner_side = b.gemma4_e2b()
    for sharer, target in runner_side["shared_kv_cache_layers"].items():
        for group in runner_side["kv_cache_config"]["kv_cache_groups"]:
            if target in group["layer_names"]:
                group["layer_names"].append(sharer)
    a, c = _plan(scheduler_side), _plan(runner_side)
    assert a.views == c.views and a.aliases == c.aliases


def test_uniform_group_sharer_resolves_through_its_target() -> None:
    # vLLM's runner would KeyError on kv_cache_specs[sharer]; kvplan binds it to the target.
    doc = b.gemma4_e2b("BLHNC")
    for sharer, target in doc["shared_kv_cache_layers"].items():
        for group in doc["kv_cache_config"]["kv_cache_groups"]:
            if target in group["layer_names"]:
                group["layer_names"].append(sharer)
    plan = _plan(doc)
    assert len(plan.aliases) == 20


def test_every_error_is_collected_not_just_the_first() -> None:
    doc = b.gemma4_e2b()
    doc["shared_kv_cache_layers"][b.name(15)] = b.name(15)
    doc["shared_kv_cache_layers"][b.name(16)] = "missing.attn"
    doc["kv_cache_config"]["kv_cache_tensors"][0]["size"] += 1
    _, problems = build_plan(parse_input(doc))
    codes = {d.code.value for d in problems}
    assert {"KVP205", "KVP201", "KVP103"} <= codes


def test_plan_is_deterministic_and_fingerprinted() -> None:
    doc = parse_input(b.gemma4_e2b())
    assert kvplan.dumps(kvplan.plan(doc)) == kvplan.dumps(kvplan.plan(doc))
    other = parse_input(b.gemma4_e2b(num_blocks=65))
    assert kvplan.plan(doc).fingerprint != kvplan.plan(other).fingerprint


def test_validate_a_plan_catches_a_tampered_view() -> None:
    plan = _plan(b.llama(4))
    views = [
        v.model_copy(update={"offset_bytes": 16}) if i == 1 else v for i, v in enumerate(plan.views)
    ]
    bad = plan.model_copy(update={"views": views})
    codes = {d.code.value for d in kvplan.validate(bad) if d.is_error}
    assert "KVP302" in codes  # overlaps layer 0


def test_validate_a_plan_catches_alias_chains_and_missing_targets() -> None:
    plan = _plan(b.gemma4_e2b())
    from kvplan.schemas import Alias

    aliases = [
        *plan.aliases,
        Alias(layer="x.attn", target=b.name(15)),
        Alias(layer="y.attn", target="nowhere"),
    ]
    codes = {d.code.value for d in kvplan.validate(plan.model_copy(update={"aliases": aliases}))}
    assert {"KVP203", "KVP201"} <= codes


def test_granularity_warning_follows_the_backend() -> None:
    doc = parse_input(b.llama(4, num_blocks=64))  # 1 MiB pool: not a multiple of 2 MiB
    assert [d.code.value for d in kvplan.validate(doc)] == ["KVP308"]
    assert kvplan.validate(doc, granularity=0) == []
    assert kvplan.validate(doc, granularity=1 << 20) == []
