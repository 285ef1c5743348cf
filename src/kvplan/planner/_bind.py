"""Build pools, views and aliases from a checked input document (vLLM 0.33 semantics).

Mirrors ``allocate_kv_cache`` + ``create_kv_cache_views`` + the runners' KV-sharing loop:
one int8 pool of ``KVCacheTensor.size`` bytes; per tensor the spec of the first group that
lists ``layers[0]``; per layer an ``as_strided`` view then ``.view(spec.dtype)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvplan.planner._geometry import tensor_geometry
from kvplan.planner._text import num, nums
from kvplan.schemas.dtypes import itemsize
from kvplan.schemas.errors import Code, Diagnostic, error
from kvplan.schemas.input import InputDocument
from kvplan.schemas.layout import KVCacheLayout
from kvplan.schemas.legacy import LegacySpec
from kvplan.schemas.plan import Alias, Pool, View
from kvplan.schemas.specs import KVCacheSpec, MLAAttentionSpec, layer_spec
from kvplan.units import POOL_ALIGNMENT

POOL_NAME = "kv_cache"


@dataclass
class Binding:
    pools: list[Pool] = field(default_factory=list)
    views: list[View] = field(default_factory=list)
    aliases: list[Alias] = field(default_factory=list)
    page_bytes: dict[str, int] = field(default_factory=dict)
    problems: list[Diagnostic] = field(default_factory=list)


def bind(doc: InputDocument) -> Binding:
    cfg = doc.kv_cache_config
    out = Binding()
    if not cfg.kv_cache_tensors:
        out.aliases = _aliases(doc)
        return out
    size = cfg.kv_cache_tensors[0].size
    out.pools.append(
        Pool(
            name=POOL_NAME,
            size_bytes=size,
            alignment_bytes=POOL_ALIGNMENT,
            num_blocks=cfg.num_blocks,
        )
    )
    group_index: dict[str, int] = {}
    for g, group in enumerate(cfg.kv_cache_groups):
        for layer in group.layer_names:
            group_index.setdefault(layer, g)
    layout = cfg.kv_cache_layout
    kbs = doc.kernel_block_sizes
    for t_index, tensor in enumerate(cfg.kv_cache_tensors):
        g = group_index[tensor.layers[0]]
        group_spec = cfg.kv_cache_groups[g].kv_cache_spec
        spec = layer_spec(group_spec, tensor.layers[0])
        if spec is None:  # reported by check_input
            continue
        for layer in tensor.layers:
            out.page_bytes[layer] = spec.page_size_bytes
        if not spec.has_layer_views:  # the raw pool, as int8 bytes
            out.views.extend(
                layer_view(name, g, POOL_NAME, spec, "int8", [size], [1], 0)
                for name in tensor.layers
            )
            continue
        assert layout is not None  # reported by check_input
        kernel = kbs[g] if kbs is not None and g < len(kbs) else None
        if isinstance(spec, MLAAttentionSpec) and spec.storage_block_size is not None:
            # vLLM 0.30-0.31 view an MLA spec's storage in storage_block_size-token blocks,
            # whatever the group's kernel block size (the field exists only there).
            kernel = spec.storage_block_size
        views = _tensor_views(
            t_index,
            tensor.layers,
            g,
            spec,
            cfg.num_blocks_of(tensor),
            layout,
            tensor.layer_stride,
            tensor.block_stride,
            tensor.offset,
            kernel,
        )
        if isinstance(views, Diagnostic):
            out.problems.append(views)
        else:
            out.views.extend(views)
    out.aliases = _aliases(doc)
    return out


def _tensor_views(
    t_index: int,
    layers: list[str],
    group: int,
    spec: KVCacheSpec,
    num_blocks: int,
    layout: KVCacheLayout,
    layer_stride: int,
    block_stride: int,
    offset: int,
    kernel: int | None,
) -> list[View] | Diagnostic:
    loc = f"kv_cache_config.kv_cache_tensors[{t_index}]"
    geo = tensor_geometry(
        spec, num_blocks, len(layers), layout, layer_stride, block_stride, kernel, loc
    )
    if isinstance(geo, Diagnostic):
        return geo
    dtype = spec.view_dtype
    isz = itemsize(dtype)
    _, b, h, n, c_bytes = geo.shape
    s_l, s_b, s_h, s_n, s_c = geo.strides
    if c_bytes % isz or any(s % isz for s in (s_b, s_h, s_n)) or offset % isz or s_l % isz:
        return error(
            Code.MISALIGNED,
            loc,
            f"content {num(c_bytes)} B, strides {nums(geo.strides)} B or offset {num(offset)} B "
            f"are not multiples of {dtype}'s {isz}-byte element",
            "align sizes, strides and offsets to the dtype",
        )
    shape = [b, h, n, c_bytes // isz]
    stride = [s_b // isz, s_h // isz, s_n // isz, s_c]
    return [
        layer_view(name, group, POOL_NAME, spec, dtype, shape, stride, offset + i * s_l)
        for i, name in enumerate(layers)
    ]


def layer_view(
    layer: str,
    group: int,
    pool: str,
    spec: KVCacheSpec | LegacySpec,
    dtype: str,
    shape: list[int],
    stride: list[int],
    offset_bytes: int,
) -> View:
    """The view of one layer (or one state of a layer) of ``spec`` in ``pool``: every planner
    builds its views here, fields in the plan's order."""
    return View(
        layer=layer,
        group=group,
        pool=pool,
        kind=spec.kind,
        dtype=dtype,
        shape=shape,
        stride=stride,
        offset_bytes=offset_bytes,
    )


def _aliases(doc: InputDocument) -> list[Alias]:
    return [Alias(layer=s, target=t) for s, t in doc.shared_kv_cache_layers.items()]
