"""Strategy ``vanilla``: what vLLM 0.24's runner binds.

``_allocate_kv_cache_tensors`` makes one int8 allocation per ``KVCacheTensor`` (packed
tensors share one); ``_reshape_kv_cache_tensors`` views each tensor-backed layer by its
backend's ``get_kv_cache_shape`` and ``get_kv_cache_stride_order`` (strided over padded pages,
or over the packed block), Mamba layers as one ``as_strided`` tensor per state;
``_update_hybrid_attention_mamba_layout`` restrides ``(2, num_blocks, ...)`` attention caches
of hybrid models; runner-only layers get nothing; sharers alias their target.
"""

from __future__ import annotations

import math

from kvplan.planner.legacy._binding import (
    LegacyBinding,
    aliases_of,
    dense_strides,
    inverse,
    mamba_state_views,
    permute,
)
from kvplan.planner.legacy._resolve import ResolvedDocument
from kvplan.schemas.dtypes import itemsize
from kvplan.schemas.legacy import LegacyAttentionSpec, LegacyMambaSpec
from kvplan.schemas.plan import Pool, View
from kvplan.units import POOL_ALIGNMENT

PACKED_POOL = "packed"


def pool_name(r: ResolvedDocument, tensor: int) -> str:
    """``tensor_<i>``, or ``packed`` for every packed tensor (they share one allocation)."""
    if r.doc.kv_cache_config.kv_cache_tensors[tensor].block_stride:
        return PACKED_POOL
    return f"tensor_{tensor}"


def bind_vanilla(r: ResolvedDocument) -> LegacyBinding:
    cfg = r.doc.kv_cache_config
    out = LegacyBinding(layout=f"vanilla/{r.doc.kv_cache_layout or 'NHD'}")
    for t, tensor in enumerate(cfg.kv_cache_tensors):
        name = pool_name(r, t)
        if name == PACKED_POOL and any(p.name == PACKED_POOL for p in out.pools):
            continue
        out.pools.append(
            Pool(
                name=name,
                size_bytes=tensor.size,
                alignment_bytes=POOL_ALIGNMENT,
                num_blocks=cfg.num_blocks,
            )
        )
    hybrid = r.has_mamba and any(
        isinstance(r.spec_of(n), LegacyAttentionSpec) for n in r.backed_layers
    )
    for layers in r.backed:
        for layer in layers:
            spec = r.spec_of(layer)
            if isinstance(spec, LegacyMambaSpec):
                out.views.extend(_mamba_views(r, layer, spec))
            elif isinstance(spec, LegacyAttentionSpec):
                out.views.append(_attention_view(r, layer, spec, hybrid))
    out.aliases = aliases_of(r.sharers)
    out.bytes_per_block = sum(p.size_bytes for p in out.pools) // cfg.num_blocks
    return out


def _attention_view(
    r: ResolvedDocument, layer: str, spec: LegacyAttentionSpec, hybrid: bool
) -> View:
    info = r.attn_of[layer]
    assert info.kv_cache_shape is not None and info.stride_order is not None  # checked
    shape, order = list(info.kv_cache_shape), list(info.stride_order)
    inv = inverse(order)
    isz = itemsize(spec.dtype)
    t = r.tensor_of[layer]
    tensor = r.doc.kv_cache_config.kv_cache_tensors[t]
    offset = 0
    if tensor.block_stride:
        # raw.view(-1, block_stride)[:, offset:offset + page].view(dtype).view(shape)
        base = dense_strides(shape)
        base[0] = tensor.block_stride // isz
        view_shape, view_stride = permute(shape, base, inv)
        offset = tensor.offset
    else:
        physical = [shape[i] for i in order]
        strides = dense_strides(physical)
        if spec.page_size_padded is not None:
            strides[inv[0]] = spec.page_size_bytes // isz
        view_shape, view_stride = permute(physical, strides, inv)
    if hybrid and info.block_dim == 1:
        hidden = math.prod(view_shape[2:])
        view_stride = [hidden, 2 * hidden, *view_stride[2:]]
    return View(
        layer=layer,
        group=r.group_of[layer],
        pool=pool_name(r, t),
        kind=spec.kind,
        dtype=spec.dtype,
        shape=view_shape,
        stride=view_stride,
        offset_bytes=offset,
    )


def _mamba_views(r: ResolvedDocument, layer: str, spec: LegacyMambaSpec) -> list[View]:
    t = r.tensor_of[layer]
    tensor = r.doc.kv_cache_config.kv_cache_tensors[t]
    blocks = tensor.size // (tensor.block_stride or spec.page_size_bytes)
    return mamba_state_views(
        layer, r.group_of[layer], pool_name(r, t), spec, blocks, spec.page_size_bytes, 0
    )
