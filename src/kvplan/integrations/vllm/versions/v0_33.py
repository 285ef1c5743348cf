"""vLLM 0.32–0.33: ``KVCacheConfig`` in the placement form, V1 and V2 runners.

Every function kvplan wraps has the same signature and the same allocation code in 0.32 and
0.33 (the V2 runner's ``initialize_kv_cache`` differs only in how it builds block tables,
after the call kvplan checks). 0.32's ``KVCacheSpec`` lacks ``is_draft`` and its
``MLAAttentionSpec`` lacks ``topk_buffer_width``. Neither release has 0.30–0.31's
``MLAAttentionSpec.storage_block_size``.
"""

from __future__ import annotations

from typing import Any

from kvplan.integrations.vllm.versions._adapter import (
    ALLOCATE,
    ELASTIC,
    HISPARSE,
    PLACEMENT,
    READ,
    RUNNER,
    STEP,
    TENSORS,
    V1,
    V2,
    EngineCorePlanning,
    Target,
    VersionAdapter,
)

# -- targets ------------------------------------------------------------------------------

_ALLOC = ("kv_cache_config", "device", "layout", "kernel_block_sizes")
_INIT = ("self", "kv_cache_config", "is_profiling", "kv_cache_allocation_context")
_V2_INIT = (
    "forward_context", "kv_cache_config", "device", "kernel_block_sizes", "vllm_config",
    "kv_cache_allocation_context", "*block_tables", "*attn_groups",
)  # fmt: skip

TARGETS = (
    Target(
        "vllm.v1.worker.utils", "allocate_kv_cache", _ALLOC, ALLOCATE,
        "the single KV-cache allocation point (definition)", "allocate",
    ),
    Target(
        "vllm.v1.worker.gpu_model_runner", "allocate_kv_cache", _ALLOC, ALLOCATE,
        "imported by name by the V1 runner", "allocate", V1,
    ),
    Target(
        "vllm.v1.worker.gpu.attn_utils", "allocate_kv_cache", _ALLOC, ALLOCATE,
        "imported by name by the V2 runner's init_kv_cache", "allocate", V2,
    ),
    Target(
        "vllm.v1.hisparse.binding", "allocate_kv_cache", _ALLOC, HISPARSE,
        "imported by name by HiSparse (refused: kvplan does not plan HiSparse)",
        "refuse-hisparse",
    ),
    Target(
        "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_kv_cache", _INIT, RUNNER,
        "V1 runner entry: owner of the cache and is_profiling", "runner-entry", V1,
        ("initialize_kv_cache_tensors",),
    ),
    Target(
        "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_kv_cache_tensors",
        ("self", "kv_cache_config", "kernel_block_sizes", "kv_cache_allocation_context"),
        TENSORS, "V1: runner.shared_kv_cache_layers; vLLM's alias loop is checked",
        "v1-tensors", V1, ("allocate_kv_cache", "shared_kv_cache_layers"),
    ),
    Target(
        "vllm.v1.worker.gpu.model_runner", "GPUModelRunner.initialize_kv_cache", _INIT, RUNNER,
        "V2 runner entry: owner of the cache and is_profiling", "runner-entry", V2,
        ("init_kv_cache",),
    ),
    Target(
        "vllm.v1.worker.gpu.attn_utils", "init_kv_cache", _V2_INIT, TENSORS,
        "V2: get_shared_kv_cache_layers(vllm_config); vLLM's alias loop is checked",
        "v2-init", V2, ("allocate_kv_cache", "get_shared_kv_cache_layers"),
    ),
    Target(
        "vllm.v1.worker.gpu.model_runner", "init_kv_cache", _V2_INIT, TENSORS,
        "imported by name by the V2 runner", "v2-init", V2,
        ("allocate_kv_cache", "get_shared_kv_cache_layers"),
    ),
    Target(
        "vllm.v1.worker.gpu.attn_utils", "get_shared_kv_cache_layers", ("vllm_config",), READ,
        "the V2 sharing map (read, not patched)",
    ),
    Target(
        "vllm.v1.worker.gpu_worker", "Worker.execute_model", ("self", "scheduler_output"),
        STEP, "a worker's step: the KV caches vLLM holds are still kvplan's (elastic: every "
        "rank maps the step's blocks first)", "step", None, ("execute_model",),
    ),
)  # fmt: skip

ELASTIC_TARGETS = (  # the block lifecycle of 0.32-0.33 (0.29-0.31: v0_31.ELASTIC_TARGETS)
    Target(
        "vllm.v1.worker.gpu_worker", "request_memory",
        ("init_snapshot", "cache_config", "external_weight_memory"), ELASTIC,
        "elastic: the start-up free-memory guard warns instead of refusing (the KV cache "
        "reserves address space; physical memory is the limit's or the group's)",
        "elastic/request-memory",
    ),
    Target(
        "vllm.v1.worker.gpu_worker", "Worker.determine_available_memory", ("self",),
        ELASTIC, "elastic: the KV reservation from a stable capacity, not free memory",
        "elastic/capacity-gpu", None, ("kv_cache_memory_bytes",),
    ),
    Target(
        "vllm.v1.worker.cpu_worker", "CPUWorker.determine_available_memory", ("self",),
        ELASTIC, "elastic: the CPU worker's KV reservation from a stable capacity "
        "(KVPLAN_CAPACITY in the role of VLLM_CPU_KVCACHE_SPACE)",
        "elastic/capacity-cpu", None, ("kv_cache_memory_bytes",),
    ),
    Target(
        "vllm.v1.executor.abstract", "Executor.__init__", ("self", "vllm_config"), ELASTIC,
        "elastic: what the engine's config alone refuses (an engine on several nodes in a "
        "group), before the executor starts a worker (the engine core loads plugins in its "
        "own __init__: too late to wrap that)", "elastic/executor-init", None,
        ("_init_executor",),
    ),
    Target(
        "vllm.v1.engine.core", "EngineCore._initialize_kv_caches", ("self", "vllm_config"),
        ELASTIC, "elastic: the engine's config, so the memory limit is checked against the "
        "floor before the KV cache is allocated and the model compiled",
        "elastic/initialize-kv-caches", None,
        ("generate_scheduler_kv_cache_config", "initialize_from_config"),
    ),
    Target(
        "vllm.v1.engine.core", "EngineCore.shutdown", ("self",), ELASTIC,
        "elastic: the workers stopped, this process's caches closed, then the engine "
        "leaves its group", "elastic/shutdown", None, ("shutdown",),
    ),
    Target(
        "vllm.v1.engine.utils", "CoreEngineProcManager.shutdown", ("self", "timeout"),
        ELASTIC, "elastic: the API server gives its engine core a few seconds to stop its "
        "workers and leave its group (vLLM's default, --shutdown-timeout 0, kills it at once)",
        "elastic/engine-processes-shutdown", None, ("shutdown",),
    ),
    Target(
        "vllm.v1.engine.core", "generate_scheduler_kv_cache_config", ("kv_cache_configs",),
        ELASTIC, "elastic: every rank's KVCacheConfig, before the scheduler is built",
        "elastic/rank-configs",
    ),
    Target(
        "vllm.v1.core.sched.scheduler", "Scheduler.__init__",
        ("self", "vllm_config", "kv_cache_config", "structured_output_manager", "block_size",
         "hash_block_size", "mm_registry", "include_finished_set", "log_stats"),
        ELASTIC, "elastic: the block pool becomes elastic (ledger, budget)",
        "elastic/scheduler-init", None, ("KVCacheManager",),
    ),
    Target(
        "vllm.v1.core.sched.scheduler", "Scheduler.schedule", ("self", "throttle_prefills"),
        ELASTIC, "elastic: give memory back before, attach the step's map/unmap after",
        "elastic/schedule",
    ),
    Target(
        "vllm.v1.worker.gpu_worker", "Worker.sample_tokens", ("self", "grammar_output"),
        ELASTIC, "elastic: a failed map's report rides on the step's output to a scheduler "
        "in another process", "elastic/sample-tokens", None, ("sample_tokens",),
    ),
    Target(
        "vllm.v1.engine.core", "EngineCoreProc._handle_client_request",
        ("self", "request_type", "request"), ELASTIC,
        "elastic: the busy loop wakes for kvplan's reclaim of an idle engine (memory given "
        "back without a step) and runs it on its own thread", "elastic/client-request",
    ),
    Target(
        "vllm.v1.core.sched.scheduler", "Scheduler.update_from_output",
        ("self", "scheduler_output", "model_runner_output"),
        ELASTIC, "elastic: a step whose maps failed preempts the requests that used them",
        "elastic/update-from-output", None, ("drop_stale_output", "num_stale_output_tokens"),
    ),
)  # fmt: skip


def retarget(
    targets: tuple[Target, ...],
    init_params: tuple[str, ...],
    *,
    allocate_handler: str | None = None,
) -> tuple[Target, ...]:
    """0.33's ``targets`` for an older release whose V2 ``init_kv_cache`` takes
    ``init_params`` (same handler and calls) and, if given, whose ``allocate_kv_cache``
    sites run the handler named ``allocate_handler``."""
    import dataclasses

    out = []
    for target in targets:
        if target.qualname == "init_kv_cache":
            target = dataclasses.replace(target, params=init_params)
        elif target.role == ALLOCATE and allocate_handler is not None:
            target = dataclasses.replace(target, handler=allocate_handler)
        out.append(target)
    return tuple(out)


def _groups_0_33(vllm_config: Any, kv_cache_specs: list[Any]) -> Any:
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups

    groups = get_global_kv_cache_groups(vllm_config, kv_cache_specs)
    vllm_config.adjust_dcp_kv_cache_interleave_size(groups)
    return groups


def _configs_0_33(
    vllm_config: Any, kv_cache_specs: list[Any], memory: list[int], groups: Any
) -> list[Any]:
    from vllm.v1.core.kv_cache_planning import get_kv_cache_configs

    return list(get_kv_cache_configs(vllm_config, kv_cache_specs, memory, groups))


def _no_groups(vllm_config: Any, kv_cache_specs: list[Any]) -> Any:
    return None


def _configs_0_32(
    vllm_config: Any, kv_cache_specs: list[Any], memory: list[int], groups: Any
) -> list[Any]:
    # 0.32 forms the global groups inside get_kv_cache_configs (kv_cache_utils); typed as
    # Any: the type checker sees the project's vLLM 0.33, where it moved.
    import importlib

    utils: Any = importlib.import_module("vllm.v1.core.kv_cache_utils")
    return list(utils.get_kv_cache_configs(vllm_config, kv_cache_specs, memory))


ADAPTER = VersionAdapter(
    name="vllm-0.32-0.33",
    releases=("0.32", "0.33"),
    form=PLACEMENT,
    targets=TARGETS + ELASTIC_TARGETS,
    absent_fields={
        "0.32": {
            "KVCacheSpec": {"is_draft": False},
            "MLAAttentionSpec": {"topk_buffer_width": None, "storage_block_size": None},
        },
        "0.33": {"MLAAttentionSpec": {"storage_block_size": None}},
    },
    engine_core={
        "0.32": EngineCorePlanning(_no_groups, _configs_0_32),
        "0.33": EngineCorePlanning(_groups_0_33, _configs_0_33),
    },
    notes=__doc__ or "",
)
