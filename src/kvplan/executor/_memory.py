"""Pool address spaces, chunk mapping and the undo journal that makes it transactional.

A pool's reservation is cut into chunks of ``chunk`` bytes (the last may be shorter, still
a granularity multiple). Chunk ``i`` covers bytes ``[i*chunk, min((i+1)*chunk, reserved))``
of the pool. Each chunk is one physical allocation and one mapping; access is granted (and
memory zeroed) once per contiguous run of newly mapped chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial

from kvplan.executor.backends.base import Backend, BackendCallError
from kvplan.schemas.errors import Code, KVPlanError, error
from kvplan.units import human_bytes


@dataclass
class PoolMemory:
    """One pool's reservation and the chunks mapped in it (offsets in bytes from ``address``)."""

    name: str
    size: int
    reserved: int
    address: int
    chunk: int
    mapped: set[int] = field(default_factory=set)
    refs: dict[int, int] = field(default_factory=dict)
    freed: bool = False
    """The reservation was given back (by ``BoundKVCache.close``)."""

    @property
    def num_chunks(self) -> int:
        return -(-self.reserved // self.chunk) if self.reserved else 0

    def span(self, chunk_id: int) -> tuple[int, int]:
        """``(offset, length)`` of chunk ``chunk_id``."""
        start = chunk_id * self.chunk
        return start, min(self.chunk, self.reserved - start)

    def mapped_bytes(self) -> int:
        """Bytes of the mapped chunks (O(1): only the last chunk may be shorter)."""
        if not self.mapped:
            return 0
        last = self.num_chunks - 1
        short = self.chunk - self.span(last)[1] if last in self.mapped else 0
        return len(self.mapped) * self.chunk - short


def runs(chunk_ids: Iterable[int]) -> Iterator[list[int]]:
    """Maximal runs of consecutive ids, in order: ``[1, 2, 5]`` → ``[1, 2]``, ``[5]``."""
    run: list[int] = []
    for c in sorted(chunk_ids):
        if run and c != run[-1] + 1:
            yield run
            run = []
        run.append(c)
    if run:
        yield run


_Undo = tuple[str, Callable[[], None]]
"""``(kind, action)``: what a journaled step undoes and how."""


class Transaction:
    """An undo journal: every successful primitive records its inverse; ``rollback`` replays.

    ``where`` is the primitive being attempted, for the error: ``(op, pool, offset, length)``.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._undo: list[_Undo | None] = []
        self.undone: dict[str, int] = {}
        """After :meth:`rollback`: how many steps of each kind it undid (``unmap``: chunks)."""
        self.where: tuple[str, str, int, int] = ("", "", 0, 0)

    def at(self, op: str, pool: str, offset: int, length: int) -> None:
        self.where = (op, pool, offset, length)

    def did(self, kind: str, action: Callable[[], None]) -> int:
        self._undo.append((kind, action))
        return len(self._undo) - 1

    def done(self, index: int) -> None:
        """The step at ``index`` needs no undo any more (e.g. a handle released after map)."""
        self._undo[index] = None

    def rollback(self) -> tuple[dict[str, int], list[str]]:
        """Undo everything, newest first; ``(counts per kind undone, errors)``."""
        pending = [u for u in self._undo if u is not None]
        self._undo.clear()
        counts: dict[str, int] = {}
        self.undone = counts
        errors: list[str] = []
        if any(kind == "unmap" for kind, _ in pending):
            try:
                self.backend.synchronize()
            except Exception as exc:
                errors.append(f"synchronize: {exc}")
        for kind, action in reversed(pending):
            try:
                action()
                counts[kind] = counts.get(kind, 0) + 1
            except Exception as exc:
                errors.append(f"{kind}: {exc}")
        return counts, errors


def map_chunks(
    backend: Backend, txn: Transaction, pool: PoolMemory, chunk_ids: Iterable[int]
) -> int:
    """Create, map and release one handle per chunk; grant access and zero per run.

    Returns the bytes mapped. Every step is journaled in ``txn``; the caller commits
    ``pool.mapped`` only after the whole transaction succeeds.
    """
    total = 0
    zero = not backend.fresh_memory_is_zero
    create, map_, release, unmap = backend.create, backend.map, backend.release, backend.unmap
    did, done = txn.did, txn.done
    name, base, chunk, reserved = pool.name, pool.address, pool.chunk, pool.reserved
    for run in runs(chunk_ids):
        first = run[0] * chunk
        for c in run:
            off = c * chunk
            length = min(chunk, reserved - off)
            op = "create"
            try:
                handle = create(length)
                rel = did("release", partial(release, handle))
                op = "map"
                map_(base + off, length, handle)
                did("unmap", partial(unmap, base + off, length))
                op = "release"
                release(handle)
                done(rel)
            except BaseException:
                txn.at(op, name, off, length)
                raise
        length = min((run[-1] + 1) * chunk, reserved) - first
        txn.at("set_access", name, first, length)
        backend.set_access(base + first, length)
        if zero:
            txn.at("zero", name, first, length)
            backend.zero(base + first, length)
        total += length
    return total


def failure(txn: Transaction, exc: BaseException, backend: Backend, action: str) -> BaseException:
    """Roll ``txn`` back; the exception to raise (``KVP402`` for a failed primitive)."""
    counts, errors = txn.rollback()
    undone = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "nothing to undo"
    tail = f" Rolled back: {undone}."
    if errors:
        tail += f" Rollback errors ({len(errors)}): {'; '.join(errors[:3])}."
    if isinstance(exc, BackendCallError):
        op, pool, offset, length = txn.where
        call = exc.call or backend.call_names.get(op, op)
        where = f"pool {pool!r} bytes [{offset}, {offset + length}) ({human_bytes(length)})"
        return KVPlanError(
            error(
                Code.DRIVER_CALL_FAILED,
                f"pools.{pool}" if pool else "backend",
                f"{call} failed during {action} on backend {backend.name!r}, {where}: "
                f"{exc.detail}.{tail}",
                "check free memory and the chunk size; nothing is left mapped or reserved",
            )
        )
    if errors and isinstance(exc, Exception):
        exc.add_note(tail.strip())
    return exc
