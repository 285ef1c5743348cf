"""kvplan's plan equals what vLLM's own ``allocate_kv_cache`` and alias loop bind, per layer.

For each case, vLLM plans a shrunk real model on the CPU (engine-core grouping and placement,
the runner's KV-sharing append, kernel block sizes); kvplan captures the runner's config and
plans it; vLLM's real ``allocate_kv_cache`` then runs on the CPU and every layer's tensor
(dtype, shape, stride, byte offset = data_ptr - base) and alias must match the plan.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import kvplan
from kvplan.integrations.vllm import capture, to_vllm
from kvplan.integrations.vllm.inspect.fidelity import compare, vllm_kv_caches
from kvplan.schemas.input import InputDocument
from tests.integrations.vllm.capture._cases import CASES, Built, default_block_size

BuiltCase = Callable[[str], Built]


@pytest.mark.parametrize("name", list(CASES))
def test_plan_matches_vllm_allocate_kv_cache(name: str, built: BuiltCase) -> None:
    case = built(name)
    for rank, runner in enumerate(case.runner_configs):
        shared = case.shared[rank]
        kbs = case.kernel_block_sizes[rank]
        document = capture(runner, shared_kv_cache_layers=shared, kernel_block_sizes=kbs)
        plan = kvplan.plan(document)
        caches = vllm_kv_caches(runner, case.layout, kbs, shared, device="cpu")
        assert compare(plan, caches) == [], f"rank {rank}"
        # Byte offsets from real addresses, not just storage offsets.
        base = next(iter(caches.values())).untyped_storage().data_ptr()
        for view in plan.views:
            assert caches[view.layer].data_ptr() - base == view.offset_bytes, view.layer
        assert {a.layer: a.target for a in plan.aliases} == shared
        assert plan.pools[0].size_bytes >= runner.kv_cache_tensors[0].size


@pytest.mark.parametrize("name", list(CASES))
def test_capture_round_trips_with_vllm_equality(name: str, built: BuiltCase) -> None:
    case = built(name)
    for worker, runner, shared, kbs in zip(
        case.worker_configs, case.runner_configs, case.shared, case.kernel_block_sizes, strict=True
    ):
        from_runner = capture(runner, shared_kv_cache_layers=shared, kernel_block_sizes=kbs)
        from_worker = capture(worker, shared_kv_cache_layers=shared, kernel_block_sizes=kbs)
        assert from_runner.kv_cache_config == from_worker.kv_cache_config
        assert to_vllm(from_runner) == worker
        assert to_vllm(from_runner, with_sharers=True) == runner
        reread = InputDocument.model_validate_json(kvplan.dumps(from_runner))
        assert to_vllm(reread) == worker


def test_llama_views_match_the_reference_numbers(built: BuiltCase) -> None:
    case = built("llama")
    config = case.worker_configs[0]
    plan = kvplan.plan(capture(config, shared_kv_cache_layers={}))
    view = plan.views[0]
    assert view.dtype == "bfloat16"
    block = default_block_size()  # N: the release's default block size
    assert view.shape[1:] == [8, block, 256]  # [B, H, N, C]: 8 KV heads, K||V packed in C
    assert [v.offset_bytes for v in plan.views] == [
        i * config.kv_cache_tensors[0].layer_stride for i in range(4)
    ]


def test_int8_per_token_head_packs_inline_scales(built: BuiltCase) -> None:
    plan = kvplan.plan(
        capture(built("llama-int8-per-token-head").worker_configs[0], shared_kv_cache_layers={})
    )
    # TritonAttention.customize_spec: (128 + 128) int8 + 2 fp32 scales = 264 bytes per state.
    assert {v.dtype for v in plan.views} == {"int8"}
    assert {v.shape[-1] for v in plan.views} == {264}


def test_fp8_is_stored_as_uint8(built: BuiltCase) -> None:
    doc = capture(built("llama-fp8").worker_configs[0], shared_kv_cache_layers={})
    spec = doc.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    assert spec.dtype == "uint8" and spec.kv_quant_mode.name == "FP8_PER_TENSOR"


@pytest.mark.parametrize("name", ["gemma4-e2b-LBNHC", "gemma4-e2b-BLHNC", "gemma4-text"])
def test_gemma4_sharing_targets_last_layer_of_same_type(name: str, built: BuiltCase) -> None:
    case = built(name)
    shared = case.shared[0]
    assert len(shared) == 20
    targets = {int(t.split("layers.")[1].split(".")[0]) for t in shared.values()}
    assert targets == {13, 14}
    for layer, target in shared.items():
        index = int(layer.split("layers.")[1].split(".")[0])
        assert target.split("layers.")[1].startswith("14." if index % 5 == 4 else "13.")
    # the text model alone names its layers model.layers.N (no language_model. prefix)
    assert all(layer.startswith("model.") for layer in shared) == (name == "gemma4-text")


def test_blhnc_sharers_resolve_through_their_target(built: BuiltCase) -> None:
    """vLLM's runner would index kv_cache_specs[sharer] (KeyError); kvplan does not."""
    case = built("gemma4-e2b-BLHNC")
    runner = case.runner_configs[0]
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    uniform = [
        g for g in runner.kv_cache_groups if isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs)
    ]
    assert uniform
    missing = [
        name
        for g in uniform
        for name in g.layer_names
        if name not in g.kv_cache_spec.kv_cache_specs
    ]
    assert sorted(missing) == sorted(case.shared[0])
    plan = kvplan.plan(capture(runner, shared_kv_cache_layers=case.shared[0]))
    assert len(plan.views) == 15 and len(plan.aliases) == 20


def test_hybrid_manager_changes_grouping(built: BuiltCase) -> None:
    hybrid = built("gemma3-hybrid").worker_configs[0]
    single = built("gemma3-no-hybrid").worker_configs[0]
    assert len(hybrid.kv_cache_groups) > 1
    assert len(single.kv_cache_groups) == 1
    assert type(single.kv_cache_groups[0].kv_cache_spec).__name__ == "FullAttentionSpec"


def test_spec_kinds_of_the_cases(built: BuiltCase) -> None:
    def kinds(name: str) -> set[str]:
        config = built(name).worker_configs[0]
        return {type(g.kv_cache_spec).__name__ for g in config.kv_cache_groups}

    assert kinds("mla-bf16") == {"MLAAttentionSpec"}
    assert "MambaSpec" in kinds("jamba-hybrid")
    assert "ChunkedLocalAttentionSpec" in kinds("llama4-chunked") or "FullAttentionSpec" in kinds(
        "llama4-chunked"
    )
    assert kinds("gpt-oss-sinks") >= {"SlidingWindowSpec"}


def test_tp2_ranks_hold_half_the_kv_heads(built: BuiltCase) -> None:
    tp2 = built("llama-tp2")
    assert len(tp2.worker_configs) == 2
    for config in tp2.worker_configs:
        assert config.kv_cache_groups[0].kv_cache_spec.num_kv_heads == 4  # 8 KV heads / 2
