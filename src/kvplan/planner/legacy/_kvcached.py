"""Strategy ``kvcached``: kvcached's elastic pools and view math over a vLLM 0.24 config.

Pools: the scheduler-side group size ``L`` (runner-only layers excluded); layer ``i`` of every
group binds pool ``i``. Non-contiguous: one reservation per pool, K half then V half (MLA: one
buffer; attention+Mamba: one unified buffer, K and V interleaved per kernel block).
Contiguous: one reservation, block ``b`` of pool ``i`` at ``(b*L + i) * nkv * bm`` bytes.
Per-layer (kvcached's v0.8 ``patch_initialize_kv_cache``): one non-contiguous pool per
tensor-backed layer, bound in group then ``layer_names`` order; no Mamba.
The formulas are in ``docs/layouts.md``; they follow kvcached's ``alloc_kv_cache`` /
``build_kv_views`` / ``_reshape_mamba_*`` (snapshot e8e6406, with #472's sharing fix).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvplan.planner._text import nums
from kvplan.planner.legacy._binding import (
    LegacyBinding,
    aliases_of,
    dense_strides,
    mamba_state_views,
)
from kvplan.planner.legacy._resolve import ResolvedDocument
from kvplan.schemas.dtypes import itemsize
from kvplan.schemas.errors import Code, KVPlanError, error
from kvplan.schemas.legacy import (
    LegacyAttentionSpec,
    LegacyFullAttentionSpec,
    LegacyMambaSpec,
    LegacyMLAAttentionSpec,
    LegacySlidingWindowSpec,
    LegacySpec,
    PoolLayout,
)
from kvplan.schemas.plan import Pool, View


class AttentionType(StrEnum):
    """kvcached's ``attention_type`` of a model, and the buffer counts that follow from it."""

    MHA = "MHA"
    MLA = "MLA"
    HYBRID = "HYBRID_LINEAR"
    """Full attention and Mamba layers in one unified pool."""

    @property
    def kv_buffers(self) -> int:
        """Worker buffers per pool: 1 for MLA (one latent buffer), else 2 (a K and a V half)."""
        return 1 if self is AttentionType.MLA else 2

    @property
    def scheduler_kv_buffers(self) -> int:
        """The scheduler's ``num_kv_buffers``: 1 for MLA and attention+Mamba, else 2."""
        return 1 if self in (AttentionType.MLA, AttentionType.HYBRID) else 2


MHA, MLA, HYBRID = AttentionType.MHA, AttentionType.MLA, AttentionType.HYBRID


@dataclass(frozen=True)
class KvcachedGeometry:
    """The numbers the engine core and every worker must agree on (kvcached #472)."""

    attention_type: AttentionType
    contiguous: bool
    per_layer: bool
    """One pool per tensor-backed layer (kvcached's v0.8 binding) instead of per group index."""
    num_pools: int
    cell_size: int
    block_mem_bytes: int
    """Scheduler bytes per block and pool: ``block_size * cell_size``."""
    kv_bytes: int
    """Per pool, bytes of the K half (= of the V half; MLA: of the buffer)."""
    num_blocks: int
    """Virtual blocks per pool: ``kv_bytes // bm`` (``bm`` = one K-or-V block)."""
    page_size_bytes: int

    @property
    def num_kv_buffers(self) -> int:
        """The scheduler's ``num_kv_buffers``: 1 for MLA and attention+Mamba, else 2."""
        return self.attention_type.scheduler_kv_buffers

    @property
    def ftensor_bytes(self) -> int:
        """Per pool reservation: ``kv_bytes`` times the worker's K/V buffers."""
        return self.kv_bytes * self.attention_type.kv_buffers

    @property
    def compound_page_bytes(self) -> int:
        """Physical bytes one page id maps: ``P*L*nkvb`` contiguous, ``P`` per pool otherwise."""
        if not self.contiguous:
            return self.page_size_bytes
        return self.page_size_bytes * self.num_pools * self.num_kv_buffers


@dataclass(frozen=True)
class _Group:
    gid: int
    spec: LegacyAttentionSpec
    block_size: int
    kernel: int
    heads: int
    head: int
    blocks_first: bool
    """kvcached's ``blocks_dim_idx == 0`` (FlashInfer/Triton ``(N, 2, ...)``; MLA)."""

    @property
    def ratio(self) -> int:
        return self.block_size // self.kernel

    @property
    def geom(self) -> tuple[int, int, int]:
        return (self.block_size, self.heads, self.head)


def _refuse(
    where: str, message: str, hint: str = "", code: Code = Code.KVCACHED_UNSUPPORTED
) -> KVPlanError:
    return KVPlanError(error(code, where, f"kvcached: {message}", hint))


def _is_attention(spec: LegacySpec) -> bool:
    return isinstance(spec, LegacyFullAttentionSpec | LegacySlidingWindowSpec)


def _attention_type(r: ResolvedDocument) -> AttentionType:
    specs = [r.group_spec(g) for g, layers in enumerate(r.backed) if layers]
    if any(isinstance(s, LegacyMLAAttentionSpec) for s in specs):
        return MLA
    full = any(isinstance(s, LegacyFullAttentionSpec) for s in specs)
    if full and any(isinstance(s, LegacyMambaSpec) for s in specs):
        return HYBRID
    return MHA


def _groups(r: ResolvedDocument, attention_type: AttentionType) -> list[_Group]:
    """Attention groups with kvcached's reading of their backend shape (validated)."""
    out = []
    for gid, group in enumerate(r.doc.kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        where = f"kv_cache_config.kv_cache_groups[{gid}]"
        if isinstance(spec, LegacyMambaSpec):
            if attention_type != HYBRID:
                raise _refuse(
                    where, f"Mamba layers need a full-attention group ({attention_type} model)"
                )
            continue
        if not _is_attention(spec):
            raise _refuse(
                where,
                f"only FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec and MambaSpec groups "
                f"are supported, got {spec.kind}",
                "disable kvcached for this model, or plan it with strategy vanilla",
            )
        assert isinstance(spec, LegacyAttentionSpec)
        layers = r.backed[gid]
        if not layers:
            continue
        info = r.attn_of[layers[0]]
        assert info.kv_cache_shape is not None and info.stride_order is not None  # checked
        if info.stride_order != list(range(len(info.kv_cache_shape))):
            raise _refuse(
                where,
                f"binds the NHD layout only; {info.backend} reports stride order "
                f"{info.stride_order}",
                "run with VLLM_KV_CACHE_LAYOUT=NHD",
            )
        kernel = r.kernel_block_size(gid)
        shape = list(info.kv_cache_shape)
        if attention_type == MLA:
            if len(shape) != 3 or info.block_dim != 0 or shape[1] != kernel:
                raise _refuse(where, f"unsupported MLA kv cache shape {nums(shape)}")
            out.append(_Group(gid, spec, spec.block_size, kernel, 1, shape[2], True))
            continue
        if len(shape) != 5 or shape[2] != kernel or 2 not in shape[:2]:
            raise _refuse(where, f"unsupported kv cache shape {nums(shape)}")
        # kvcached reads (2, N, ...) as K/V-first whenever dim 0 is 2, with N = num_blocks
        bs_shape = list(shape)
        bs_shape[info.block_dim or 0] = r.num_blocks
        blocks_first = bs_shape[0] != 2
        if blocks_first != (info.block_dim == 0):
            raise _refuse(where, f"would misread which dim of {nums(shape)} is num_blocks")
        out.append(_Group(gid, spec, spec.block_size, kernel, shape[3], shape[4], blocks_first))
    if not out:
        raise _refuse("kv_cache_config.kv_cache_groups", "the config has no attention group")
    return out


def _block_mem(group: _Group, attention_type: AttentionType) -> int:
    """Worker ``block_mem_bytes``: one K-or-V block (MHA, hybrid) or one block (MLA)."""
    heads = 1 if attention_type == MLA else group.heads
    return group.block_size * heads * group.head * itemsize(group.spec.dtype)


def _check_groups(groups: list[_Group], attention_type: AttentionType, page: int) -> None:
    first = groups[0]
    sched = first.spec.page_size_bytes // attention_type.scheduler_kv_buffers
    nkv = attention_type.kv_buffers
    for g in groups:
        where = f"kv_cache_config.kv_cache_groups[{g.gid}]"
        # _validate_kv_cache_groups: one block_mem_size and num_kv_buffers for all groups
        if g.spec.page_size_bytes // nkv != first.spec.page_size_bytes // nkv:
            raise _refuse(
                where,
                f"attention groups must share bytes per block; group {first.gid} has "
                f"{first.spec.page_size_bytes} B pages, group {g.gid} {g.spec.page_size_bytes} B",
            )
        geometric = _block_mem(g, attention_type) * nkv
        if g.spec.page_size_bytes != geometric:
            raise _refuse(
                where,
                f"the spec's page ({g.spec.page_size_bytes} B) is not the geometric block "
                f"({geometric} B): inline quantization scales or a padded page "
                "(kvcached #399/#434)",
                "use an unpadded, unscaled KV cache dtype with kvcached",
            )
    if sched > page:
        raise _refuse(
            "binding.page_size_bytes",
            f"a block ({sched} B per pool) exceeds the {page} B page",
            "raise KVCACHED_PAGE_SIZE_MB (binding.page_size_bytes)",
        )


def _refuse_per_layer_mamba() -> KVPlanError:
    return _refuse(
        "binding.pool_layout",
        "the per-layer binding (v0.8 patch_initialize_kv_cache) has no Mamba state views: it "
        "hands alloc_kv_cache's raw tensors to the layers one by one and never builds "
        "_reshape_mamba_* views (vLLM 0.8's V1 runner had no Mamba layers)",
        "use the noncontiguous or contiguous layout for attention+Mamba models",
    )


def kvcached_geometry_of(
    r: ResolvedDocument, layout: PoolLayout, virtual_capacity: int | None, page: int
) -> tuple[KvcachedGeometry, list[_Group]]:
    """kvcached's pool geometry for a checked document; raises :class:`KVPlanError`."""
    contiguous, per_layer = layout == "contiguous", layout == "per-layer"
    attention_type = _attention_type(r)
    if per_layer and attention_type == HYBRID:
        raise _refuse_per_layer_mamba()
    groups = _groups(r, attention_type)
    _check_groups(groups, attention_type, page)
    first = groups[0]
    if attention_type == HYBRID and len({g.geom for g in groups}) > 1:
        raise _refuse(
            "kv_cache_config.kv_cache_groups",
            "attention+Mamba models need one attention geometry, got "
            f"{sorted({g.geom for g in groups})}",
        )
    nkv = attention_type.kv_buffers
    align = 2 * page if attention_type == MLA else page
    bm = _block_mem(first, attention_type)
    if attention_type == HYBRID:
        for name in r.backed_layers:
            spec = r.spec_of(name)
            if isinstance(spec, LegacyMambaSpec) and spec.page_size_bytes != 2 * bm:
                raise _refuse(
                    name,
                    f"the Mamba page ({spec.page_size_bytes} B) must equal the attention page "
                    f"({2 * bm} B) of the unified pool",
                )
    if virtual_capacity is None:
        kv_bytes = -(-r.num_blocks * bm // align) * align
    else:
        kv_bytes = virtual_capacity // nkv // align * align
    blocks = kv_bytes // bm
    if blocks < r.num_blocks:
        raise _refuse(
            "binding.virtual_capacity_bytes",
            f"{virtual_capacity} B per pool holds {blocks} blocks of {bm} B "
            f"({nkv} x {align}-aligned halves) but vLLM hands out {r.num_blocks}",
            f"reserve at least {nkv * (-(-r.num_blocks * bm // align) * align)} B per pool",
            Code.VIRTUAL_CAPACITY_TOO_SMALL,
        )
    cell = first.spec.page_size_bytes // first.block_size // attention_type.scheduler_kv_buffers
    geometry = KvcachedGeometry(
        attention_type,
        contiguous,
        per_layer,
        num_pools=r.num_pools(per_layer),
        cell_size=cell,
        block_mem_bytes=first.block_size * cell,
        kv_bytes=kv_bytes,
        num_blocks=blocks,
        page_size_bytes=page,
    )
    return geometry, groups


def bind_kvcached(
    r: ResolvedDocument, layout: PoolLayout, virtual_capacity: int | None, page: int
) -> LegacyBinding:
    out = LegacyBinding(layout=f"kvcached/{layout}")
    try:
        geo, groups = kvcached_geometry_of(r, layout, virtual_capacity, page)
        hetero = geo.attention_type != HYBRID and len({g.geom for g in groups}) > 1
        if geo.contiguous and geo.attention_type != HYBRID:
            for g in groups if hetero else groups[:1]:
                if g.ratio > 1:
                    raise _refuse(
                        f"kernel_block_sizes[{g.gid}]",
                        f"the contiguous layout views whole {g.block_size}-token blocks but the "
                        f"kernels index {g.kernel}-token blocks"
                        + (" (kvcached raises for heterogeneous groups)" if hetero else ""),
                        "use the non-contiguous layout (KVCACHED_CONTIGUOUS_LAYOUT=false)",
                        Code.CONTIGUOUS_KERNEL_SPLIT,
                    )
    except KVPlanError as exc:
        out.problems.extend(exc.diagnostics)
        return out
    out.pools = _pools(geo)
    by_gid = {g.gid: g for g in groups}
    pool_of = _pool_indices(r, geo.per_layer)
    for gid, layers in enumerate(r.backed):
        spec = r.group_spec(gid)
        for layer in layers:
            i = pool_of[layer]
            if isinstance(spec, LegacyMambaSpec):
                out.views.extend(_mamba_views(r, geo, groups[0], layer, spec, i))
            else:
                g = by_gid[gid] if hetero else groups[0]
                out.views.append(_attention_view(r, geo, g, layer, i))
    out.aliases = aliases_of(r.sharers)
    nkv = geo.attention_type.kv_buffers
    out.bytes_per_block = geo.num_pools * nkv * _block_mem(groups[0], geo.attention_type)
    return out


def _pool_indices(r: ResolvedDocument, per_layer: bool) -> dict[str, int]:
    """Layer → pool: layer ``i`` of every group binds pool ``i``; per-layer, each layer its own
    pool, numbered in group then ``layer_names`` order (v0.8's sequential ``layer_id``)."""
    if per_layer:
        return {name: i for i, name in enumerate(r.backed_layers)}
    return {name: i for layers in r.backed for i, name in enumerate(layers)}


def _pools(geo: KvcachedGeometry) -> list[Pool]:
    if geo.contiguous:
        return [
            Pool(
                name="kv_contiguous",
                size_bytes=geo.ftensor_bytes * geo.num_pools,
                alignment_bytes=geo.page_size_bytes,
                num_blocks=geo.num_blocks,
            )
        ]
    return [
        Pool(
            name=f"kv_{i}",
            size_bytes=geo.ftensor_bytes,
            alignment_bytes=geo.page_size_bytes,
            num_blocks=geo.num_blocks,
        )
        for i in range(geo.num_pools)
    ]


def _pool(geo: KvcachedGeometry, i: int) -> str:
    return "kv_contiguous" if geo.contiguous else f"kv_{i}"


def _attention_view(
    r: ResolvedDocument, geo: KvcachedGeometry, g: _Group, layer: str, i: int
) -> View:
    dtype = g.spec.dtype
    isz = itemsize(dtype)
    n, pools = geo.num_blocks, geo.num_pools
    offset = 0
    if geo.attention_type == MLA:
        if geo.contiguous:
            shape = [n, g.block_size, g.head]
            stride = [pools * g.block_size * g.head, g.head, 1]
            offset = i * g.block_size * g.head * isz
        else:
            shape = [n * g.ratio, g.kernel, g.head]
            stride = dense_strides(shape)
    else:
        inner = [g.heads * g.head, g.head, 1]
        unified = geo.attention_type == HYBRID
        tokens = g.block_size if geo.contiguous and not unified else g.kernel
        blocks = n if geo.contiguous and not unified else n * g.ratio
        hidden = tokens * g.heads * g.head
        if geo.contiguous:
            block_step, kv_step = pools * 2 * hidden, hidden
            offset = i * 2 * hidden * isz
        elif unified:
            block_step, kv_step = 2 * hidden, hidden
        else:
            block_step, kv_step = hidden, geo.kv_bytes // isz
        if g.blocks_first:
            shape = [blocks, 2, tokens, g.heads, g.head]
            stride = [block_step, kv_step, *inner]
        else:
            shape = [2, blocks, tokens, g.heads, g.head]
            stride = [kv_step, block_step, *inner]
    return View(
        layer=layer,
        group=r.group_of[layer],
        pool=_pool(geo, i),
        kind=r.group_spec(r.group_of[layer]).kind,
        dtype=dtype,
        shape=shape,
        stride=stride,
        offset_bytes=offset,
    )


def _mamba_views(
    r: ResolvedDocument,
    geo: KvcachedGeometry,
    first: _Group,
    layer: str,
    spec: LegacyMambaSpec,
    i: int,
) -> list[View]:
    page = 2 * _block_mem(first, HYBRID)  # == spec.page_size_bytes (checked)
    if geo.contiguous:
        blocks, step, base = geo.num_blocks, geo.num_pools * page, i * page
    else:
        blocks = geo.num_blocks * page // spec.page_size_bytes
        step, base = spec.page_size_bytes, 0
    return mamba_state_views(layer, r.group_of[layer], _pool(geo, i), spec, blocks, step, base)
