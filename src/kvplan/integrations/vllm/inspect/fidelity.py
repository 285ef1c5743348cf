"""Differential check: a kvplan plan against the tensors vLLM's own allocator makes.

:func:`vllm_kv_caches` runs vLLM's ``allocate_kv_cache`` (unwrapped, should a plugin have
patched it) and then the runner's alias loop ``kv_caches[layer] = kv_caches[target]``;
:func:`compare` lists every way a plan differs from those tensors.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kvplan.schemas.plan import BindingPlan

if TYPE_CHECKING:
    import torch
    from vllm.v1.kv_cache_interface import KVCacheConfig


def vllm_kv_caches(
    kv_cache_config: KVCacheConfig,
    layout: str,
    kernel_block_sizes: Sequence[int] | None,
    shared_kv_cache_layers: Mapping[str, str],
    device: str = "meta",
) -> dict[str, torch.Tensor]:
    """vLLM's per-layer KV-cache tensors, aliases included (``device="meta"``: no memory)."""
    import torch
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker import utils as worker_utils

    allocate = inspect.unwrap(worker_utils.allocate_kv_cache)
    kv_caches: dict[str, torch.Tensor] = allocate(
        kv_cache_config,
        torch.device(device),
        KVCacheLayout[layout],
        None if kernel_block_sizes is None else list(kernel_block_sizes),
    )
    for layer_name, target_layer_name in shared_kv_cache_layers.items():
        kv_caches[layer_name] = kv_caches[target_layer_name]
    return kv_caches


def byte_offset(tensor: torch.Tensor) -> int:
    """Bytes from the start of the tensor's storage to its first element."""
    return int(tensor.storage_offset()) * int(tensor.element_size())


def compare(plan: BindingPlan, kv_caches: Mapping[str, torch.Tensor]) -> list[str]:
    """Every difference between ``plan`` and vLLM's tensors (empty: the plan is exact)."""
    problems: list[str] = []
    views = plan.view_by_layer
    aliases = {alias.layer: alias.target for alias in plan.aliases}
    owners: dict[int, str] = {}
    for name, tensor in kv_caches.items():
        if name not in aliases:
            owners.setdefault(id(tensor), name)
    for name, tensor in kv_caches.items():
        if name in aliases:
            target = aliases[name]
            if target not in kv_caches or kv_caches[target] is not tensor:
                problems.append(f"{name}: plan aliases {target}, vLLM binds another tensor")
            continue
        owner = owners[id(tensor)]
        if owner != name:
            problems.append(f"{name}: vLLM binds {owner}'s tensor but the plan has no alias")
            continue
        view = views.get(name)
        if view is None:
            problems.append(f"{name}: vLLM allocates it but the plan has no view")
            continue
        facts = {
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
            "stride": list(tensor.stride()),
            "offset_bytes": byte_offset(tensor),
        }
        for key, value in facts.items():
            planned = getattr(view, key)
            if planned != value:
                problems.append(f"{name}: {key} plan={planned} vllm={value}")
    for name in set(views) | set(aliases):
        if name not in kv_caches:
            problems.append(f"{name}: in the plan but vLLM binds nothing")
    return problems
