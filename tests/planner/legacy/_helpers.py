"""Shared helpers for the legacy tests: fixture loading and synthetic 0.24 documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvplan.schemas.legacy import LegacyInputDocument, parse_legacy

ROOT = Path(__file__).resolve().parents[3]
LEGACY = ROOT / "tests" / "data" / "legacy"
FIXTURES = sorted(p.stem for p in LEGACY.glob("*.json"))
STRATEGIES = [
    ("vanilla", None),
    ("kvcached", "noncontiguous"),
    ("kvcached", "contiguous"),
    ("kvcached", "per-layer"),
]


def raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((LEGACY / f"{name}.json").read_text())
    return data


def load(name: str) -> LegacyInputDocument:
    return parse_legacy(raw(name), name)


def recorded(name: str) -> dict[str, dict[str, Any]]:
    """What vLLM 0.24's runner produced (per layer; Mamba states as ``layer#i``)."""
    views: dict[str, dict[str, Any]] = raw(name)["metadata"]["vllm_0_24_views"]
    return views


def synthetic(
    *,
    groups: list[dict[str, Any]],
    pools: int,
    num_blocks: int,
    shapes: list[list[int]],
    kernel_block_sizes: list[int],
    block_dims: list[int],
    binding: dict[str, Any] | None = None,
) -> LegacyInputDocument:
    """A 0.24-shaped document: ``pools`` tensors, each shared by layer ``i`` of every group.

    ``groups[g]`` is a spec dict; group ``g`` gets ``pools`` layers ``g<g>.l<i>``; tensors are
    sized by the largest page (vLLM unifies pages, so they are equal in practice).
    """
    from kvplan.schemas.legacy import LegacyKVCacheGroupSpec

    pages = [
        LegacyKVCacheGroupSpec.model_validate(
            {"layer_names": [], "kv_cache_spec": spec}
        ).kv_cache_spec.page_size_bytes
        for spec in groups
    ]
    names = [[f"g{g}.l{i}" for i in range(pools)] for g in range(len(groups))]
    doc = {
        "format": "kvplan.input-legacy/1",
        "vllm_version": "0.24.0",
        "kv_cache_config": {
            "num_blocks": num_blocks,
            "kv_cache_tensors": [
                {"size": max(pages) * num_blocks, "shared_by": [n[i] for n in names]}
                for i in range(pools)
            ],
            "kv_cache_groups": [
                {"layer_names": n, "kv_cache_spec": s} for n, s in zip(names, groups, strict=True)
            ],
        },
        "attn_groups": [
            {
                "kv_cache_group_id": g,
                "backend": "Backend",
                "layer_names": names[g],
                "kv_cache_shape": shapes[g] or None,
                "stride_order": list(range(len(shapes[g]))) if shapes[g] else None,
                "block_dim": block_dims[g] if shapes[g] else None,
            }
            for g in range(len(groups))
        ],
        "kernel_block_sizes": kernel_block_sizes,
        "binding": binding or {},
    }
    return parse_legacy(doc)
