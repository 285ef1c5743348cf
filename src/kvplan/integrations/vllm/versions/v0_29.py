"""vLLM 0.29: the first placement-form release; no HiSparse, no host-resident pools.

Compared from the released wheel's sources against 0.33 (see docs/integration.md):

- ``allocate_kv_cache``: same signature; every tensor gets ``kv_cache_config.num_blocks``
  (there is no ``KVCacheConfig.num_blocks_of``) and every layer is viewed (there is no
  ``has_layer_views``). Both agree with kvplan's 0.33 geometry for every config 0.29 can
  build: without ``KVCacheTensor.host_resident`` every tensor has ``num_blocks`` blocks, and
  every 0.29 spec has per-layer views (the view-less HiSparse specs do not exist). There is
  no ``storage_block_size``.
- V1 ``initialize_kv_cache_tensors``: same signature; ``bind_kv_cache`` gets the dict itself
  (no kernel-block mapping, no ``kv_cache_groups``). The returned dict is
  ``allocate_kv_cache``'s plus the alias loop, checked against the plan as in 0.33.
- V2 ``init_kv_cache(runner_kv_caches, forward_context, kv_cache_config, device,
  kernel_block_sizes, vllm_config, kv_cache_allocation_context=None)``: an extra leading
  list it fills via ``bind_kv_cache``, no keyword-only parameters, no HiSparse branch; it
  returns the allocated dict plus the aliases of ``get_shared_kv_cache_layers``.
- No ``vllm.v1.hisparse`` package: there is no HiSparse allocation site to refuse.
- Engine core (``kvplan inspect``, read from 0.29's ``EngineCore._initialize_kv_caches``): as
  0.32's -- ``get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory)`` in
  ``kv_cache_utils`` forms the global groups itself -- except two steps: the global block
  size is the smallest of *every* group's (0.30 and later skip groups that are not prefix
  cacheable, such as ``CircularBufferSpec``), and nothing resolves ``hash_block_size`` /
  ``cache_hit_alignment_tokens`` into the configs (the fields do not exist; the engine core
  computes the hash block size for its scheduler only).
- Fields: ``KVCacheConfig`` lacks ``hash_block_size``, ``cache_hit_alignment_tokens``,
  the ``hisparse_*`` fields and ``kv_tp_replicas``; ``KVCacheTensor`` lacks
  ``host_resident``; ``KVCacheGroupSpec`` lacks ``host_resident`` and ``role``; specs lack
  ``is_draft``, ``dcp_sharded``, ``block_stride_alignment``, ``max_tp_shards``, MLA
  ``topk_buffer_width``, ``cache_role`` and ``is_index_group_leader``,
  ``SlidingWindowMLASpec.bounded_replay`` and ``MambaSpec.prefill_checkpoint_alignment``
  (the differential suite's MLA round trip on the 0.29 engine venv checks this list).
- Elastic serving: as 0.30–0.31 (their elastic targets: ``request_memory`` without
  ``external_weight_memory``). ``BlockPool`` differs from 0.32 only in code kvplan's pool
  overrides call through (no reuse watchers, no owning pool per block). The offline ``LLM``
  has no finalizer (0.31 added one), so deleting it does not shut its engine core down: the
  KV cache stays bound, and the elastic ``closed`` snapshot unwritten, until
  ``llm.llm_engine.engine_core.shutdown()`` or the process exits -- as vanilla keeps its own.
"""

from __future__ import annotations

from kvplan.integrations.vllm.versions import v0_31, v0_33
from kvplan.integrations.vllm.versions._adapter import (
    HISPARSE,
    PLACEMENT,
    EngineCorePlanning,
    VersionAdapter,
)

V2_INIT = ("runner_kv_caches", *(p for p in v0_31.V2_INIT if not p.startswith("*")))
"""``init_kv_cache`` of 0.29: 0.31's with ``runner_kv_caches`` first and no keyword-only
parameters."""

TARGETS = v0_33.retarget(
    tuple(t for t in v0_33.TARGETS if t.role != HISPARSE),
    V2_INIT,
    allocate_handler="allocate/all-views",  # 0.29's specs have no has_layer_views
)


# -- engine core (kvplan inspect) -----------------------------------------------------------


ENGINE_CORE = EngineCorePlanning(
    v0_33._no_groups,
    v0_33._configs_0_32,  # kv_cache_utils.get_kv_cache_configs(vllm_config, specs, memory), as 0.32
    block_size_of_cacheable_groups=False,
    resolves_hash_block_size=False,
)
"""0.29's ``EngineCore._initialize_kv_caches`` (see the module docstring)."""

ADAPTER = VersionAdapter(
    name="vllm-0.29",
    releases=("0.29",),
    form=PLACEMENT,
    targets=TARGETS + v0_31.ELASTIC_TARGETS,
    absent_fields={
        "0.29": {
            "KVCacheConfig": {
                "hash_block_size": None,
                "cache_hit_alignment_tokens": None,
                "hisparse_host_num_blocks": None,
                "hisparse_host_block_stride": None,
                "hisparse_shared_host_pool": False,
                "kv_tp_replicas": 1,
            },
            "KVCacheTensor": {"host_resident": False},
            "KVCacheGroupSpec": {"host_resident": False, "role": "DEFAULT"},
            "KVCacheSpec": {
                "is_draft": False,
                "dcp_sharded": False,
                "block_stride_alignment": None,
            },
            "AttentionSpec": {"dcp_sharded": True, "max_tp_shards": None},
            "MLAAttentionSpec": {
                "topk_buffer_width": None,
                "storage_block_size": None,
                "cache_role": "SPARSE",
                "is_index_group_leader": False,
            },
            "SlidingWindowMLASpec": {"bounded_replay": False},
            "MambaSpec": {"prefill_checkpoint_alignment": None},
        },
    },
    engine_core={"0.29": ENGINE_CORE},
    notes=__doc__ or "",
)
