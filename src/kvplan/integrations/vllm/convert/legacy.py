"""Capture vLLM 0.22–0.24 KV-cache binding facts as a ``kvplan.input-legacy/1`` document.

Works when vLLM ≤ 0.24 is the installed version (it imports vLLM lazily). Specs are written
field for field (class name as ``kind``, dtypes and enums by name); each attention group's
backend is asked for the shape, stride order and block dim it gives the runner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvplan.schemas.legacy import BindingOptions, LegacyInputDocument, parse_legacy

__all__ = ["backend_facts", "capture_legacy", "capture_runner", "encode_spec"]


def encode_spec(spec: Any) -> dict[str, Any]:
    """A 0.24 ``KVCacheSpec`` as ``{kind: <class name>, <field>: <value>, ...}``."""
    from kvplan.integrations.vllm.convert._capture import encode_fields

    return {"kind": type(spec).__name__, **encode_fields(spec)}


def _num_blocks_of(layer: str, cfg: Any, page: int) -> int:
    """The runner's ``raw.numel() // page`` (``// block_stride`` when packed)."""
    for tensor in cfg.kv_cache_tensors:
        if layer in tensor.shared_by:
            stride = tensor.block_stride or page
            return int(tensor.size // stride)
    return int(cfg.num_blocks)


def backend_facts(
    backend: Any, spec: Any, num_blocks: int, kernel_block_size: int, cache_dtype: str
) -> dict[str, Any]:
    """What ``backend`` reports for one attention group, as the 0.24 runner asks it."""
    from vllm.v1.kv_cache_interface import AttentionSpec

    if not isinstance(spec, AttentionSpec):
        return {"kv_cache_shape": None, "stride_order": None, "block_dim": None}
    storage = getattr(spec, "storage_block_size", spec.block_size)
    shape_block = storage if storage != spec.block_size else kernel_block_size
    ratio = spec.block_size // kernel_block_size
    shape = backend.get_kv_cache_shape(
        num_blocks * ratio,
        shape_block,
        spec.num_kv_heads,
        spec.head_size,
        cache_dtype_str=cache_dtype,
    )
    try:
        order = tuple(backend.get_kv_cache_stride_order())
        assert len(order) == len(shape)
    except (AttributeError, NotImplementedError):
        order = tuple(range(len(shape)))
    block_dim = backend.get_kv_cache_block_dim(
        kernel_block_size, spec.num_kv_heads, spec.head_size, cache_dtype_str=cache_dtype
    )
    return {
        "kv_cache_shape": [int(s) for s in shape],
        "stride_order": [int(i) for i in order],
        "block_dim": int(block_dim),
    }


def capture_legacy(
    kv_cache_config: Any,
    attn_groups: Iterable[Any],
    *,
    kernel_block_sizes: Sequence[int] | None,
    runner_only_attn_layers: Iterable[str] = (),
    shared_kv_cache_layers: Mapping[str, str] | None = None,
    cache_dtype: str = "auto",
    vllm_version: str | None = None,
    scheduler_kv_cache_config: Any = None,
    binding: BindingOptions | None = None,
    vllm_config: Any = None,
    metadata: Mapping[str, Any] | None = None,
) -> LegacyInputDocument:
    """A legacy input document from vLLM 0.24 objects.

    ``kv_cache_config``: the runner's (or the worker's) ``KVCacheConfig``; ``attn_groups``:
    the runner's ``AttentionGroup``s (flat or per KV-cache group); ``vllm_config``: entered
    with ``set_current_vllm_config`` while backends are asked (their stride order reads the
    KV-cache layout from it). ``scheduler_kv_cache_config`` gives ``scheduler_num_layers``.
    """
    import importlib

    import vllm

    # a vLLM 0.24 name (0.33 has no get_kv_cache_layout): looked up dynamically
    attn_utils = importlib.import_module("vllm.v1.attention.backends.utils")

    flat = [g for item in attn_groups for g in (item if isinstance(item, list) else [item])]
    kbs = list(kernel_block_sizes) if kernel_block_sizes is not None else None
    ctx: Any = contextlib.nullcontext()
    if vllm_config is not None:
        from vllm.config import set_current_vllm_config

        ctx = set_current_vllm_config(vllm_config)
    groups_out = []
    with ctx:
        layout = attn_utils.get_kv_cache_layout()
        for group in flat:
            gid = int(group.kv_cache_group_id)
            spec = group.kv_cache_spec
            kernel = kbs[gid] if kbs is not None and gid < len(kbs) else spec.block_size
            backed = [n for n in group.layer_names if n not in set(runner_only_attn_layers)]
            blocks = (
                _num_blocks_of(backed[0], kv_cache_config, spec.page_size_bytes)
                if backed
                else int(kv_cache_config.num_blocks)
            )
            facts = backend_facts(group.backend, spec, blocks, kernel, cache_dtype)
            groups_out.append(
                {
                    "kv_cache_group_id": gid,
                    "backend": group.backend.__name__,
                    "layer_names": list(group.layer_names),
                    **facts,
                }
            )
    data: dict[str, Any] = {
        "format": "kvplan.input-legacy/1",
        "vllm_version": vllm_version or vllm.__version__,
        "kv_cache_config": {
            "num_blocks": int(kv_cache_config.num_blocks),
            "kv_cache_tensors": [
                {
                    "size": int(t.size),
                    "shared_by": list(t.shared_by),
                    "offset": int(getattr(t, "offset", 0)),
                    "block_stride": int(getattr(t, "block_stride", 0)),
                }
                for t in kv_cache_config.kv_cache_tensors
            ],
            "kv_cache_groups": [
                {
                    "layer_names": list(g.layer_names),
                    "kv_cache_spec": encode_spec(g.kv_cache_spec),
                    "is_eagle_group": bool(getattr(g, "is_eagle_group", False)),
                }
                for g in kv_cache_config.kv_cache_groups
            ],
        },
        "attn_groups": groups_out,
        "kernel_block_sizes": kbs,
        "runner_only_attn_layers": sorted(runner_only_attn_layers),
        "shared_kv_cache_layers": dict(shared_kv_cache_layers or {}),
        "cache_dtype": cache_dtype,
        "kv_cache_layout": layout,
        "metadata": dict(metadata or {}),
    }
    if scheduler_kv_cache_config is not None:
        data["scheduler_num_layers"] = max(
            (len(g.layer_names) for g in scheduler_kv_cache_config.kv_cache_groups), default=1
        )
    if binding is not None:
        data["binding"] = binding.model_dump()
    return parse_legacy(data, "<captured>")


def capture_runner(runner: Any, **kwargs: Any) -> LegacyInputDocument:
    """Capture from a vLLM 0.24 V1 ``GPUModelRunner`` after ``initialize_kv_cache``."""
    return capture_legacy(
        runner.kv_cache_config,
        runner.attn_groups,
        kernel_block_sizes=getattr(runner, "_kernel_block_sizes", None),
        runner_only_attn_layers=runner.runner_only_attn_layers,
        shared_kv_cache_layers=runner.shared_kv_cache_layers,
        cache_dtype=runner.cache_config.cache_dtype,
        vllm_config=runner.vllm_config,
        **kwargs,
    )
