"""How much KV address space an elastic engine reserves: a stable capacity, not free memory.

vLLM sizes the KV cache (its block count) from memory free at profile time: with several
engines on one device that measurement moves with every neighbour's maps and unmaps, the
start-up free-memory guard refuses a second engine, and the first to map wins. In elastic
mode the reservation is address space only — physical memory follows the blocks in use,
under the memory limit or the group's budget — so kvplan answers vLLM's "how much may the
KV cache take" itself (``Worker.determine_available_memory``, the CPU worker's too):

* ``KVPLAN_CAPACITY`` bytes per rank, or tokens (``65536t``, converted with the model's bytes
  per token: every KV-owning layer's page over its block size), when set;
* else the size vLLM was told (``--kv-cache-memory-bytes``; on the CPU build
  ``VLLM_CPU_KVCACHE_SPACE``, which ``KVPLAN_CAPACITY`` replaces);
* else device geometry minus the engine's own non-KV cost: on a GPU
  ``total × gpu_memory_utilization`` minus this process's peak torch memory after vLLM's
  profiling run (the CUDA context and NCCL buffers are not counted); on the CPU build the
  worker's requested memory minus its resident set, as vLLM computes it — without vLLM's
  "is that much free right now" check.

vLLM's own ``determine_available_memory`` still runs (warm-up, compilation, the profiling
forward pass), asked for a one-byte cache so its free-memory check cannot fire; its answer is
replaced. The GPU start-up guard (``request_memory``: free memory ≥ utilization × total) warns
instead of refusing in elastic mode.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from kvplan.integrations.vllm.elastic import _refusals as refusals
from kvplan.integrations.vllm.elastic._settings import ENV_CAPACITY, ElasticSettings
from kvplan.integrations.vllm.pipeline import Call, Runtime
from kvplan.schemas.errors import KVPlanError

logger = logging.getLogger("vllm.kvplan")

GUARD_MESSAGE = "Free memory on device"
"""How vLLM's start-up guard (``request_memory``) words its refusal."""


def bytes_per_token(worker: Any) -> int:
    """KV bytes one token takes on this rank: every KV-owning layer's page over its block
    size (KV-sharing layers own none), from the runner's own specs."""
    runner: Any = getattr(worker, "model_runner", None)
    specs = runner.get_kv_cache_spec() if hasattr(runner, "get_kv_cache_spec") else None
    if not specs:
        raise KVPlanError(
            refusals.elastic_unsupported(
                f"{ENV_CAPACITY} in tokens needs the runner's KV cache specs, which this "
                "worker does not give; give the capacity in bytes"
            )
        )
    total = 0.0
    for spec in specs.values():
        block = int(getattr(spec, "block_size", 0) or 0)
        if block > 0:
            total += int(spec.page_size_bytes) / block
    return max(1, math.ceil(total))


def _asked(settings: ElasticSettings, worker: Any) -> tuple[int | None, str]:
    if settings.capacity is not None:
        return settings.capacity, ENV_CAPACITY
    if settings.capacity_tokens is not None:
        per_token = bytes_per_token(worker)
        return settings.capacity_tokens * per_token, (
            f"{ENV_CAPACITY}={settings.capacity_tokens} tokens × {per_token} bytes"
        )
    return None, ""


def _sized_by_vllm(call: Call) -> int | None:
    """Run vLLM's ``determine_available_memory`` (warm-up, profiling run) asking for a
    one-byte cache, so none of its free-memory checks can fire; the size it was told before
    (``--kv-cache-memory-bytes``, ``VLLM_CPU_KVCACHE_SPACE``), or ``None``."""
    cache_config = call.arguments["self"].cache_config
    told = cache_config.kv_cache_memory_bytes
    cache_config.kv_cache_memory_bytes = 1
    try:
        call.run()
    finally:
        cache_config.kv_cache_memory_bytes = told
    return int(told) if told else None


def _capacity(
    settings: ElasticSettings,
    runtime: Runtime,
    call: Call,
    told_by: str,
    geometry: Callable[[Any], tuple[int, str]],
) -> int:
    """The reservation: ``KVPLAN_CAPACITY``, else the size vLLM was told (``told_by``), else
    ``geometry(worker)`` (bytes, where they come from)."""
    worker = call.arguments["self"]
    asked, source = _asked(settings, worker)
    told = _sized_by_vllm(call)
    if asked is None and told is not None:
        asked, source = told, told_by
    if asked is None:
        asked, source = geometry(worker)
    return _answer(runtime, asked, source)


def _cpu_geometry(worker: Any) -> tuple[int, str]:
    import os

    import psutil

    requested = int(getattr(worker, "requested_cpu_memory", 0))
    resident = int(psutil.Process(os.getpid()).memory_info().rss)
    return requested - resident, "the worker's requested memory minus its resident set"


def _gpu_geometry(worker: Any) -> tuple[int, str]:
    import torch

    requested = int(getattr(worker, "requested_memory", 0))
    peak = int(torch.cuda.max_memory_reserved(getattr(worker, "device", None)))
    return requested - peak, "total × gpu_memory_utilization minus this process's peak torch memory"


def cpu_capacity(settings: ElasticSettings, runtime: Runtime, call: Call) -> int:
    """``CPUWorker.determine_available_memory``: the CPU worker's reservation."""
    told_by = "VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes"
    return _capacity(settings, runtime, call, told_by, _cpu_geometry)


def gpu_capacity(settings: ElasticSettings, runtime: Runtime, call: Call) -> int:
    """``Worker.determine_available_memory``: a GPU worker's reservation."""
    return _capacity(settings, runtime, call, "--kv-cache-memory-bytes", _gpu_geometry)


def _answer(runtime: Runtime, capacity: int, source: str) -> int:
    if capacity <= 0:
        raise runtime.refuse(
            KVPlanError(
                refusals.elastic_unsupported(
                    f"the KV capacity ({source}) is {capacity} bytes; nothing to reserve"
                )
            )
        )
    logger.info(
        "kvplan: the KV cache reserves %d bytes of address space per rank (%s); physical "
        "memory follows the blocks in use",
        capacity, source,
    )  # fmt: skip
    return capacity


def memory_utilization(cache_config: Any) -> float:
    """The fraction of device memory vLLM was told to use: 0.34's
    ``resolved_gpu_memory_utilization`` (``gpu_memory_utilization`` may be ``None`` there:
    1.0 with vLLM's extensible KV cache, else 0.92), else the setting itself."""
    resolved = getattr(cache_config, "resolved_gpu_memory_utilization", None)
    if resolved is not None:
        return float(resolved)
    return float(cache_config.gpu_memory_utilization)


def request_memory(runtime: Runtime, call: Call) -> int:
    """``request_memory`` (the GPU worker's start-up guard): in elastic mode a device that is
    not free enough right now does not refuse the engine; its memory is the group's."""
    try:
        requested: int = call.run()
        return requested
    except ValueError as exc:
        if GUARD_MESSAGE not in str(exc):
            raise
        snapshot = call.arguments["init_snapshot"]
        cache_config = call.arguments["cache_config"]
        requested = math.ceil(snapshot.total_memory * memory_utilization(cache_config))
        external = int(call.arguments.get("external_weight_memory") or 0)
        logger.warning(
            "kvplan: %s; elastic mode reserves address space only, so the engine starts "
            "(physical KV memory is mapped as blocks are used, within its limit or group)",
            str(exc).split(". ")[0],
        )
        return requested - external if external > 0 else requested
