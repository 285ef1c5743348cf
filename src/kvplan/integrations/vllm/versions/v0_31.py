"""vLLM 0.30–0.31: the placement form; the V2 ``init_kv_cache`` has no ``attn_groups``.

Compared from the released wheels' sources against 0.33 (see docs/integration.md):

- ``allocate_kv_cache``: same signature and loop as 0.33, plus one rule: an
  ``MLAAttentionSpec`` (or subclass) whose ``storage_block_size`` is set is viewed in blocks
  of ``storage_block_size`` tokens, whatever the group's kernel block size. The field is
  captured with the spec and kvplan's planner applies the same rule (``MLAAttentionSpec.
  storage_block_size`` in docs/formats.md), so the plan's views are vLLM's.
- V1 ``initialize_kv_cache_tensors``: same signature; ``bind_kv_cache`` gets the dict itself
  (no ``map_kv_caches_to_kernel_blocks`` / ``layer_kv_caches``). The dict the function
  returns is, as in 0.33, ``allocate_kv_cache``'s plus vLLM's alias loop; it is what the
  attention layers are bound to here, and it is checked against the plan as in 0.33.
- V2 ``init_kv_cache``: no keyword-only ``attn_groups`` (its bound dict is the returned one
  filtered to the forward context, no kernel-block mapping); HiSparse branch as in 0.33.
- Fields: ``KVCacheConfig`` lacks ``hash_block_size`` and ``cache_hit_alignment_tokens``
  (0.30 also ``kv_tp_replicas``); specs lack ``is_draft`` and MLA ``topk_buffer_width``;
  0.30's specs also lack ``dcp_sharded``, ``block_stride_alignment``, ``max_tp_shards`` and
  ``SlidingWindowMLASpec.bounded_replay``.
- Engine core (``kvplan inspect``, read from 0.30's and 0.31's ``EngineCore.
  _initialize_kv_caches``, identical in both): as 0.32's -- ``get_kv_cache_configs(
  vllm_config, kv_cache_specs, available_memory)`` in ``kv_cache_utils`` forms the global
  groups itself, and the global block size is the smallest of the prefix-cacheable groups' --
  except that nothing resolves ``hash_block_size`` / ``cache_hit_alignment_tokens`` into the
  configs (the fields do not exist; the engine core computes the hash block size for its
  scheduler only, and there is no ``resolve_cache_hit_alignment_tokens``).
- ``KpoolTailSpec`` (0.30–0.31 only) is not modelled by kvplan: a config holding one is
  refused (KVP501).
- Elastic serving: every name elastic mode patches, overrides or reads exists with 0.32's
  signature and meaning (compared release by release in docs/notes/elastic-0.29-0.31.md),
  except the start-up guard ``request_memory(init_snapshot, cache_config)``, defined in
  ``vllm.v1.worker.utils`` and imported by name into ``gpu_worker``, without 0.32's
  ``external_weight_memory`` (kvplan's handler reads it only when present).
"""

from __future__ import annotations

import dataclasses

from kvplan.integrations.vllm.versions._adapter import (
    PLACEMENT,
    EngineCorePlanning,
    VersionAdapter,
)
from kvplan.integrations.vllm.versions.v0_33 import ELASTIC_TARGETS as _ELASTIC_0_33
from kvplan.integrations.vllm.versions.v0_33 import TARGETS as _TARGETS_0_33
from kvplan.integrations.vllm.versions.v0_33 import _configs_0_32, _no_groups, retarget

V2_INIT = (
    "forward_context", "kv_cache_config", "device", "kernel_block_sizes", "vllm_config",
    "kv_cache_allocation_context", "*block_tables",
)  # fmt: skip
"""0.33's signature without the keyword-only ``attn_groups``."""

TARGETS = retarget(_TARGETS_0_33, V2_INIT)

ELASTIC_TARGETS = tuple(
    dataclasses.replace(t, params=("init_snapshot", "cache_config"))
    if t.qualname == "request_memory"
    else t
    for t in _ELASTIC_0_33
    if t.qualname != "CoreEngineProcManager.shutdown"
)
"""0.32's elastic targets; the start-up guard without ``external_weight_memory`` (0.29–0.31).
The API server's wait for an engine core stopping in order (``CoreEngineProcManager.shutdown``)
is 0.32's and 0.33's: its shutdown code was not checked on the older releases, whose servers
stop as vLLM stops them (the member left ``dead`` until reaped)."""

_NOT_IN_0_31: dict[str, dict[str, object]] = {
    "KVCacheConfig": {"hash_block_size": None, "cache_hit_alignment_tokens": None},
    "KVCacheSpec": {"is_draft": False},
    "MLAAttentionSpec": {"topk_buffer_width": None},
}
_NOT_IN_0_30: dict[str, dict[str, object]] = {
    "KVCacheConfig": {**_NOT_IN_0_31["KVCacheConfig"], "kv_tp_replicas": 1},
    "KVCacheSpec": {"is_draft": False, "dcp_sharded": False, "block_stride_alignment": None},
    # AttentionSpec's own default for dcp_sharded (it overrides KVCacheSpec's).
    "AttentionSpec": {"dcp_sharded": True, "max_tp_shards": None},
    "MLAAttentionSpec": {"topk_buffer_width": None},
    "SlidingWindowMLASpec": {"bounded_replay": False},
}

# -- engine core (kvplan inspect) -----------------------------------------------------------

ENGINE_CORE = EngineCorePlanning(_no_groups, _configs_0_32, resolves_hash_block_size=False)
"""0.30's and 0.31's ``EngineCore._initialize_kv_caches`` (see the module docstring)."""

ADAPTER = VersionAdapter(
    name="vllm-0.30-0.31",
    releases=("0.30", "0.31"),
    form=PLACEMENT,
    targets=TARGETS + ELASTIC_TARGETS,
    absent_fields={"0.30": _NOT_IN_0_30, "0.31": _NOT_IN_0_31},
    unmodelled_specs={
        "KpoolTailSpec": "a 0.30–0.31 attention spec (sliding window with retained tail "
        "tokens) whose geometry kvplan does not model",
    },
    engine_core={"0.30": ENGINE_CORE, "0.31": ENGINE_CORE},
    notes=__doc__ or "",
)
