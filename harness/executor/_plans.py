"""Synthetic BindingPlans shaped like vLLM 0.33's (no pytest, no torch: benchmarks use it too).

Views are vLLM's universal ``[B, H, N, C]`` (K and V packed in ``C = 2 * head``) with the
physical order ``... N H C`` inside a page. Layouts:

* ``layer``: layer-outermost; layer ``l`` block ``b`` at ``l*NB*P + b*P`` (``P`` = page bytes).
* ``block``: block-outermost packed; block ``b`` layer ``l`` at ``b*L*P + l*P``.
* ``head``: heads outside blocks; layer ``l`` head ``h`` block ``b`` at
  ``l*NB*P + h*NB*(P/H) + b*(P/H)`` (several ranges per block and layer).

``ratio`` > 1 splits each manager block into ``ratio`` dense kernel blocks (layer layout only).
"""

from __future__ import annotations

from kvplan.schemas.dtypes import itemsize
from kvplan.schemas.plan import Alias, BindingPlan, Pool, Source, Summary, View

ALIGN = 2 << 20


def layer_name(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def make_plan(
    pools: list[Pool], views: list[View], aliases: list[Alias] | None = None, *, layout: str = ""
) -> BindingPlan:
    aliases = aliases or []
    num_blocks = max((p.num_blocks for p in pools), default=0)
    pool_bytes = sum(p.size_bytes for p in pools)
    return BindingPlan(
        fingerprint="sha256:" + "0" * 64,
        source=Source(vllm_version="0.33.0", layout=layout or None, num_blocks=num_blocks),
        pools=pools,
        views=views,
        aliases=aliases,
        summary=Summary(
            tensor_backed_layers=len(views),
            aliased_layers=len(aliases),
            bytes_per_block=pool_bytes // num_blocks if num_blocks else 0,
            pool_bytes=pool_bytes,
            alias_saved_bytes=0,
        ),
    )


def attention_views(
    *,
    layers: list[str],
    group: int,
    pool: str,
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head: int,
    dtype: str,
    ratio: int = 1,
    layout: str = "layer",
    slots: int | None = None,
) -> tuple[list[View], int]:
    """Views of one group of same-spec layers; returns ``(views, page_bytes)``.

    ``slots``: how many layer slots the pool holds (``>= len(layers)``; block layout).
    """
    isz = itemsize(dtype)
    c = 2 * head
    h, n = kv_heads, block_size
    page_e = n * h * c
    page = page_e * isz
    slots = slots or len(layers)
    views = []
    for i, name in enumerate(layers):
        if layout == "layer":
            n_k = n // ratio
            shape = [num_blocks * ratio, h, n_k, c]
            stride = [page_e // ratio, c, h * c, 1]
            offset = i * num_blocks * page
        elif layout == "block":
            assert ratio == 1, "kernel split needs a layer-outermost layout"
            shape = [num_blocks, h, n, c]
            stride = [slots * page_e, c, h * c, 1]
            offset = i * page
        elif layout == "head":
            assert ratio == 1
            shape = [num_blocks, h, n, c]
            stride = [n * c, num_blocks * n * c, c, 1]
            offset = i * num_blocks * page
        else:
            raise ValueError(layout)
        views.append(
            View(
                layer=name,
                group=group,
                pool=pool,
                kind="FullAttentionSpec",
                dtype=dtype,
                shape=shape,
                stride=stride,
                offset_bytes=offset,
            )
        )
    return views, page


def llama_plan(
    *,
    layers: int = 4,
    num_blocks: int = 64,
    block_size: int = 16,
    kv_heads: int = 8,
    head: int = 128,
    dtype: str = "bfloat16",
    ratio: int = 1,
    layout: str = "layer",
    pool: str = "kv",
) -> BindingPlan:
    """A Llama-like plan: one group, ``layers`` full-attention layers in one pool."""
    views, page = attention_views(
        layers=[layer_name(i) for i in range(layers)],
        group=0,
        pool=pool,
        num_blocks=num_blocks,
        block_size=block_size,
        kv_heads=kv_heads,
        head=head,
        dtype=dtype,
        ratio=ratio,
        layout=layout,
    )
    size = layers * num_blocks * page
    pools = [Pool(name=pool, size_bytes=size, alignment_bytes=ALIGN, num_blocks=num_blocks)]
    return make_plan(pools, views, layout={"layer": "LBNHC", "block": "BLNHC"}.get(layout, ""))


def llama_8b_plan(pool_bytes: int = 1 << 30) -> BindingPlan:
    """Llama-3.1-8B geometry: 32 layers, 8 KV heads, head 128, bf16, bs 16 (2 MiB per block)."""
    per_block = 32 * 16 * 8 * 256 * 2
    return llama_plan(layers=32, num_blocks=pool_bytes // per_block)


GEMMA_FULL = (4, 9, 14)


def gemma_plan(*, num_blocks: int = 64, dtype: str = "bfloat16") -> BindingPlan:
    """A gemma-4-E2B-like plan: 35 layers, 15 views in 5 groups overlaying one pool, 20 aliases.

    Sliding layers: H=1, head 256, bs 16; full layers (4, 9, 14): H=1, head 512, bs 8; both
    pages are 16 KiB (bf16). Each group holds 3 layers at slots 0..2, layer-outermost, from
    byte 0 of the shared pool. Layers 15..34 share L14 (full-type) or L13 (sliding-type).
    """
    sliding = [i for i in range(15) if i not in GEMMA_FULL]
    groups = [list(GEMMA_FULL)] + [sliding[k : k + 3] for k in range(0, 12, 3)]
    views: list[View] = []
    page = 0
    for g, members in enumerate(groups):
        full = g == 0
        vs, page = attention_views(
            layers=[layer_name(i) for i in members],
            group=g,
            pool="kv",
            num_blocks=num_blocks,
            block_size=8 if full else 16,
            kv_heads=1,
            head=512 if full else 256,
            dtype=dtype,
        )
        views.extend(vs)
    aliases = [
        Alias(layer=layer_name(i), target=layer_name(14 if i % 5 == 4 else 13))
        for i in range(15, 35)
    ]
    size = 3 * num_blocks * page
    pools = [Pool(name="kv", size_bytes=size, alignment_bytes=ALIGN, num_blocks=num_blocks)]
    return make_plan(pools, views, aliases, layout="LBNHC")


def gemma_e2b_plan(pool_bytes: int = 256 << 20) -> BindingPlan:
    """The gemma plan sized to about ``pool_bytes`` (3 slots x 16 KiB pages per block)."""
    return gemma_plan(num_blocks=pool_bytes // (3 * 16384))


def whole_pool_plan(*, size: int = 3 << 20, num_blocks: int = 8) -> BindingPlan:
    """A spec without per-layer views: one ``int8 [size]`` view of the whole pool."""
    pools = [Pool(name="hot", size_bytes=size, alignment_bytes=4096, num_blocks=num_blocks)]
    view = View(
        layer="model.hisparse.hot",
        group=0,
        pool="hot",
        kind="HiSparseHotSpec",
        dtype="int8",
        shape=[size],
        stride=[1],
        offset_bytes=0,
    )
    return make_plan(pools, [view])


def two_pool_plan(*, num_blocks: int = 16) -> BindingPlan:
    """Two pools (a device pool and a second one) to exercise multi-pool transactions."""
    a = llama_plan(layers=2, num_blocks=num_blocks, kv_heads=2, head=64, pool="kv")
    b = llama_plan(
        layers=1, num_blocks=num_blocks, kv_heads=1, head=64, dtype="float16", pool="aux"
    )
    views = list(a.views) + [
        v.model_copy(update={"layer": "model.layers.9.aux", "group": 1}) for v in b.views
    ]
    return make_plan(list(a.pools) + list(b.pools), views)
