"""Mapping ahead of need: the scheduler side's decisions (``docs/elastic.md``, "Reclaim without
a step, and mapping ahead").

Two cases, one rule -- back free, uncached blocks at the front of vLLM's free queue (the ones
it hands out next), counted in the ledger at once, never beyond the effective limit (a
group's grant included):

* **an idle engine** refills its reserve (``KVPLAN_RESERVE``): :meth:`MappingAhead.map_ahead`,
  from the watcher's reclaim (``_reclaim``), the blocks sent to every rank between steps in
  the operations' ``map``;
* **a busy engine**, once a step that handed blocks out is scheduled, backs what its next
  step may take (:meth:`MappingAhead.ahead_target`): :meth:`MappingAhead.map_ahead_busy`,
  the blocks sent in the operations' ``ahead``, which every worker maps on a thread of its
  own while the step runs (``_worker``) -- where the backend maps beside the compute
  (``ElasticSettings.maps_ahead_busy``; host-vmm's maps would take the forward's CPU).

:class:`MappingAhead` is mixed into ``SchedulerSide``, whose state it reads.
"""

from __future__ import annotations

import logging
import time
from itertools import islice
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Iterable, Iterator

    from kvplan.elastic.ledger import Ledger
    from kvplan.integrations.vllm.elastic._settings import ElasticSettings

logger = logging.getLogger("vllm.kvplan")


class MappingAhead:
    """The scheduler side's mapping ahead (module doc); ``SchedulerSide`` holds the state."""

    ledger: Ledger
    settings: ElasticSettings
    pool: Any
    version: int
    reserve: int
    busy_reserve: int
    limit: int
    taken: deque[int]
    reserve_bytes: int
    ceiling: int | None
    group_failed: bool
    ahead_version: int
    ahead_retry_at: float
    busy_ahead: bool

    if TYPE_CHECKING:

        def reserve_yields(self) -> bool: ...
        def reserve_target(self) -> int: ...
        def headroom(self) -> int: ...
        def free_ids(self) -> Iterator[int]: ...
        def backed(self, block_ids: list[int]) -> None: ...
        def queue(
            self,
            *,
            mapped: Iterable[int] = (),
            unmapped: Iterable[int] = (),
            ahead: Iterable[int] = (),
        ) -> None: ...

    def wants_ahead(self) -> bool:
        """The reserve is short and the limit has room: an idle engine should map ahead
        (asked again only once the pool changed)."""
        if self.reserve <= self.reserve_bytes or self.ahead_version == self.version:
            return False
        if self.reserve_yields():
            return False
        if self.ceiling is not None or time.monotonic() < self.ahead_retry_at:
            return False
        cost = self.ledger.uniform_block_cost or self.ledger.max_block_cost
        return self.headroom() >= cost

    def map_ahead(self) -> list[int]:
        """Back free blocks ahead of need, up to the reserve (``KVPLAN_RESERVE``) and never
        beyond the effective limit (the group's grant included): the blocks at the front of
        vLLM's free queue, which it hands out next, so the next request's first blocks are
        backed before it arrives. The blocks join the next operations' maps (the idle
        engine's, sent to every rank between steps); vLLM's pool is not touched. The blocks
        backed."""
        from kvplan.elastic.ledger import admit

        self.ahead_version = self.version
        room = min(self.reserve - self.reserve_bytes, self.headroom())
        if room <= 0 or self.ceiling is not None:
            return []
        blocks = self.pool.blocks
        order = (b for b in self.free_ids() if b != 0 and blocks[b].block_hash is None)
        picks = [b for b in admit(self.ledger, order, room) if b not in self.ledger.backed]
        before = self.ledger.mapped_bytes
        self.backed(picks)
        self.reserve_bytes += self.ledger.mapped_bytes - before
        self.ahead_version = self.version
        return picks

    def ahead_failed(self, blocks: tuple[int, ...], why: str) -> None:
        """Mapping ahead failed on a rank (rolled back there; the ranks that mapped unmap
        again): the blocks are unbacked, nothing used them; no map ahead for
        ``KVPLAN_MAP_RETRY`` seconds."""
        before = self.ledger.mapped_bytes
        self.ledger.unback(blocks)
        self.reserve_bytes = max(0, self.reserve_bytes - (before - self.ledger.mapped_bytes))
        self.version += 1
        self.ahead_retry_at = time.monotonic() + self.settings.map_retry
        logger.warning(
            "kvplan: mapping %d blocks ahead failed (%s); nothing used them, the engine maps "
            "them when a step needs them and tries again in %.1f s",
            len(blocks), why, self.settings.map_retry,
        )  # fmt: skip

    def ahead_target(self) -> int:
        """Bytes a busy engine keeps backed at the front of vLLM's free queue: one step's
        worth -- the most one of its last steps took (the look is renewed after every step
        that hands blocks out) -- at least ``KVPLAN_RESERVE``, within ``KVPLAN_BUSY_RESERVE``
        and the limit. (Freed pages are kept up to twice that: ``reserve_target``.)"""
        if not self.taken:
            return self.reserve
        cost = self.ledger.uniform_block_cost or self.ledger.max_block_cost
        demand = max(self.taken) * cost
        return max(self.reserve, min(self.busy_reserve, demand, self.limit))

    def map_ahead_busy(self) -> None:
        """A busy engine's step is scheduled: back the free, uncached blocks among the next
        ones vLLM hands out (the front of its free queue), as many as :meth:`ahead_target`
        says the next step may take, never beyond the effective limit (the group's grant
        included: it asks the group for nothing). They go out in the operations' ``ahead``:
        every worker maps them on its own thread while this step runs and joins that thread
        before its next operations (``docs/elastic.md``, "Mapping ahead while busy"). Called
        after a step that handed blocks out (the front of the queue moved; blocks freed go to
        the front backed); not after a failed map (``KVPLAN_MAP_RETRY``), nor where the
        backend's maps would take the forward's own CPU (:attr:`busy_ahead`: off on host-vmm
        unless it emulates a device or ``KVPLAN_BUSY_AHEAD=1``)."""
        if not self.busy_ahead or self.ceiling is not None or self.group_failed:
            return
        ledger = self.ledger
        cost = ledger.uniform_block_cost or ledger.max_block_cost
        room = self.headroom()
        target = self.ahead_target() // cost if room >= cost else 0
        if target <= 0 or time.monotonic() < self.ahead_retry_at:
            return

        backed, blocks = ledger.backed, self.pool.blocks
        want: list[int] = []
        ready = 0  # free, uncached and backed already among them
        for b in islice(self.free_ids(), target):
            if blocks[b].block_hash is None:
                if b in backed:
                    ready += 1
                else:
                    want.append(b)
        if not want:
            return
        from kvplan.elastic.ledger import admit

        uniform = ledger.uniform_block_cost  # every unbacked block costs it: no walk to fit
        picks = want[: room // uniform] if uniform else admit(ledger, want, room)
        if not picks:
            return
        before = ledger.mapped_bytes
        self.queue(ahead=ledger.back(picks))
        self.reserve_bytes = ready * cost + ledger.mapped_bytes - before
        self.version += 1
