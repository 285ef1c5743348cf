"""``capture``/``to_vllm`` are lossless for every spec class of the installed vLLM."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import pytest

from kvplan.integrations.vllm import capture, to_vllm
from kvplan.integrations.vllm.convert._capture import spec_classes, worker_form
from kvplan.schemas.errors import KVPlanError
from kvplan.schemas.specs import SPEC_KINDS


def _specs() -> dict[str, Any]:
    """One instance of every spec class, with the awkward values set (real vLLM classes)."""
    import torch
    from vllm.v1 import kv_cache_interface as kv
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

    attn = {"block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype": torch.bfloat16}
    return {
        "FullAttentionSpec": kv.FullAttentionSpec(
            **attn, block_stride_alignment=MultipleOf(64), sliding_window=128
        ),
        "AttentionSpec": kv.AttentionSpec(**attn, tokens_per_state=Fraction(1, 4)),
        "SlidingWindowSpec": kv.SlidingWindowSpec(**attn, sliding_window=512),
        "ChunkedLocalAttentionSpec": kv.ChunkedLocalAttentionSpec(
            **attn, attention_chunk_size=8192
        ),
        "MLAAttentionSpec": kv.MLAAttentionSpec(
            block_size=64,
            num_kv_heads=1,
            head_size=576,
            dtype=torch.uint8,
            cache_dtype_str="fp8_ds_mla",
            state_content_bytes=656,
            alignment=576,
            kv_quant_mode=kv.KVQuantMode.FP8_PER_TENSOR,
            cache_role=kv.SparseCacheRole.INDEXER,
        ),
        "HiddenStateCacheSpec": kv.HiddenStateCacheSpec(
            block_size=16, num_kv_heads=1, head_size=128, dtype=torch.float16
        ),
        "RSWASpec": kv.RSWASpec(**attn, rswa_window=64),
        "CircularBufferSpec": kv.CircularBufferSpec(**attn),
        "SlidingWindowMLASpec": kv.SlidingWindowMLASpec(
            block_size=64, num_kv_heads=1, head_size=512, dtype=torch.bfloat16, sliding_window=128
        ),
        "EncoderOnlyAttentionSpec": kv.EncoderOnlyAttentionSpec(**attn),
        "CrossAttentionSpec": kv.CrossAttentionSpec(**attn),
        "SinkFullAttentionSpec": kv.SinkFullAttentionSpec(**attn, sink_len=4),
        "MambaSpec": kv.MambaSpec(
            block_size=272,
            shapes=((3, 128), (8, 64, 16)),
            dtypes=(torch.bfloat16, torch.float32),
            page_size_padded=139264,
            mamba_type=MambaAttentionBackendEnum.MAMBA2,
            num_heads=1,
        ),
        "HiSparseHotSpec": kv.HiSparseHotSpec(block_size=1, page_size=4096, blocks_per_request=8),
        "HiSparseResidentSpec": kv.HiSparseResidentSpec(block_size=64, page_size=8192),
    }


def _config(spec: Any, layers: list[str]) -> Any:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

    return KVCacheConfig(
        num_blocks=8,
        kv_cache_tensors=[
            KVCacheTensor(size=1 << 20, layers=layers, layer_stride=1 << 16, block_stride=1 << 12)
        ],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=list(layers), kv_cache_spec=spec)],
        kv_cache_layout="LBNHC",
        hash_block_size=16,
    )


def test_every_installed_spec_class_is_known_to_the_schema() -> None:
    assert set(spec_classes()) <= set(SPEC_KINDS)


def test_the_sample_covers_every_vllm_spec_class() -> None:
    from vllm.v1 import kv_cache_interface as kv

    own = {n for n, c in spec_classes().items() if c.__module__ == kv.__name__}
    assert own - {"UniformTypeKVCacheSpecs"} <= set(_specs())


def test_each_spec_class_round_trips() -> None:
    for kind, spec in _specs().items():
        config = _config(spec, ["a", "b"])
        document = capture(config, shared_kv_cache_layers={})
        assert document.kv_cache_config.kv_cache_groups[0].kv_cache_spec.kind == kind
        back = to_vllm(document)
        assert back == config, kind
        for field in dataclasses.fields(spec):
            assert type(getattr(back.kv_cache_groups[0].kv_cache_spec, field.name)) is type(
                getattr(spec, field.name)
            ), (kind, field.name)


def test_uniform_type_specs_round_trip_with_nested_specs() -> None:
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    inner = _specs()["SlidingWindowSpec"]
    spec = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": inner, "b": inner})
    config = _config(spec, ["a", "b"])
    document = capture(config, shared_kv_cache_layers={"c": "a"})
    assert to_vllm(document) == config
    runner = to_vllm(document, with_sharers=True)
    assert runner.kv_cache_groups[0].layer_names == ["a", "b", "c"]
    assert capture(runner, shared_kv_cache_layers={"c": "a"}) == document.model_copy(
        update={"metadata": {"captured_from": "runner"}}
    )


def test_spec_families_are_vllms_get_kv_cache_spec_kind() -> None:
    # every class, and UniformTypeKVCacheSpecs of one kind and of mixed kinds (vLLM 0.33:
    # full attention when every inner class groups with FullAttentionSpec, else unknown)
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs, get_kv_cache_spec_kind

    from kvplan.schemas.specs import base_kind

    specs = _specs()
    mixes = [("FullAttentionSpec", "RSWASpec"), ("SinkFullAttentionSpec", "FullAttentionSpec")]
    mixes += [("FullAttentionSpec", "SlidingWindowSpec"), ("SlidingWindowSpec",) * 2]
    cases = list(specs.values()) + [
        UniformTypeKVCacheSpecs(
            block_size=16, kv_cache_specs={"a": specs[first], "b": specs[second]}
        )
        for first, second in mixes
    ]
    for spec in cases:
        document = capture(_config(spec, ["a", "b"]), shared_kv_cache_layers={})
        ours = base_kind(document.kv_cache_config.kv_cache_groups[0].kv_cache_spec)
        assert ours.value == get_kv_cache_spec_kind(spec).value, type(spec).__name__


def test_runner_form_is_detected_and_sharers_removed() -> None:
    config = _config(_specs()["FullAttentionSpec"], ["a", "b"])
    config.kv_cache_groups[0].layer_names.append("c")
    worker, appended = worker_form(config, {"c": "b"})
    assert appended and worker.kv_cache_groups[0].layer_names == ["a", "b"]
    assert config.kv_cache_groups[0].layer_names == ["a", "b", "c"]  # input untouched


def test_layout_argument_fills_or_must_agree() -> None:
    from vllm.v1.kv_cache_layout import KVCacheLayout

    config = _config(_specs()["FullAttentionSpec"], ["a"])
    assert capture(config, shared_kv_cache_layers={}, layout=KVCacheLayout.LBNHC).layout
    with pytest.raises(KVPlanError):
        capture(config, shared_kv_cache_layers={}, layout="BLHNC")
    config.kv_cache_layout = None
    document = capture(config, shared_kv_cache_layers={}, layout="NHD")
    assert document.layout is not None and document.layout.name == "LBNHC"


def test_sharer_owning_a_tensor_is_rejected() -> None:
    config = _config(_specs()["FullAttentionSpec"], ["a", "b"])
    with pytest.raises(KVPlanError):
        capture(config, shared_kv_cache_layers={"b": "a"})


def test_vllm_version_is_recorded() -> None:
    import vllm

    document = capture(_config(_specs()["FullAttentionSpec"], ["a"]), shared_kv_cache_layers={})
    assert document.vllm_version == vllm.__version__


def test_capture_is_the_function_after_every_submodule_loaded() -> None:
    """No public submodule is named like a public function: loading them all (as vLLM's
    plugin loader does) leaves ``capture`` and ``to_vllm`` the functions."""
    import importlib
    import pkgutil

    import kvplan.integrations.vllm as package

    importlib.import_module("kvplan.integrations.vllm.convert._capture")
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        if not info.name.endswith("._rank"):  # a script entry point
            importlib.import_module(info.name)
    public_modules = {
        info.name
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    }
    assert public_modules.isdisjoint(package.__all__), public_modules & set(package.__all__)
    from kvplan.integrations.vllm import capture as again
    from kvplan.integrations.vllm import to_vllm as back

    assert callable(again) and again.__name__ == "capture"
    assert callable(back) and back.__name__ == "to_vllm"
    document = again(_config(_specs()["FullAttentionSpec"], ["a"]), shared_kv_cache_layers={})
    assert back(document).num_blocks == 8


def test_release_fields_are_neither_read_nor_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    """On 0.32, whose specs lack ``is_draft`` (and MLA's ``topk_buffer_width``), a document
    rebuilds without them; one that sets them cannot be rebuilt there."""
    import vllm

    from kvplan.schemas.errors import Code

    config = _config(_specs()["SlidingWindowSpec"], ["a", "b"])
    mla = _config(_specs()["MLAAttentionSpec"], ["m"])
    monkeypatch.setattr(vllm, "__version__", "0.32.0")
    document = capture(config, shared_kv_cache_layers={})
    assert document.vllm_version == "0.32.0"
    assert to_vllm(document) == config
    assert to_vllm(capture(mla, shared_kv_cache_layers={})) == mla
    spec = document.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    draft = document.model_copy(
        update={
            "kv_cache_config": document.kv_cache_config.model_copy(
                update={
                    "kv_cache_groups": [
                        document.kv_cache_config.kv_cache_groups[0].model_copy(
                            update={"kv_cache_spec": spec.model_copy(update={"is_draft": True})}
                        )
                    ]
                }
            )
        }
    )
    with pytest.raises(KVPlanError) as info:
        to_vllm(draft)
    assert info.value.code is Code.FIELD_NOT_IN_RELEASE and "is_draft" in str(info.value)
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    assert to_vllm(draft).kv_cache_groups[0].kv_cache_spec.is_draft is True


def test_unsupported_release_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    from kvplan.schemas.errors import Code

    monkeypatch.setattr(vllm, "__version__", "0.28.0")
    with pytest.raises(KVPlanError) as info:
        capture(_config(_specs()["FullAttentionSpec"], ["a"]), shared_kv_cache_layers={})
    assert info.value.code is Code.INTEGRATION and "0.29–0.34" in str(info.value)
