"""The ``kvplan.input-legacy/1`` document: parsing, 0.24 page formulas, errors, capture encoding."""

from __future__ import annotations

import dataclasses
import json
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
import torch

from kvplan.schemas.canonical import to_data
from kvplan.schemas.errors import Code, KVPlanError
from kvplan.schemas.legacy import LegacyKVCacheGroupSpec, parse_legacy
from kvplan.schemas.loading import load_any
from tests.planner.legacy._helpers import FIXTURES, LEGACY, raw


def page(spec: dict[str, Any]) -> int:
    model = LegacyKVCacheGroupSpec.model_validate({"layer_names": [], "kv_cache_spec": spec})
    return model.kv_cache_spec.page_size_bytes


BASE = {"block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype": "bfloat16"}


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"kind": "AttentionSpec", **BASE}, 2 * 16 * 2 * 64 * 2),
        ({"kind": "FullAttentionSpec", **BASE, "head_size_v": 32}, 16 * 2 * (64 + 32) * 2),
        ({"kind": "SlidingWindowSpec", **BASE, "sliding_window": 8}, 2 * 16 * 2 * 64 * 2),
        # per-token-head scales: + 2 * bs * H * 4 bytes in the page
        (
            {
                "kind": "FullAttentionSpec",
                **BASE,
                "dtype": "int8",
                "kv_quant_mode": "INT8_PER_TOKEN_HEAD",
            },
            2 * 16 * 2 * 64 + 2 * 16 * 2 * 4,
        ),
        ({"kind": "FullAttentionSpec", **BASE, "page_size_padded": 9000}, 9000),
        (
            {
                "kind": "MLAAttentionSpec",
                "block_size": 64,
                "num_kv_heads": 1,
                "head_size": 576,
                "dtype": "bfloat16",
            },
            64 * 576 * 2,
        ),
        (
            {
                "kind": "MLAAttentionSpec",
                "block_size": 64,
                "num_kv_heads": 1,
                "head_size": 576,
                "dtype": "uint8",
                "cache_dtype_str": "fp8_ds_mla",
            },
            64 * 656,
        ),
        (
            {
                "kind": "MLAAttentionSpec",
                "block_size": 64,
                "num_kv_heads": 1,
                "head_size": 576,
                "dtype": "bfloat16",
                "compress_ratio": 4,
            },
            16 * 576 * 2,
        ),
        (
            {
                "kind": "MLAAttentionSpec",
                "block_size": 16,
                "num_kv_heads": 1,
                "head_size": 576,
                "dtype": "bfloat16",
                "alignment": 4096,
            },
            20480,
        ),
        (
            {
                "kind": "MambaSpec",
                "block_size": 16,
                "shapes": [[3, 8], [4, 4]],
                "dtypes": ["bfloat16", "float32"],
            },
            3 * 8 * 2 + 4 * 4 * 4,
        ),
        ({"kind": "TQFullAttentionSpec", **BASE, "tq_slot_size": 40}, 16 * 2 * 40),
    ],
)
def test_page_sizes_follow_vllm_0_24(spec: dict[str, Any], expected: int) -> None:
    assert page(spec) == expected


@pytest.mark.parametrize("name", FIXTURES)
def test_fixtures_round_trip_and_load_by_format(name: str) -> None:
    doc = load_any(LEGACY / f"{name}.json")
    assert to_data(doc) == raw(name)


def test_unknown_spec_kind_names_the_legacy_kinds() -> None:
    data = raw("gemma-3-1b")
    data["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]["kind"] = "RSWASpec"
    with pytest.raises(KVPlanError) as info:
        parse_legacy(data)
    assert info.value.code is Code.UNKNOWN_SPEC_KIND
    assert "TQFullAttentionSpec" in str(info.value) and "0.24" in str(info.value)


def test_unknown_field_and_wrong_types_are_schema_errors(tmp_path: Path) -> None:
    data = raw("gemma-3-1b")
    data["kv_cache_config"]["kv_cache_tensors"][0]["layers"] = []
    with pytest.raises(KVPlanError) as info:
        parse_legacy(data)
    assert info.value.code is Code.SCHEMA
    data = raw("gemma-3-1b")
    data["binding"] = {"strategy": "elastic"}
    with pytest.raises(KVPlanError) as info:
        parse_legacy(data)
    assert info.value.code is Code.SCHEMA
    with pytest.raises(KVPlanError) as info:
        parse_legacy([1, 2])
    assert info.value.code is Code.SCHEMA


class _Quant(IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1


@dataclasses.dataclass(frozen=True)
class FullAttentionSpec:  # a stand-in with 0.24's field names
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    kv_quant_mode: _Quant = _Quant.NONE
    page_size_padded: int | None = None
    indexes_kv_by_block_stride: bool = False
    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    non_causal: bool = False


def test_capture_encodes_specs_field_for_field() -> None:
    from kvplan.integrations.vllm.convert.legacy import encode_spec

    spec = FullAttentionSpec(16, 8, 128, torch.float8_e4m3fn, _Quant.FP8_PER_TENSOR)
    data = encode_spec(spec)
    assert data["kind"] == "FullAttentionSpec" and data["dtype"] == "float8_e4m3fn"
    assert data["kv_quant_mode"] == "FP8_PER_TENSOR"
    assert page(json.loads(json.dumps(data))) == 16 * 8 * 256


def test_capture_module_imports_neither_vllm_nor_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import kvplan.integrations.vllm.convert.legacy as m\n"
        "assert callable(m.capture_legacy) and callable(m.capture_runner)\n"
        "bad = [n for n in ('torch', 'vllm') if n in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
