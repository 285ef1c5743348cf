"""kvplan's spec models cover every KVCacheSpec subclass of the installed vLLM, field for field."""

from __future__ import annotations

import dataclasses

import pytest

import kvplan.schemas.specs as specs

pytestmark = pytest.mark.vllm


def _subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


def test_every_vllm_spec_class_has_a_kvplan_model_with_the_same_fields() -> None:
    """kvplan's models hold the union of the supported releases' fields; the installed release
    has exactly those its version adapter does not list as absent."""
    import vllm
    from vllm.v1 import kv_cache_interface

    from kvplan.integrations.vllm.versions import adapter_for

    adapter = adapter_for(vllm.__version__)
    assert adapter is not None, vllm.__version__
    absent = adapter.fields_absent_in(vllm.__version__)

    vllm_specs = {
        c
        for c in _subclasses(kv_cache_interface.KVCacheSpec)
        if c.__module__ == kv_cache_interface.__name__
    }
    assert {c.__name__ for c in vllm_specs} <= set(specs.SPEC_KINDS)
    for cls in vllm_specs:
        model = getattr(specs, cls.__name__)
        vllm_fields = {f.name for f in dataclasses.fields(cls)}
        kvplan_fields = {f.alias or name for name, f in model.model_fields.items()} - {"kind"}
        lacking = {name for k in cls.__mro__ for name in absent.get(k.__name__, {})}
        assert not lacking & vllm_fields, (cls.__name__, lacking & vllm_fields)
        assert vllm_fields == kvplan_fields - lacking, cls.__name__


def test_kv_quant_modes_match_vllm() -> None:
    from vllm.v1.kv_cache_interface import KVQuantMode

    assert {m.name: m.value for m in KVQuantMode} == {m.name: m.value for m in specs.KVQuantMode}
