"""Build vLLM-0.33-shaped input documents the way vLLM's placement does (for unit tests).

Layer-outermost layouts: ``layer_stride = page * num_blocks``, ``block_stride = page``.
Block-outermost layouts: ``layer_stride = page``, ``block_stride`` = the packed block.
"""

from __future__ import annotations

from typing import Any

BLOCK_OUTERMOST = {"BLHNC", "BLNHC", "BHLNC"}


def attn_spec(
    kind: str = "FullAttentionSpec",
    *,
    block_size: int = 16,
    heads: int = 2,
    head_size: int = 32,
    dtype: str = "bfloat16",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "block_size": block_size,
        "num_kv_heads": heads,
        "head_size": head_size,
        "dtype": dtype,
        **extra,
    }


def page_bytes(spec: dict[str, Any]) -> int:
    from kvplan.schemas.input import KVCacheGroupSpec

    return KVCacheGroupSpec.model_validate(
        {"layer_names": [], "kv_cache_spec": spec}
    ).kv_cache_spec.page_size_bytes


def document(
    groups: list[tuple[list[str], dict[str, Any]]],
    *,
    num_blocks: int = 64,
    layout: str = "LBNHC",
    shared: dict[str, str] | None = None,
    kernel_block_sizes: list[int] | None = None,
) -> dict[str, Any]:
    """Groups overlay one pool from byte 0; within a group layers are placed by ``layout``."""
    per_block = max(page_bytes(spec) * len(layers) for layers, spec in groups)
    size = per_block * num_blocks
    tensors = []
    for layers, spec in groups:
        page = page_bytes(spec)
        if layout in BLOCK_OUTERMOST:
            tensors.append(
                {
                    "size": size,
                    "layers": list(layers),
                    "layer_stride": page,
                    "block_stride": per_block,
                }
            )
        else:
            tensors.append(
                {
                    "size": size,
                    "layers": list(layers),
                    "layer_stride": page * num_blocks,
                    "block_stride": page,
                }
            )
    doc: dict[str, Any] = {
        "format": "kvplan.input/1",
        "vllm_version": "0.33.0",
        "kv_cache_config": {
            "num_blocks": num_blocks,
            "kv_cache_layout": layout,
            "kv_cache_tensors": tensors,
            "kv_cache_groups": [
                {"layer_names": list(layers), "kv_cache_spec": spec} for layers, spec in groups
            ],
        },
        "shared_kv_cache_layers": shared or {},
    }
    if kernel_block_sizes is not None:
        doc["kernel_block_sizes"] = kernel_block_sizes
    return doc


def name(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def llama(num_layers: int = 4, **kw: Any) -> dict[str, Any]:
    return document([([name(i) for i in range(num_layers)], attn_spec())], **kw)


def gemma4_e2b(layout: str = "LBNHC", num_blocks: int = 64) -> dict[str, Any]:
    """35 layers, pattern 4 sliding : 1 full; layers 15..34 share 13 (sliding) / 14 (full)."""
    sliding = [i for i in range(15) if i % 5 != 4]
    full = [i for i in range(15) if i % 5 == 4]
    sw = attn_spec("SlidingWindowSpec", block_size=32, heads=1, head_size=256, sliding_window=512)
    fa = attn_spec(block_size=16, heads=1, head_size=512)
    shared = {name(i): name(13) if i % 5 != 4 else name(14) for i in range(15, 35)}
    if layout in BLOCK_OUTERMOST:
        sw16 = dict(sw, block_size=16)
        fa16 = dict(fa)
        g0 = [0, 2, 5, 7, 10, 12]
        g1 = [1, 3, 6, 8, 11, 13]
        groups = [
            (
                [name(i) for i in g0],
                {
                    "kind": "UniformTypeKVCacheSpecs",
                    "block_size": 16,
                    "kv_cache_specs": {name(i): sw16 for i in g0},
                },
            ),
            (
                [name(i) for i in g1],
                {
                    "kind": "UniformTypeKVCacheSpecs",
                    "block_size": 16,
                    "kv_cache_specs": {name(i): sw16 for i in g1},
                },
            ),
            (
                [name(i) for i in full],
                {
                    "kind": "UniformTypeKVCacheSpecs",
                    "block_size": 16,
                    "kv_cache_specs": {name(i): fa16 for i in full},
                },
            ),
        ]
        return _packed(groups, num_blocks, layout, shared)
    groups = [([name(i) for i in sliding if i % 5 == k], sw) for k in range(4)]
    groups.append(([name(i) for i in full], fa))
    return document(
        groups,
        num_blocks=num_blocks,
        layout=layout,
        shared=shared,
        kernel_block_sizes=[32, 32, 32, 32, 16],
    )


def _packed(
    groups: list[tuple[list[str], dict[str, Any]]],
    num_blocks: int,
    layout: str,
    shared: dict[str, str],
) -> dict[str, Any]:
    pages = [sum(page_bytes(s) for s in spec["kv_cache_specs"].values()) for _, spec in groups]
    per_block = max(pages)
    size = per_block * num_blocks
    tensors = []
    for layers, spec in groups:
        page = page_bytes(next(iter(spec["kv_cache_specs"].values())))
        tensors.append(
            {"size": size, "layers": list(layers), "layer_stride": page, "block_stride": per_block}
        )
    return {
        "format": "kvplan.input/1",
        "vllm_version": "0.33.0",
        "kv_cache_config": {
            "num_blocks": num_blocks,
            "kv_cache_layout": layout,
            "kv_cache_tensors": tensors,
            "kv_cache_groups": [
                {"layer_names": layers, "kv_cache_spec": spec} for layers, spec in groups
            ],
        },
        "shared_kv_cache_layers": shared,
    }


def mamba_hybrid(num_blocks: int = 16) -> dict[str, Any]:
    """granite-4.0-h-like: 3 Mamba groups + 1 attention group, Mamba page padded to 139264."""
    mamba = {
        "kind": "MambaSpec",
        "block_size": 272,
        "shapes": [[3, 4352], [64, 874]],
        "dtypes": ["bfloat16", "bfloat16"],
        "page_size_padded": 139264,
        "mamba_cache_mode": "align",
    }
    attn = attn_spec(block_size=272, heads=2, head_size=64)
    groups = [([f"model.layers.{i}.mixer", f"model.layers.{i + 4}.mixer"], mamba) for i in range(3)]
    groups.append(([name(3), name(7)], attn))
    return document(groups, num_blocks=num_blocks, layout="LBNHC")


def mla(
    num_layers: int = 4, dtype: str = "bfloat16", alignment: int | None = None
) -> dict[str, Any]:
    spec = {
        "kind": "MLAAttentionSpec",
        "block_size": 64,
        "num_kv_heads": 1,
        "head_size": 576,
        "dtype": dtype,
        "block_stride_alignment": {"multiple_of": 64},
    }
    if alignment:
        spec["alignment"] = alignment
    return document([([name(i) for i in range(num_layers)], spec)], num_blocks=16)
