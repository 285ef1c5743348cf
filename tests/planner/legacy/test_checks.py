"""Input rules of legacy documents, and vLLM 0.24's packed / padded reshape paths."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from kvplan.planner.legacy import build_legacy_plan, plan_legacy
from kvplan.schemas.errors import Code
from kvplan.schemas.legacy import parse_legacy
from tests.planner.legacy._make_bad_docs import tiny

L0, L1 = "model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"


def first_code(doc: dict[str, Any]) -> Code | None:
    _, problems = build_legacy_plan(parse_legacy(doc))
    errors = [d for d in problems if d.is_error]
    return errors[0].code if errors else None


def _with_sharer(doc: dict[str, Any], target: str = L0) -> dict[str, Any]:
    doc["kv_cache_config"]["kv_cache_groups"][0]["layer_names"].append("s")
    doc["runner_only_attn_layers"] = ["s"]
    doc["shared_kv_cache_layers"] = {"s": target}
    return doc


def test_the_tiny_document_plans() -> None:
    assert first_code(tiny()) is None
    assert first_code(_with_sharer(tiny())) is None


@pytest.mark.parametrize(
    "mutate, code",
    [
        (
            lambda d: d["kv_cache_config"]["kv_cache_tensors"][0]["shared_by"].append("x"),
            Code.LAYER_NOT_IN_GROUP,
        ),
        (
            lambda d: d["kv_cache_config"]["kv_cache_tensors"][1]["shared_by"].append(L0),
            Code.LAYER_BOUND_TWICE,
        ),
        (
            lambda d: d["kv_cache_config"]["kv_cache_tensors"][0].update(size=30000),
            Code.SIZE_NOT_PAGE_MULTIPLE,
        ),
        (lambda d: d["kv_cache_config"].update(num_blocks=9), Code.SIZE_NOT_PAGE_MULTIPLE),
        (lambda d: _with_sharer(d, "nope"), Code.ALIAS_TARGET_MISSING),
        (lambda d: _with_sharer(d, "s"), Code.ALIAS_SELF),
        (
            lambda d: _with_sharer(d)["kv_cache_config"]["kv_cache_tensors"][0]["shared_by"].append(
                "s"
            ),
            Code.ALIAS_ALSO_BOUND,
        ),
        (lambda d: d.update(kernel_block_sizes=[]), Code.KERNEL_BLOCK_SIZES_LENGTH),
        (lambda d: d.update(attn_groups=[]), Code.BACKEND_SHAPE_MISMATCH),
        (
            lambda d: d["attn_groups"][0].update(stride_order=[0, 1, 2, 3, 3]),
            Code.BACKEND_SHAPE_MISMATCH,
        ),
        (lambda d: d["attn_groups"][0].update(block_dim=1), Code.BACKEND_SHAPE_MISMATCH),
        (lambda d: d.update(kernel_block_sizes=[5]), Code.BACKEND_SHAPE_MISMATCH),
        (lambda d: d.update(scheduler_num_layers=3), Code.POOL_COUNT_MISMATCH),
        (
            lambda d: d["kv_cache_config"]["kv_cache_groups"][0]["layer_names"].append("lost"),
            Code.LEGACY_LAYER_UNBACKED,
        ),
    ],
)
def test_input_rules(mutate: Any, code: Code) -> None:
    doc = tiny()
    mutate(doc)
    assert first_code(doc) is code


def test_chained_sharers_and_unbacked_targets() -> None:
    doc = _with_sharer(tiny())
    doc["kv_cache_config"]["kv_cache_groups"][0]["layer_names"].append("t")
    doc["runner_only_attn_layers"].append("t")
    doc["shared_kv_cache_layers"]["t"] = "s"
    assert first_code(doc) is Code.ALIAS_CHAIN
    doc = _with_sharer(tiny())
    doc["kv_cache_config"]["kv_cache_groups"][0]["layer_names"].append("r")
    doc["runner_only_attn_layers"].append("r")
    doc["shared_kv_cache_layers"] = {"s": "r"}
    assert first_code(doc) is Code.ALIAS_TARGET_NOT_BACKED


def test_encoder_only_group_layers_are_runner_only() -> None:
    doc = tiny()
    spec = dict(doc["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"])
    spec["kind"] = "EncoderOnlyAttentionSpec"
    doc["kv_cache_config"]["kv_cache_groups"].append(
        {"layer_names": ["enc"], "kv_cache_spec": spec}
    )
    doc["runner_only_attn_layers"] = ["enc"]
    plan = plan_legacy(parse_legacy(doc))
    assert "enc" not in plan.layers and len(plan.views) == 2
    assert first_code({**doc, "binding": {"strategy": "kvcached"}}) is Code.KVCACHED_UNSUPPORTED


# -- vLLM 0.24's packed and padded reshape paths, replayed with torch ------------------------


def _replay(
    raw: torch.Tensor,
    shape: list[int],
    order: list[int],
    dtype: torch.dtype,
    packing: tuple[int, int] | None,
    padded: int | None,
) -> torch.Tensor:
    """``_reshape_attention_kv_cache`` of vLLM 0.24 (gpu/attn_utils.py), re-typed."""
    permuted = [shape[i] for i in order]
    inv = [order.index(i) for i in range(len(order))]
    if packing is not None:
        offset, block_stride = packing
        page = math.prod(shape[1:]) * dtype.itemsize
        cache = raw.view(-1, block_stride)[:, offset : offset + page].view(dtype).view(shape)
    elif padded is not None:
        strides = list(torch.empty(permuted).stride())
        strides[inv[0]] = padded // dtype.itemsize
        cache = torch.as_strided(raw.view(dtype), permuted, strides)
    else:
        cache = raw.view(dtype).view(permuted)
    return cache.permute(*inv)


def _check(doc: dict[str, Any], packing: tuple[int, int] | None, padded: int | None) -> None:
    plan = plan_legacy(parse_legacy(doc))
    group = doc["attn_groups"][0]
    size = doc["kv_cache_config"]["kv_cache_tensors"][0]["size"]
    raw = torch.zeros(size, dtype=torch.int8)
    want = _replay(
        raw, group["kv_cache_shape"], group["stride_order"], torch.bfloat16, packing, padded
    )
    view = plan.view_by_layer[L0]
    assert (view.shape, view.stride) == (list(want.shape), list(want.stride()))
    assert view.offset_bytes == want.data_ptr() - raw.data_ptr()


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4], [0, 1, 3, 2, 4]])
def test_padded_pages_are_strided_like_vllm(order: list[int]) -> None:
    doc = tiny()
    spec = doc["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]
    spec["page_size_padded"] = 6144
    for t in doc["kv_cache_config"]["kv_cache_tensors"]:
        t["size"] = 6144 * 8
    doc["attn_groups"][0]["stride_order"] = order
    _check(doc, None, 6144)


def test_packed_tensors_share_one_allocation_like_vllm() -> None:
    doc = tiny()
    block = 2 * 4096
    doc["kv_cache_config"]["kv_cache_tensors"] = [
        {"size": block * 8, "shared_by": [L0], "offset": 0, "block_stride": block},
        {"size": block * 8, "shared_by": [L1], "offset": 4096, "block_stride": block},
    ]
    plan = plan_legacy(parse_legacy(doc))
    assert [p.name for p in plan.pools] == ["packed"] and plan.pools[0].size_bytes == block * 8
    _check(doc, (0, block), None)
    view = plan.view_by_layer[L1]
    assert view.offset_bytes == 4096 and view.stride[0] == block // 2


def test_hybrid_models_restride_kv_first_attention_like_vllm() -> None:
    """``_update_hybrid_attention_mamba_layout``: (2, N, ...) caches become block-interleaved."""
    from tests.planner.legacy.test_kvcached import hybrid

    plan = plan_legacy(hybrid(16, "noncontiguous"), strategy="vanilla")
    view = plan.view_by_layer["g0.l0"]
    cache = torch.zeros(1024 * 8, dtype=torch.int8).view(torch.float16).view(2, 8, 16, 2, 8)
    hidden = cache.shape[2:].numel()
    cache.as_strided_(size=cache.shape, stride=(hidden, 2 * hidden, *cache.stride()[2:]))
    assert (view.shape, view.stride) == (list(cache.shape), list(cache.stride()))
