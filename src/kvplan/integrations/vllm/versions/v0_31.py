"""vLLM 0.29–0.31: the placement form, but wrapped functions kvplan was not written for.

Compared from the released wheels' sources against 0.33 (see docs/integration.md). kvplan
refuses these releases and names each difference; supporting one means an adapter whose
handlers and planner geometry follow that code.
"""

from __future__ import annotations

from kvplan.integrations.vllm.versions._adapter import PLACEMENT, Difference, RefusedReleases

_STORAGE_BLOCK = Difference(
    "vllm.v1.worker.utils.allocate_kv_cache",
    "an MLAAttentionSpec with storage_block_size overrides the kernel block size of its views "
    "(kvplan's geometry follows 0.33, which has no storage_block_size)",
    ("0.30", "0.31"),
)
_NUM_BLOCKS = Difference(
    "vllm.v1.worker.utils.allocate_kv_cache",
    "every tensor gets kv_cache_config.num_blocks and layers without views are reshaped too "
    "(0.29; 0.33 uses num_blocks_of(tensor) and binds view-less layers to the raw buffer)",
    ("0.29",),
)
_V2_NO_ATTN_GROUPS = Difference(
    "vllm.v1.worker.gpu.attn_utils.init_kv_cache",
    "no attn_groups parameter: the V2 runner binds the allocated tensors without mapping them "
    "to kernel blocks (signature differs from 0.33's)",
    ("0.30", "0.31"),
)
_V2_RUNNER_CACHES = Difference(
    "vllm.v1.worker.gpu.attn_utils.init_kv_cache",
    "takes runner_kv_caches, has no attn_groups and no HiSparse branch (signature differs "
    "from 0.33's)",
    ("0.29",),
)
_V1_NO_KERNEL_MAP = Difference(
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner.initialize_kv_cache_tensors",
    "binds the layers without map_kv_caches_to_kernel_blocks (what vLLM's dict holds differs "
    "from 0.33)",
    ("0.29", "0.30", "0.31"),
)

REFUSED = RefusedReleases(
    releases=("0.29", "0.30", "0.31"),
    form=PLACEMENT,
    differences=(
        _STORAGE_BLOCK,
        _NUM_BLOCKS,
        _V2_NO_ATTN_GROUPS,
        _V2_RUNNER_CACHES,
        _V1_NO_KERNEL_MAP,
    ),
)
