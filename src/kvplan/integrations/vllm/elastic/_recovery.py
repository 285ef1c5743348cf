"""What a failed map becomes: running out of blocks (``docs/elastic.md``, "Under pressure").

The worker rolls its maps back; with tensor or pipeline parallelism every rank learns, before
the forward, whether any rank failed, and the ranks that mapped roll back too
(:func:`agree_across_ranks`), so all hold what the scheduler will count. The failure then
reaches the scheduler one way, whichever executor runs the workers: as a
:class:`MapFailureReport` (:func:`report_failure`)
riding on the step's ``ModelRunnerOutput`` (:func:`with_report`, read back by
:func:`report_of`), the one object every vLLM executor brings back from the output rank. The
scheduler turns it into preemptions before vLLM reads that output (:func:`recover_failed_map`).
Only under ``KVPLAN_POISON=1`` (unbacked pages fault, the step cannot run) is the step refused
with ``KVP532``.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.elastic import _refusals as refusals
from kvplan.integrations.vllm.elastic._ops import MapFailed
from kvplan.schemas.errors import Code, KVPlanError, error

if TYPE_CHECKING:
    from kvplan.integrations.vllm.elastic._scheduler import SchedulerSide
    from kvplan.integrations.vllm.elastic._worker import WorkerSide

logger = logging.getLogger("vllm.kvplan")


def recover_failed_map(scheduler: Any, side: SchedulerSide, failed: MapFailed) -> list[str]:
    """A worker could not back step ``failed.seq``'s new blocks and rolled its maps back:
    make that running out of blocks, before vLLM reads the step's output. Returns the ids of
    the preempted requests.

    * The ledger unbacks exactly those blocks (the worker's state after its rollback).
    * Suspect blocks: the failed ones, then -- until nothing changes -- every block written
      since the failed step by a request holding a suspect block (its attention read the
      scratch page). Requests holding a suspect block are preempted the way vLLM's own
      ``reset_prefix_cache(reset_running_requests=True)`` does it, dropping the step's output
      (``drop_stale_output``), and the suspects' prefix-cache entries are evicted, so nothing
      computed from unbacked memory is ever returned or hit again. Requests that touched no
      suspect block ran correctly and keep their tokens.
    * No new memory is mapped for ``KVPLAN_MAP_RETRY`` seconds (the effective limit is what is
      mapped now): requests wait or are preempted as when vLLM runs out of blocks.
    """
    side.ledger.unback(failed.blocks)
    manager = scheduler.kv_cache_manager
    sizes = [int(g.kv_cache_spec.block_size) for g in scheduler.kv_cache_config.kv_cache_groups]
    suspect = {b for b in failed.blocks if b != 0}
    affected: dict[str, Any] = {}
    changed = True
    while changed:
        changed = False
        for request in scheduler.running:
            if request.request_id in affected:
                continue
            groups = manager.get_block_ids(request.request_id)
            if not any(b in suspect for ids in groups for b in ids):
                continue
            affected[request.request_id] = request
            changed = True
            # tokens computed before the failed step (later steps are in flight, not drained)
            start = max(0, request.num_computed_tokens - request.num_in_flight_tokens)
            for g, ids in enumerate(groups):
                first = start // sizes[g] if len(groups) == len(sizes) else 0
                suspect.update(b for b in ids[first:] if b != 0)
    now = time.monotonic()
    for request in reversed([r for r in scheduler.running if r.request_id in affected]):
        scheduler.running.remove(request)
        scheduler._preempt_request(request, now, drop_stale_output=True)
        # up to vLLM 0.33 the scheduler remembers the last step's requests (0.34 does not)
        previous = getattr(scheduler, "prev_step_scheduled_req_ids", None)
        if previous is not None:
            previous.discard(request.request_id)
    side.pool.evict_blocks(suspect)
    side.ceiling = side.ledger.mapped_bytes
    side.retry_at = now + side.settings.map_retry
    side.changed()
    side.recovered += 1
    first_problem = refusals.first_message(failed.error)
    logger.warning(
        "kvplan: backing %d blocks of step %d failed (%s); its maps were rolled back, %d "
        "requests that used them are preempted and recomputed, and no new memory is mapped "
        "for %.1f s (as when vLLM runs out of blocks)",
        len(failed.blocks), failed.seq, first_problem, len(affected), side.settings.map_retry,
    )  # fmt: skip
    return list(affected)


REPORT_ATTR = "kvplan_map_failed"
"""The ``ModelRunnerOutput`` attribute that carries a :class:`MapFailureReport`."""


@dataclass(frozen=True)
class MapFailureReport:
    """A failed map, as it travels from the workers to a scheduler in another process: plain
    fields (pickled with the step's output; no kvplan error classes inside)."""

    seq: int
    """The ``ElasticOps.seq`` of the step whose maps failed."""
    blocks: tuple[int, ...]
    """The step's new blocks: unbacked on every rank now."""
    ranks: tuple[int, ...]
    """The tensor-parallel ranks whose own map failed."""
    message: str
    """What the backend said (the first failing rank's problem, as this rank knows it)."""

    @classmethod
    def of(cls, failed: MapFailed, rank: int) -> MapFailureReport:
        """The report of ``failed`` as rank ``rank`` knows it (the agreed failing ranks, else
        itself)."""
        message = refusals.first_message(failed.error)
        return cls(failed.seq, tuple(failed.blocks), failed.ranks or (rank,), message)

    def failure(self) -> MapFailed:
        problem = error(
            Code.ELASTIC_MAP_FAILED,
            "elastic",
            f"backing the step's blocks failed on rank {', '.join(map(str, self.ranks))}: "
            f"{self.message}",
            "lower KVPLAN_MEMORY_LIMIT below the memory this device really has free",
        )
        return MapFailed(self.seq, self.blocks, KVPlanError(problem))


STEP_GROUPS = ("_TP", "_PCP", "_PP")
"""vLLM's process groups (``vllm.distributed.parallel_state``) that together hold every rank
of one engine's step, innermost first -- the order of vLLM's rank numbering (a rank is
``(pp * pcp_size + pcp) * tp_size + tp``). Data-parallel engines step on their own."""


def step_groups() -> list[Any]:
    """vLLM's groups of this worker with more than one rank, in :data:`STEP_GROUPS`' order."""
    try:
        from vllm.distributed import parallel_state
    except ImportError:  # pragma: no cover - vLLM is there whenever a worker steps
        return []
    found = (getattr(parallel_state, name, None) for name in STEP_GROUPS)
    return [g for g in found if g is not None and int(getattr(g, "world_size", 1)) > 1]


def failed_ranks(failed: bool, groups: list[Any]) -> tuple[int, ...]:
    """The ranks of one step (numbered as vLLM numbers them) whose own map failed, every
    rank told of every other: per group, innermost first, one all-reduce over the group's
    gloo ``cpu_group`` of a table with one row per member, each row what that member knows
    (gloo has a timeout, unlike the forward's collectives)."""
    import torch
    import torch.distributed as dist

    known = torch.tensor([int(failed)], dtype=torch.int32)
    for group in groups:
        table = torch.zeros((int(group.world_size), known.numel()), dtype=torch.int32)
        table[int(group.rank_in_group)] = known
        dist.all_reduce(table, op=dist.ReduceOp.SUM, group=group.cpu_group)
        known = table.flatten()
    return tuple(i for i, flag in enumerate(known.tolist()) if flag)


def agree_across_ranks(
    worker: WorkerSide,
    seq: int,
    blocks: tuple[int, ...],
    failed: MapFailed | None,
    groups: list[Any] | None = None,
) -> MapFailed | None:
    """Every rank of a tensor- or pipeline-parallel engine, before the step's forward, after
    applying operations ``seq`` (which map, or join a map ahead): did any rank fail?
    (:func:`failed_ranks`; every rank received the same operations, so every rank makes the
    same calls, in the step's order.) When one did, a rank whose own maps succeeded releases
    the step's ``blocks`` (``WorkerSide.step_blocks``: its new blocks and those mapped ahead
    that it joined, none of them in use before the step) -- the state the failing rank rolled
    back to -- and every rank returns the same failure: whichever rank's output reaches the
    scheduler (the last pipeline stage's) carries it. ``groups``: vLLM's
    ``GroupCoordinator``s (default: this process's, :func:`step_groups`)."""
    groups = groups if groups is not None else step_groups()
    if not groups:
        return failed
    ranks = failed_ranks(failed is not None, groups)
    if not ranks:
        return None
    if failed is None:  # a peer failed: undo this rank's maps of the step
        cache = worker.cache
        before = sum(cache.mapped_chunks.values())
        cache.release_blocks(blocks)
        worker.count["rollbacks"] += before - sum(cache.mapped_chunks.values())
        worker.touch()
        failed = MapFailed(seq, blocks, _peer_failure(worker.label, ranks))
    failed.ranks = ranks
    return failed


def _peer_failure(label: str, ranks: tuple[int, ...]) -> KVPlanError:
    return KVPlanError(
        error(
            Code.ELASTIC_MAP_FAILED,
            f"{label}.elastic",
            f"rank {', '.join(map(str, ranks))} could not back the step's blocks; {label} "
            "mapped them and rolled its maps back too",
            "lower KVPLAN_MEMORY_LIMIT below the memory this device really has free",
        )
    )


def report_failure(worker: WorkerSide, failed: MapFailed) -> MapFailureReport:
    """The report of a failed map that the step's output carries to the scheduler (the step
    runs meanwhile, its unbacked pages reading as scratch). Raises ``KVP532`` (the step is
    refused) under ``KVPLAN_POISON=1``, where unbacked pages fault."""
    if worker.settings.poison:
        why = "KVPLAN_POISON=1 makes the unbacked pages fault, so the step cannot run"
        raise refusals.elastic_map_failed(
            worker.label, len(failed.blocks), failed.error, why
        ) from failed.error
    return MapFailureReport.of(failed, int(worker.label.removeprefix("rank") or 0))


def with_report(output: Any, report: MapFailureReport) -> Any:
    """``output`` (a step's ``ModelRunnerOutput``, or vLLM's asynchronous wrapper of one)
    carrying ``report``: always on a copy (vLLM shares some outputs, e.g. its empty one)."""
    get_output = getattr(output, "get_output", None)
    if callable(get_output) and not hasattr(output, "req_ids"):  # AsyncModelRunnerOutput

        def reported() -> Any:
            return with_report(get_output(), report)

        output.get_output = reported
        return output
    carried = copy.copy(output)
    setattr(carried, REPORT_ATTR, report)
    return carried


def report_of(output: Any) -> MapFailureReport | None:
    """The failed-map report ``output`` carries, if any."""
    report = getattr(output, REPORT_ATTR, None)
    return report if isinstance(report, MapFailureReport) else None
