"""What the scheduler's requests want and which of them go: functions over vLLM's scheduler
queues for :class:`~kvplan.integrations.vllm.elastic._scheduler.SchedulerSide` (a group ask's
need, the preemptions that bring an engine under its effective limit)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvplan.integrations.vllm.elastic._scheduler import SchedulerSide

logger = logging.getLogger("vllm.kvplan")


def demand_blocks(scheduler: Any) -> int:
    """Blocks the scheduler's requests may want in the next step, for a group ask: the
    prompts of the waiting requests the step could admit (up to ``max_num_seqs`` running, in
    the waiting queue's order) in every KV cache group, and one block per group for each
    running request (an upper bound: decode needs one every ``block_size`` tokens, a prefix
    hit needs none)."""
    config = getattr(scheduler, "kv_cache_config", None)
    sizes = [int(g.kv_cache_spec.block_size) for g in getattr(config, "kv_cache_groups", ())]
    if not sizes:
        return 0
    running = len(getattr(scheduler, "running", ()))
    demand = running * len(sizes)
    room = int(getattr(scheduler, "max_num_running_reqs", running + 1) or 0) - running
    for request in getattr(scheduler, "waiting", ()):
        if room <= 0:
            break
        room -= 1
        tokens = int(getattr(request, "num_tokens", 0)) + 1
        demand += sum(-(-tokens // size) for size in sizes)
    return demand


def preempt_over_limit(scheduler: Any, side: SchedulerSide) -> int:
    """Blocks in use are mapped above the effective limit (cached and free pages are given
    back already): preempt running requests, the newest first (the lowest priority under
    the priority policy), as vLLM's ``schedule`` does when it runs out of blocks, until what
    is mapped fits; each preemption frees its blocks, which :meth:`SchedulerSide.trim` gives
    back (their cache entries first, when the cache limit or the budget needs it).
    Preempted requests are recomputed later, from the prefix cache where it kept them. The
    number preempted."""
    running = scheduler.running
    priority = str(getattr(getattr(scheduler, "policy", None), "name", "")).upper() == "PRIORITY"
    limit = side.effective_limit()
    count = 0
    now = time.monotonic()
    while running and side.ledger.mapped_bytes > limit:
        if priority:
            request = max(running, key=lambda r: (r.priority, r.arrival_time))
            running.remove(request)
        else:
            request = running.pop()
        scheduler._preempt_request(request, now)
        discard = getattr(getattr(scheduler, "prev_step_scheduled_req_ids", None), "discard", None)
        if discard is not None:
            discard(request.request_id)
        count += 1
        side.changed()
        side.trim()
    if count:
        logger.info(
            "kvplan: %d requests preempted to get under the elastic limit of %d bytes "
            "(%d mapped)", count, limit, side.ledger.mapped_bytes,
        )  # fmt: skip
    return count
