"""What a failed map becomes: running out of blocks (``docs/elastic.md``, "Under pressure").

The worker rolls its maps back and hands the failure over (:func:`hand_over`); the scheduler of
the same engine turns it into preemptions before vLLM reads the step's output
(:func:`recover_failed_map`), or the step is refused with ``KVP532`` where that cannot work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.elastic import _refusals as refusals
from kvplan.integrations.vllm.elastic._ops import ElasticOps, MapFailed

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
        scheduler.prev_step_scheduled_req_ids.discard(request.request_id)
    side.pool.evict_blocks(suspect)
    side.ceiling = side.ledger.mapped_bytes
    side.retry_at = now + side.settings.map_retry
    side.changed()
    side.recovered += 1
    first_problem = failed.error.diagnostics[0].message if failed.error.diagnostics else ""
    logger.warning(
        "kvplan: backing %d blocks of step %d failed (%s); its maps were rolled back, %d "
        "requests that used them are preempted and recomputed, and no new memory is mapped "
        "for %.1f s (as when vLLM runs out of blocks)",
        len(failed.blocks), failed.seq, first_problem, len(affected), side.settings.map_retry,
    )  # fmt: skip
    return list(affected)


def hand_over(
    sides: Iterable[SchedulerSide], worker: WorkerSide, ops: ElasticOps, failed: MapFailed
) -> None:
    """Give a failed map to this engine's scheduler (it preempts the requests that used the
    blocks before it reads the step's output; meanwhile unbacked pages read as scratch), or
    raise ``KVP532`` (the step is refused) when that cannot work."""
    scheduler = next((s for s in sides if s.sent.get(ops.seq) is ops), None)
    why = None
    if worker.settings.poison:
        why = "KVPLAN_POISON=1 makes the unbacked pages fault, so the step cannot run"
    elif scheduler is None:
        why = (
            "the scheduler runs in another process (multiprocess executor, e.g. tensor "
            "parallelism), which hears only one rank's output"
        )
    if why is not None:
        raise refusals.elastic_map_failed(
            worker.label, len(failed.blocks), failed.error, why
        ) from failed.error
    assert scheduler is not None
    scheduler.failed[failed.seq] = failed
