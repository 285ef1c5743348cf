"""vLLM 0.34: the V2 runner only, an ``allocate`` hook, and vLLM's own extensible KV cache.

Compared from the released wheel's sources against 0.33 (see docs/integration.md, "vLLM
0.34's extensible KV cache"):

- The V1 runner (``vllm.v1.worker.gpu_model_runner``) is gone; every worker builds the V2
  runner. The x86 ``CPUModelRunner`` subclasses it; non-x86 CPUs run
  ``StandaloneCPUModelRunner``, whose ``initialize_kv_cache`` calls the CPU build's own
  ``init_kv_cache`` (``vllm.v1.worker.cpu.attn_utils``: 0.33's V2 ``init_kv_cache`` without
  ``block_tables``, with its own ``get_shared_kv_cache_layers`` alias loop).
- ``allocate_kv_cache`` gains ``allocate`` (a backing allocator; the extensible cache passes
  its own). kvplan binds the backing itself, so a call that brings an allocator is refused
  (``KVP508``), never served from kvplan's pools behind vLLM's back.
- The V2 ``initialize_kv_cache`` gains ``extensible``, ``init_kv_cache`` gains keyword-only
  ``allocate``, and the KV-sharing alias step moved into ``bind_kv_caches`` (called by
  ``init_kv_cache``, and again by ``extend_kv_cache`` when the extensible cache rebinds
  after warm-up). ``init_kv_cache`` still returns the dict with the aliases, which kvplan
  checks against the plan as before.
- vLLM's extensible KV cache (default on CUDA and ROCm) reserves virtual memory and maps
  physical pages itself -- a second manager of the memory kvplan binds. With kvplan on,
  ``VllmConfig._resolve_extensible_kv_cache`` is wrapped: left at its default, it is turned
  off with a start-up line; asked for explicitly, the engine is refused (``KVP508``).
- Engine core (``kvplan inspect``): 0.33's steps (``get_global_kv_cache_groups``, then
  ``get_kv_cache_configs``); with the extensible cache on, each worker then pads every
  layer's segment to the memory granule (``pad_kv_cache_segments``), which inspect replays.
- Fields: new ``AttentionSpec.kv_head_major_slots``, ``MambaSpec.state_alignment``,
  ``SlidingWindowMLASpec.non_causal_multi_token_decode`` (and MLA's), and
  ``KVCacheConfig.needs_kv_cache_zeroing`` (``init=False``); none of 0.30-0.31's
  ``storage_block_size``.
- Elastic serving: every elastic target keeps 0.33's signature; ``BlockPool.free_blocks``
  gains ``evict_first`` (kvplan's pool passes it through); the scheduler no longer keeps
  ``prev_step_scheduled_req_ids`` (a failed map's recovery preempts as vLLM's own
  ``reset_prefix_cache`` does, without it); ``gpu_memory_utilization`` may be ``None`` (kvplan
  reads ``resolved_gpu_memory_utilization``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvplan.integrations.vllm.versions import v0_33
from kvplan.integrations.vllm.versions._adapter import (
    ALLOCATE,
    CONFIG,
    PLACEMENT,
    READ,
    RUNNER,
    TENSORS,
    V2,
    EngineCorePlanning,
    Target,
    VersionAdapter,
)
from kvplan.integrations.vllm.versions.v0_33 import ELASTIC_TARGETS, _configs_0_33, _groups_0_33

_ALLOC = ("kv_cache_config", "device", "layout", "kernel_block_sizes", "allocate")
_INIT = ("self", "kv_cache_config", "is_profiling", "kv_cache_allocation_context", "extensible")
_CPU_INIT = ("self", "kv_cache_config", "is_profiling", "kv_cache_allocation_context")
_V2_INIT = (
    "forward_context", "kv_cache_config", "device", "kernel_block_sizes", "vllm_config",
    "kv_cache_allocation_context", "*block_tables", "*attn_groups", "*allocate",
)  # fmt: skip
_CPU_V2_INIT = (
    "forward_context", "kv_cache_config", "device", "kernel_block_sizes", "vllm_config",
    "kv_cache_allocation_context", "*attn_groups",
)  # fmt: skip
_CPU_RUNNER = "vllm.v1.worker.cpu.standalone_model_runner"
_CPU_UTILS = "vllm.v1.worker.cpu.attn_utils"
_0_33 = {t.name: t for t in v0_33.TARGETS}


def _as_in_0_33(name: str, **changes: Any) -> Target:
    """0.33's declaration of target ``name`` with what 0.34 changed."""
    return dataclasses.replace(_0_33[name], **changes)


_V2_CALLS = ("allocate_kv_cache", "bind_kv_caches")
"""0.34's V2 ``init_kv_cache`` aliases in ``bind_kv_caches`` (0.33: its own loop)."""

TARGETS = (
    Target(
        "vllm.config.vllm", "VllmConfig._resolve_extensible_kv_cache", ("self",), CONFIG,
        "vLLM's extensible KV cache: off by default with kvplan (a start-up line says so), "
        "refused when asked for", "extensible-kv-cache",
    ),
    _as_in_0_33(
        "vllm.v1.worker.utils.allocate_kv_cache", params=_ALLOC, handler="allocate/no-allocator"
    ),
    _as_in_0_33(
        "vllm.v1.worker.gpu.attn_utils.allocate_kv_cache",
        params=_ALLOC, handler="allocate/no-allocator",
    ),
    Target(
        _CPU_UTILS, "allocate_kv_cache", _ALLOC, ALLOCATE,
        "imported by name by the CPU build's init_kv_cache", "allocate/no-allocator", V2,
    ),
    _as_in_0_33("vllm.v1.hisparse.binding.allocate_kv_cache", params=_ALLOC),
    _as_in_0_33(
        "vllm.v1.worker.gpu.model_runner.GPUModelRunner.initialize_kv_cache",
        params=_INIT, handler="runner-entry/not-extensible",
        why="V2 runner entry (the x86 CPU runner's too): owner of the cache, is_profiling; "
        "extensible=True is refused",
    ),
    Target(
        _CPU_RUNNER, "StandaloneCPUModelRunner.initialize_kv_cache", _CPU_INIT, RUNNER,
        "the standalone CPU runner's entry (non-x86 CPUs): owner of the cache, is_profiling",
        "runner-entry", V2, ("init_kv_cache",),
    ),
    _as_in_0_33(
        "vllm.v1.worker.gpu.attn_utils.init_kv_cache", params=_V2_INIT, calls=_V2_CALLS,
        why="V2: allocate, then bind_kv_caches (the alias step); vLLM's dict is checked",
    ),
    _as_in_0_33("vllm.v1.worker.gpu.model_runner.init_kv_cache", params=_V2_INIT, calls=_V2_CALLS),
    Target(
        _CPU_UTILS, "init_kv_cache", _CPU_V2_INIT, TENSORS,
        "the CPU build's init_kv_cache: allocate, alias loop, bind; vLLM's dict is checked",
        "v2-init/cpu", V2, ("allocate_kv_cache", "get_shared_kv_cache_layers"),
    ),
    Target(
        _CPU_RUNNER, "init_kv_cache", _CPU_V2_INIT, TENSORS,
        "imported by name by the standalone CPU runner", "v2-init/cpu", V2,
        ("allocate_kv_cache", "get_shared_kv_cache_layers"),
    ),
    _as_in_0_33("vllm.v1.worker.gpu.attn_utils.get_shared_kv_cache_layers"),
    Target(
        _CPU_UTILS, "get_shared_kv_cache_layers", ("vllm_config",), READ,
        "the CPU build's sharing map (read, not patched)",
    ),
    _as_in_0_33("vllm.v1.worker.gpu_worker.Worker.execute_model"),
)  # fmt: skip


def _configs_0_34(
    vllm_config: Any, kv_cache_specs: list[Any], memory: list[int], groups: Any
) -> list[Any]:
    """0.33's ``get_kv_cache_configs``; then, where vLLM's extensible KV cache is on, each
    worker's padding of every layer's segment to the memory granule (``gpu_worker``)."""
    configs = _configs_0_33(vllm_config, kv_cache_specs, memory, groups)
    if not getattr(vllm_config.cache_config, "enable_extensible_kv_cache", False):
        return configs
    from vllm.v1.worker.extensible_kv_cache import pad_kv_cache_segments

    layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
    return [pad_kv_cache_segments(config, layout, EXTENSIBLE_GRANULE) for config in configs]


EXTENSIBLE_GRANULE = 2 << 20
"""The commit granule ``kvplan inspect`` pads with: vLLM's ``granule_size`` is the driver's
VMM granularity floored at 2 MiB, and 2 MiB on the GPUs vLLM runs on."""

ADAPTER = VersionAdapter(
    name="vllm-0.34",
    releases=("0.34",),
    form=PLACEMENT,
    targets=TARGETS + ELASTIC_TARGETS,
    absent_fields={"0.34": {"MLAAttentionSpec": {"storage_block_size": None}}},
    engine_core={"0.34": EngineCorePlanning(_groups_0_33, _configs_0_34)},
    notes=__doc__ or "",
)
