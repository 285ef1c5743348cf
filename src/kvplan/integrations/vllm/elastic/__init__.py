"""Live elastic serving in vLLM: the scheduler decides, every worker maps, in step order.

On top of the pipeline (``kvplan.integrations.vllm.pipeline``, which it gives
:class:`ElasticMode`) and the pure elastic core (``kvplan.elastic``: the ledger, the stats and
limit files); never below them. Protocol (``docs/elastic.md``):

1. **Engine core** (one ``BlockPool`` per engine, global block ids). When the engine core
   forms the scheduler's config, kvplan keeps every rank's ``KVCacheConfig``; when the
   ``Scheduler`` is built, kvplan plans rank 0's config (the same pure planner the workers
   run), builds a :class:`~kvplan.elastic.ledger.Ledger` and turns the scheduler's block pool
   into an elastic one (``_pool``: its class is swapped for a subclass, same object). The pool
   counts as free only the blocks it can back within ``KVPLAN_MEMORY_LIMIT``, so vLLM's own
   admission makes requests wait or be preempted exactly as when it runs out of blocks
   (``_scheduler``). Before every ``schedule()`` it gives memory back
   (:func:`~kvplan.elastic.ledger.trim`).
2. **Transport** (``_ops``): after ``schedule()`` the step's :class:`ElasticOps` (blocks to
   unmap, then blocks to map) ride on the ``SchedulerOutput`` every rank receives, in order.
3. **Workers** (``_worker``): first thing in ``Worker.execute_model``, each rank unmaps, then
   maps, from the same plan — before vLLM zeroes, copies or runs anything in that step.
4. **Failures** (``_recovery``): a failed map is rolled back on the worker and becomes running
   out of blocks on the scheduler. **Stats** (``_stats``): ``rank<N>.stats.json``.

Unbacked memory reads as a scratch page (host-vmm: the zero page), never faults; with
``KVPLAN_POISON=1`` it faults instead (a test that no live block is ever unbacked).
"""

from __future__ import annotations

from kvplan.integrations.vllm.elastic._early import group_refusals
from kvplan.integrations.vllm.elastic._mode import (
    ElasticMode,
    engine_floor,
    scheduler_ledger,
)
from kvplan.integrations.vllm.elastic._ops import (
    OPS_ATTR,
    ElasticOps,
    MapFailed,
    geometry_digest,
    sampled_blocks,
)
from kvplan.integrations.vllm.elastic._pool import make_elastic, side_of
from kvplan.integrations.vllm.elastic._recovery import (
    MapFailureReport,
    agree_across_ranks,
    recover_failed_map,
    report_failure,
    report_of,
    with_report,
)
from kvplan.integrations.vllm.elastic._refusals import elastic_limit_too_small
from kvplan.integrations.vllm.elastic._scheduler import SchedulerSide
from kvplan.integrations.vllm.elastic._settings import (
    ElasticSettings,
    default_limits,
    elastic_chunk_bytes,
    read_elastic_settings,
)
from kvplan.integrations.vllm.elastic._stats import StatsReporter, engine_name
from kvplan.integrations.vllm.elastic._worker import (
    WorkerSide,
    attach_worker,
    detach_cache,
    worker_of,
    worker_side,
)

__all__ = [
    "OPS_ATTR",
    "ElasticMode",
    "ElasticOps",
    "ElasticSettings",
    "MapFailed",
    "MapFailureReport",
    "SchedulerSide",
    "StatsReporter",
    "WorkerSide",
    "agree_across_ranks",
    "attach_worker",
    "default_limits",
    "detach_cache",
    "elastic_chunk_bytes",
    "elastic_limit_too_small",
    "engine_floor",
    "engine_name",
    "geometry_digest",
    "group_refusals",
    "make_elastic",
    "read_elastic_settings",
    "recover_failed_map",
    "report_failure",
    "report_of",
    "sampled_blocks",
    "scheduler_ledger",
    "side_of",
    "with_report",
    "worker_of",
    "worker_side",
]
