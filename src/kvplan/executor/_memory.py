"""Pool address spaces, chunk mapping and the undo journal that makes it transactional.

A pool's reservation is cut into chunks of ``chunk`` bytes (the last may be shorter, still
a granularity multiple). Chunk ``i`` covers bytes ``[i*chunk, min((i+1)*chunk, reserved))``
of the pool. Each chunk is one physical allocation and one mapping; access is granted (and
memory zeroed) once per contiguous run of newly mapped chunks.

Memory does not grow with a pool's size: the mapped chunks of a pool are kept as runs
(:class:`ChunkSet`), and the journal holds one entry per run mapped, not one per chunk.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial

from kvplan.executor.backends.base import Backend, BackendCallError
from kvplan.schemas.errors import Code, KVPlanError, error
from kvplan.units import human_bytes


class ChunkSet:
    """A set of chunk ids kept as sorted, disjoint, non-adjacent runs ``[start, stop)``.

    Memory is O(runs): an eagerly mapped pool of any size is one run. Membership is a
    binary search; adding or removing an id touches the runs around it.
    """

    __slots__ = ("_count", "_starts", "_stops")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []
        self._count = 0
        self.update(ids)

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, chunk_id: object) -> bool:
        if not isinstance(chunk_id, int):
            return False
        i = bisect_right(self._starts, chunk_id) - 1
        return i >= 0 and chunk_id < self._stops[i]

    def __iter__(self) -> Iterator[int]:
        """Every id, ascending (lazily: a run is never expanded into a list)."""
        for start, stop in list(zip(self._starts, self._stops, strict=True)):
            yield from range(start, stop)

    def runs(self) -> list[range]:
        return [range(a, b) for a, b in zip(self._starts, self._stops, strict=True)]

    def add_range(self, start: int, stop: int) -> None:
        """Add ``[start, stop)``, merging with every run it touches."""
        if stop <= start:
            return
        lo = bisect_left(self._stops, start)  # first run ending at or after start
        hi = bisect_right(self._starts, stop)  # runs starting at or before stop
        if lo < hi:
            start = min(start, self._starts[lo])
            stop = max(stop, self._stops[hi - 1])
            self._count -= sum(
                b - a for a, b in zip(self._starts[lo:hi], self._stops[lo:hi], strict=True)
            )
        self._starts[lo:hi] = [start]
        self._stops[lo:hi] = [stop]
        self._count += stop - start

    def update(self, ids: Iterable[int]) -> None:
        """Add ``ids`` (a ``range`` of step 1 is added as one run, without iterating it)."""
        if isinstance(ids, range) and ids.step == 1:
            self.add_range(ids.start, ids.stop)
            return
        for run in runs(ids):
            self.add_range(run[0], run[-1] + 1)

    def discard(self, chunk_id: int) -> None:
        i = bisect_right(self._starts, chunk_id) - 1
        if i < 0 or chunk_id >= self._stops[i]:
            return
        start, stop = self._starts[i], self._stops[i]
        self._count -= 1
        if start == chunk_id and stop == chunk_id + 1:
            del self._starts[i], self._stops[i]
        elif start == chunk_id:
            self._starts[i] = chunk_id + 1
        elif stop == chunk_id + 1:
            self._stops[i] = chunk_id
        else:
            self._stops[i] = chunk_id
            self._starts.insert(i + 1, chunk_id + 1)
            self._stops.insert(i + 1, stop)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ChunkSet):
            return self._starts == other._starts and self._stops == other._stops
        if isinstance(other, set | frozenset):
            return len(other) == self._count and all(c in self for c in other)
        return NotImplemented

    def __repr__(self) -> str:
        shown = ", ".join(f"{a}-{b - 1}" if b - a > 1 else str(a) for a, b in self.runs()[:8])
        return f"ChunkSet({shown}{', ...' if len(self._starts) > 8 else ''})"


@dataclass
class PoolMemory:
    """One pool's reservation and the chunks mapped in it (offsets in bytes from ``address``)."""

    name: str
    size: int
    reserved: int
    address: int
    chunk: int
    mapped: ChunkSet = field(default_factory=ChunkSet)
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


def runs(chunk_ids: Iterable[int]) -> Iterator[range]:
    """Maximal runs of consecutive ids, in order: ``[1, 2, 5]`` → ``range(1, 3)``,
    ``range(5, 6)``. A ``range`` of step 1 is one run as it is (never sorted or listed)."""
    if isinstance(chunk_ids, range) and chunk_ids.step == 1:
        if chunk_ids:
            yield chunk_ids
        return
    start = stop = -1  # ids are >= 0: no run yet
    for c in sorted(set(chunk_ids)):
        if c == stop:
            stop += 1
            continue
        if stop > start:
            yield range(start, stop)
        start, stop = c, c + 1
    if stop > start:
        yield range(start, stop)


class _MappedRun:
    """The undo of one run being mapped: unmap its chunks ``[first, done)``, newest first.

    One journal entry per run, whatever its length; :meth:`steps` yields one action per
    chunk when the journal is replayed."""

    __slots__ = ("base", "chunk", "done", "first", "reserved", "unmap")

    def __init__(
        self, unmap: Callable[[int, int], None], base: int, chunk: int, reserved: int, first: int
    ) -> None:
        self.unmap, self.base, self.chunk, self.reserved = unmap, base, chunk, reserved
        self.first = self.done = first

    def steps(self) -> Iterator[Callable[[], None]]:
        for c in range(self.done - 1, self.first - 1, -1):
            off = c * self.chunk
            yield partial(self.unmap, self.base + off, min(self.chunk, self.reserved - off))


class _WholeRun:
    """The undo of a run a :class:`~kvplan.executor.backends.base.RunMapping` backend mapped
    in one call: one ``unmap_run``, counted as the run's chunks."""

    __slots__ = ("action", "weight")

    def __init__(self, action: Callable[[], None], chunks: int) -> None:
        self.action, self.weight = action, chunks

    def steps(self) -> Iterator[Callable[[], None]]:
        yield self.action


_Undo = tuple[str, Callable[[], None] | _MappedRun | _WholeRun]
"""``(kind, action)``: what a journaled step undoes and how (a run: one action per chunk)."""


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

    def run(self, step: _MappedRun | _WholeRun) -> None:
        """Journal a run being mapped; it undoes what it has mapped so far."""
        self._undo.append(("unmap", step))

    def done(self, index: int) -> None:
        """The step at ``index`` needs no undo any more (e.g. a handle released after map);
        the newest step is dropped, so a journal of repeated steps does not grow."""
        if index == len(self._undo) - 1:
            self._undo.pop()
        else:
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
        for kind, entry in reversed(pending):
            actions: Iterable[Callable[[], None]] = (entry,) if callable(entry) else entry.steps()
            weight = entry.weight if isinstance(entry, _WholeRun) else 1
            for action in actions:
                try:
                    action()
                    counts[kind] = counts.get(kind, 0) + weight
                except Exception as exc:
                    errors.append(f"{kind}: {exc}")
        return counts, errors


def run_span(pool: PoolMemory, run: range) -> tuple[int, int]:
    """``(offset, length)`` of a run of chunks of ``pool`` (only the last may be short)."""
    first = run[0] * pool.chunk
    return first, min((run[-1] + 1) * pool.chunk, pool.reserved) - first


def map_chunks(
    backend: Backend, txn: Transaction, pool: PoolMemory, chunk_ids: Iterable[int]
) -> int:
    """Create, map and release one handle per chunk; grant access and zero per run (a
    backend that maps runs, ``maps_runs``, backs each run in one ``map_run``).

    Returns the bytes mapped. Every step is journaled in ``txn``; the caller commits
    ``pool.mapped`` only after the whole transaction succeeds.
    """
    if backend.maps_runs:
        return _map_runs(backend, txn, pool, chunk_ids)
    total = 0
    zero = not backend.fresh_memory_is_zero
    create, map_, release, unmap = backend.create, backend.map, backend.release, backend.unmap
    did, done = txn.did, txn.done
    name, base, chunk, reserved = pool.name, pool.address, pool.chunk, pool.reserved
    for run in runs(chunk_ids):
        first = run[0] * chunk
        step = _MappedRun(unmap, base, chunk, reserved, run[0])
        txn.run(step)
        for c in run:
            off = c * chunk
            length = min(chunk, reserved - off)
            op = "create"
            try:
                handle = create(length)
                rel = did("release", partial(release, handle))
                op = "map"
                map_(base + off, length, handle)
                step.done = c + 1
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


def _map_runs(
    backend: Backend, txn: Transaction, pool: PoolMemory, chunk_ids: Iterable[int]
) -> int:
    map_run, unmap_run = backend.map_run, backend.unmap_run  # type: ignore[attr-defined]
    zero = not backend.fresh_memory_is_zero
    total = 0
    for run in runs(chunk_ids):
        off, length = run_span(pool, run)
        txn.at("map_run", pool.name, off, length)
        map_run(pool.address + off, length)
        txn.run(_WholeRun(partial(unmap_run, pool.address + off, length), len(run)))
        if zero:
            txn.at("zero", pool.name, off, length)
            backend.zero(pool.address + off, length)
        total += length
    return total


def unmap_calls(backend: Backend, run: range) -> list[range]:
    """The pieces of a run of mapped chunks that one unmap call each gives back: the whole
    run on a backend that maps runs, else one chunk a call."""
    return [run] if backend.maps_runs else [range(c, c + 1) for c in run]


def unmap_piece(backend: Backend, pool: PoolMemory, piece: range) -> int:
    """Unmap one piece of :func:`unmap_calls` (its chunks mapped) and mark its chunks
    unmapped; its bytes. A failed call raises ``BackendCallError`` and changes nothing."""
    off, length = run_span(pool, piece)
    if backend.maps_runs:
        backend.unmap_run(pool.address + off, length)  # type: ignore[attr-defined]
    else:
        backend.unmap(pool.address + off, length)
    for c in piece:
        pool.mapped.discard(c)
    return length


def unmap_chunks(backend: Backend, pool: PoolMemory, chunk_ids: Iterable[int]) -> int:
    """Unmap the mapped ones of ``chunk_ids``, ascending, in as few calls as the backend
    allows; the bytes unmapped. A failed call raises ``BackendCallError``; what it did not
    reach stays mapped."""
    freed = 0
    for run in runs(c for c in chunk_ids if c in pool.mapped):
        for piece in unmap_calls(backend, run):
            freed += unmap_piece(backend, pool, piece)
    return freed


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
