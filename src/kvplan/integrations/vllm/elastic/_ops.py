"""The transport: one step's memory operations, decided by the scheduler and carried on the
``SchedulerOutput`` to every rank, and the geometry fingerprint both sides compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvplan.schemas.errors import KVPlanError

if TYPE_CHECKING:
    from kvplan.elastic.ledger import Ledger

SCHEDULER_FIGURES = (
    "live_blocks", "cached_blocks", "limit_bytes", "cache_limit_bytes", "reserve_bytes",
    "floor_bytes", "asked_limit_bytes", "over_limit_preemptions",
)  # fmt: skip
"""The figures a worker reports from the scheduler's last :class:`ElasticOps`."""
SEQ_ATTR = "kvplan_elastic_seq"
"""The ``SchedulerOutput`` attribute with the last ``ElasticOps.seq`` sent when it was
scheduled: its output confirms the workers ran every operation up to it."""
OPS_ATTR = "kvplan_elastic"
"""The ``SchedulerOutput`` attribute that carries a step's :class:`ElasticOps`."""
SAMPLED_BLOCKS = 64
"""Blocks whose pages the geometry fingerprint compares (plus the first and last)."""


@dataclass(frozen=True)
class ElasticOps:
    """One step's memory operations, decided by the scheduler, applied by every worker.

    Plain ints and tuples: it is pickled to workers in other processes.
    """

    seq: int
    unmap: tuple[int, ...]
    """Blocks to unback first (free, without cache entries, since the step was scheduled)."""
    map: tuple[int, ...]
    """Blocks to back before the step runs (newly handed out)."""
    live_blocks: int
    cached_blocks: int
    limit_bytes: int
    cache_limit_bytes: int
    reserve_bytes: int
    mapped_bytes: int
    """What the scheduler's ledger counts as mapped after these operations."""
    digest: str
    """The scheduler's geometry fingerprint (see :func:`geometry_digest`)."""
    floor_bytes: int = 0
    """The smallest limit the engine accepts (null block + one longest request)."""
    asked_limit_bytes: int | None = None
    """The limit asked (``KVPLAN_MEMORY_LIMIT`` or ``kvplan limit``; ``None``: the default);
    ``limit_bytes`` is the one in force (never below the floor)."""
    over_limit_preemptions: int = 0
    """Requests preempted so far because blocks in use exceeded the effective limit (a lowered
    limit, another member's claim): :attr:`SchedulerSide.preempted`."""
    ahead: tuple[int, ...] = ()
    """Free blocks a busy engine backs ahead of need: each worker maps them on a thread of its
    own while the step runs, and joins that thread before its next operations (the next step's
    -- the scheduler always sends the step after one with ``ahead`` operations -- or an idle
    engine's), so they are resident before any step can use them."""

    def joins(self, ahead: tuple[int, ...]) -> tuple[int, ...]:
        """Of ``ahead`` (the previous operations' map ahead, which every rank joins before
        applying these), the blocks these operations keep: less their unmaps. With their maps,
        the blocks every rank holds after them and not before -- what every rank releases when
        any rank could not back them."""
        if not self.unmap:
            return ahead
        gone = set(self.unmap)
        return tuple(b for b in ahead if b not in gone)


def sampled_blocks(num_blocks: int) -> list[int]:
    if num_blocks <= 0:
        return []
    step = max(1, num_blocks // SAMPLED_BLOCKS)
    return sorted({*range(0, num_blocks, step), num_blocks - 1})


def geometry_digest(ledger: Ledger) -> str:
    """Chunk size, pool reservations and the chunks of sampled blocks, hashed: the scheduler
    and each worker compute it from their own plan and must agree."""
    import hashlib

    h = hashlib.sha256(f"{ledger.chunk_bytes};{ledger.reserved_bytes};".encode())
    h.update(f"{ledger.num_blocks};{ledger.pool_names}".encode())
    for b in sampled_blocks(ledger.num_blocks):
        h.update(f"{b}:{ledger.chunks(b)};".encode())
    return h.hexdigest()[:16]


class MapFailed(Exception):
    """Backing a step's new blocks failed on a worker; everything that map did was rolled
    back, so none of ``blocks`` is resident (the step itself was applied otherwise)."""

    def __init__(self, seq: int, blocks: tuple[int, ...], error: KVPlanError) -> None:
        super().__init__(str(error))
        self.seq = seq
        self.blocks = blocks
        self.error = error
        self.ranks: tuple[int, ...] = ()
        """The ranks (numbered as vLLM numbers them) whose own map failed (set when the ranks
        agreed)."""
