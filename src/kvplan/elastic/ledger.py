"""The elastic ledger: which chunks back which blocks, a byte budget, and what to give back.

Pure bookkeeping over a plan's page index (no torch, no vLLM, no driver), shared by the
scheduler side of elastic serving (which decides) and its tests. Terms:

* A **chunk** is one physical allocation of a pool: bytes ``[i*chunk, (i+1)*chunk)`` of the
  pool's reservation (the last chunk may be shorter), keyed ``(pool index, i)``.
* A block is **backed** when every chunk it touches (from the plan's page index, every layer
  and every pool) is mapped. Chunks are reference-counted by backed blocks; a chunk is mapped
  exactly while at least one backed block uses it. Workers keep the same counts per block, so
  scheduler and workers agree on every chunk without talking about chunks.
* The **budget** (``limit``) bounds mapped bytes. :meth:`Ledger.cost` is what backing one more
  block would map; :func:`admit` walks blocks in allocation order and takes those that fit.
* Giving memory back (:func:`trim`): a chunk can be unmapped only when every block using it is
  free; blocks that hold prefix-cache entries (*cached*) are kept up to ``cache_limit`` bytes,
  cheapest pages evicted first (fewest cached blocks, least recently freed), and free blocks
  without cache entries are kept backed up to ``reserve`` bytes so that mapping stays off the
  critical path; the rest is unbacked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from kvplan.planner.page_index import PageIndex, merge_ranges
from kvplan.schemas.plan import BindingPlan

Chunk = tuple[int, int]
"""``(pool index in plan order, chunk number)``."""


class ChunkListener(Protocol):
    def chunk_mapped(self, chunk: Chunk) -> None: ...

    def chunk_unmapped(self, chunk: Chunk) -> None: ...


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class Ledger:
    """Backed blocks and mapped chunks of one plan, with exact byte accounting.

    ``chunk_bytes``: the elastic mapping unit (a multiple of ``granularity``); each pool's
    reservation is its size rounded up to ``granularity``, as the executor reserves it.
    """

    def __init__(self, plan: BindingPlan, chunk_bytes: int, granularity: int | None = None) -> None:
        if chunk_bytes <= 0:
            raise ValueError("chunk_bytes must be positive")
        gran = granularity or chunk_bytes
        self.plan = plan
        self.chunk_bytes = chunk_bytes
        self.index = PageIndex(plan)
        self.num_blocks = self.index.num_blocks
        self.pool_names = [p.name for p in plan.pools]
        self._pool_of = {name: i for i, name in enumerate(self.pool_names)}
        self._reserved = [_round_up(p.size_bytes, gran) if p.size_bytes else 0 for p in plan.pools]
        self.reserved_bytes = sum(self._reserved)
        self._chunks: dict[int, tuple[Chunk, ...]] = {}
        self.refs: dict[Chunk, int] = {}
        self.users: dict[Chunk, set[int]] = {}
        self.backed: set[int] = set()
        self.mapped_bytes = 0
        self.peak_mapped_bytes = 0
        self._listener: ChunkListener | None = None

    def listen(self, listener: ChunkListener | None) -> None:
        """Tell ``listener`` about every chunk mapped or given back from now on (one
        listener; ``None`` stops). The admission index keeps itself current this way."""
        self._listener = listener

    # -- geometry -------------------------------------------------------------------------
    def chunk_size(self, chunk: Chunk) -> int:
        pool, i = chunk
        start = i * self.chunk_bytes
        return max(0, min(self.chunk_bytes, self._reserved[pool] - start))

    def chunks(self, block: int) -> tuple[Chunk, ...]:
        """The chunks ``block`` touches, in every pool (cached per block)."""
        found = self._chunks.get(block)
        if found is None:
            per_pool = self.index.block_chunks(block, self.chunk_bytes)
            found = tuple(
                (self._pool_of[name], c) for name, ids in per_pool.items() for c in sorted(ids)
            )
            self._chunks[block] = found
        return found

    def full_cost(self, block: int) -> int:
        """Bytes of every chunk ``block`` touches (mapped or not)."""
        return sum(self.chunk_size(c) for c in self.chunks(block))

    @cached_property
    def uniform_block_cost(self) -> int | None:
        """What backing any one block maps, when that is the same for every block and no two
        blocks share a chunk; ``None`` otherwise.

        Then admission is arithmetic: ``n`` unbacked blocks cost exactly ``n`` times this. The
        page index is affine in the block id (each view's rows shift by ``ratio * row_stride``
        per block), so it suffices that every view's per-block shift and its block-0 byte
        runs are chunk-aligned, that no view spans whole pools, and that every pool has the
        same block count (host-vmm's 4 KiB chunks under page-multiple layouts; not cuda-vmm's
        2 MiB chunks under 64 KiB pages, where neighbouring blocks share chunks).
        """
        chunk = self.chunk_bytes
        if any(p.num_blocks != self.num_blocks for p in self.plan.pools if p.size_bytes):
            return None
        for vr in self.index.views:
            if vr.whole:
                if vr.template:
                    return None
                continue
            if (vr.ratio * vr.row_stride) % chunk:
                return None
            runs = [
                (vr.base + r * vr.row_stride + lo, vr.base + r * vr.row_stride + hi)
                for r in range(min(vr.ratio, vr.rows))
                for lo, hi in vr.template
            ]
            if any(lo % chunk or hi % chunk for lo, hi in merge_ranges(runs)):
                return None
        if self.num_blocks < 2:
            return None
        first, last = (self.full_cost(b) for b in (1, self.num_blocks - 1))
        return first if first == last and first > 0 else None

    @cached_property
    def max_block_cost(self) -> int:
        """An upper bound of what backing one block maps (every chunk its pages can touch)."""
        chunk = self.chunk_bytes
        bound = 0
        for vr in self.index.views:
            if vr.whole:
                bound += sum((-(-(hi - lo) // chunk) + 1) * chunk for lo, hi in vr.template)
                continue
            runs = [
                (r * vr.row_stride + lo, r * vr.row_stride + hi)
                for r in range(min(vr.ratio, vr.rows))
                for lo, hi in vr.template
            ]
            bound += sum((-(-(hi - lo) // chunk) + 1) * chunk for lo, hi in merge_ranges(runs))
        return bound

    @property
    def total_chunk_bytes(self) -> int:
        """What backing every block would map: the reservation."""
        return self.reserved_bytes

    # -- accounting -----------------------------------------------------------------------
    def cost(self, block: int, pending: set[Chunk] | None = None) -> int:
        """Bytes backing ``block`` would newly map (chunks in ``pending`` count as mapped)."""
        if block in self.backed:
            return 0
        return sum(
            self.chunk_size(c)
            for c in self.chunks(block)
            if not self.refs.get(c) and (pending is None or c not in pending)
        )

    def back(self, blocks: Iterable[int]) -> list[int]:
        """Mark ``blocks`` backed; the ones that were not (their chunks are now counted)."""
        new = []
        backed, refs, users, listener = self.backed, self.refs, self.users, self._listener
        for b in blocks:
            if b in backed:
                continue
            backed.add(b)
            new.append(b)
            for c in self.chunks(b):
                n = refs.get(c, 0)
                if n == 0:
                    self.mapped_bytes += self.chunk_size(c)
                    users[c] = {b}
                    if listener is not None:
                        listener.chunk_mapped(c)
                else:
                    users[c].add(b)
                refs[c] = n + 1
        if self.mapped_bytes > self.peak_mapped_bytes:
            self.peak_mapped_bytes = self.mapped_bytes
        return new

    def unback(self, blocks: Iterable[int]) -> int:
        """Mark ``blocks`` unbacked; bytes of the chunks no backed block uses any more."""
        freed = 0
        for b in blocks:
            if b not in self.backed:
                continue
            self.backed.discard(b)
            for c in self.chunks(b):
                n = self.refs[c] - 1
                self.users[c].discard(b)
                if n:
                    self.refs[c] = n
                else:
                    del self.refs[c]
                    del self.users[c]
                    size = self.chunk_size(c)
                    self.mapped_bytes -= size
                    freed += size
                    if self._listener is not None:
                        self._listener.chunk_unmapped(c)
        return freed


def admit(
    ledger: Ledger, order: Iterable[int], headroom: int, wanted: int | None = None
) -> list[int]:
    """Blocks from ``order`` (allocation order) that fit in ``headroom`` bytes, greedily.

    A block that would map more than what is left is skipped (later blocks may still fit,
    e.g. backed ones). Stops after ``wanted`` blocks when given.
    """
    taken: list[int] = []
    pending: set[Chunk] = set()
    left = headroom
    for b in order:
        if wanted is not None and len(taken) >= wanted:
            break
        if b in ledger.backed:
            taken.append(b)
            continue
        new = [c for c in ledger.chunks(b) if not ledger.refs.get(c) and c not in pending]
        need = sum(ledger.chunk_size(c) for c in new)
        if need <= left:
            left -= need
            pending.update(new)
            taken.append(b)
    return taken


@dataclass(frozen=True)
class FreeBlock:
    """A free, backed block as the trimmer sees it."""

    block: int
    cached: bool
    """It holds prefix-cache entries (its KV may be hit again)."""
    age: int
    """Position in the free queue: lower = freed longer ago (evicted first)."""


@dataclass(frozen=True)
class TrimResult:
    evict: tuple[int, ...]
    """Cached blocks whose prefix-cache entries must be dropped (before unbacking)."""
    unback: tuple[int, ...]
    """Blocks to unback (all free, none cached once ``evict`` is done)."""
    cached_bytes: int
    """Bytes of chunks held only by free blocks with cache entries, after the trim."""
    reserve_bytes: int
    """Bytes of chunks held only by free blocks without cache entries, after the trim."""


def trim(
    ledger: Ledger,
    free: Sequence[FreeBlock],
    *,
    limit: int,
    cache_limit: int,
    reserve: int,
) -> TrimResult:
    """Give back what makes cached ≤ ``cache_limit``, reserve ≤ ``reserve`` and mapped ≤
    ``limit`` (as far as free blocks allow; blocks in use are never touched).

    ``free``: every backed, free block (the null block excluded); a page that a block not
    in ``free`` also uses (one in use, the null block) cannot be released. The ledger is
    updated (``unback``); the caller drops the cache entries of ``evict`` and unmaps
    ``unback`` on the workers.

    Where no two blocks share a chunk and every block costs the same
    (:attr:`Ledger.uniform_block_cost`: host-vmm's 4 KiB chunks), a page is a block's own and
    the same decisions are taken block by block (:func:`_trim_blocks`), not chunk by chunk:
    a step's trim reads a few free blocks instead of sixteen chunks each.
    """
    if ledger.uniform_block_cost is not None:
        return _trim_blocks(ledger, free, limit, cache_limit, reserve)
    info = {f.block: f for f in free}
    # chunks whose every user is free: releasable; split by whether a cached block uses them
    releasable: dict[Chunk, list[int]] = {}
    for f in free:
        for c in ledger.chunks(f.block):
            if c in releasable or c not in ledger.users:
                continue
            users = ledger.users[c]
            if all(u in info for u in users):
                releasable[c] = sorted(users)
    hashed = {c: sum(info[u].cached for u in us) for c, us in releasable.items()}
    size = ledger.chunk_size
    cached_bytes = sum(size(c) for c, n in hashed.items() if n)
    reserve_bytes = sum(size(c) for c, n in hashed.items() if not n)
    over = ledger.mapped_bytes - limit
    evicted: set[int] = set()

    def drop_cache(c: Chunk) -> None:
        nonlocal cached_bytes, reserve_bytes
        for u in releasable[c]:
            if not info[u].cached or u in evicted:
                continue
            evicted.add(u)
            for other in ledger.chunks(u):
                if hashed.get(other):
                    hashed[other] -= 1
                    if not hashed[other]:
                        cached_bytes -= size(other)
                        reserve_bytes += size(other)

    # 1. Cached pages over the cache limit, or needed to get under the budget: the pages
    #    with the fewest cached blocks first, then the least recently freed.
    for c in sorted(
        (c for c, n in hashed.items() if n),
        key=lambda c: (hashed[c], max(info[u].age for u in releasable[c]), c),
    ):
        if cached_bytes <= cache_limit and reserve_bytes >= over:
            break
        if hashed[c]:
            drop_cache(c)
    # 2. Uncached free pages over the reserve (less what the budget needs back). The free
    #    queue's front is reused first, so pages used by blocks near its back go first.
    keep = reserve if over <= 0 else max(0, min(reserve, reserve_bytes - over))
    unbacked: list[int] = []
    for c in sorted(
        (c for c, n in hashed.items() if not n),
        key=lambda c: (-min(info[u].age for u in releasable[c]), c),
    ):
        if reserve_bytes <= keep:
            break
        if c not in ledger.users:  # released already, with another page's blocks
            continue
        blocks = sorted(ledger.users[c])
        unbacked.extend(blocks)
        before = ledger.mapped_bytes
        ledger.unback(blocks)
        reserve_bytes -= before - ledger.mapped_bytes
    return TrimResult(tuple(sorted(evicted)), tuple(unbacked), cached_bytes, reserve_bytes)


def _trim_blocks(
    ledger: Ledger, free: Sequence[FreeBlock], limit: int, cache_limit: int, reserve: int
) -> TrimResult:
    """:func:`trim` where every block owns its chunks and costs
    :attr:`Ledger.uniform_block_cost`: each free backed block is one releasable page of that
    cost, cached or not. The order is :func:`trim`'s -- a page's key there is its block's
    age, then its first chunk -- so the result is the same (``tests/elastic/test_ledger.py``
    checks it against the chunk walk)."""
    cost = ledger.uniform_block_cost
    assert cost is not None
    chunks, backed = ledger.chunks, ledger.backed
    mine = [f for f in {f.block: f for f in free}.values() if f.block in backed]
    cached = {f.block for f in mine if f.cached}
    cached_bytes = cost * len(cached)
    reserve_bytes = cost * (len(mine) - len(cached))
    over = ledger.mapped_bytes - limit
    evicted: list[int] = []
    # 1. cached pages over the cache limit or the budget: least recently freed first
    for f in sorted((f for f in mine if f.cached), key=lambda f: (f.age, min(chunks(f.block)))):
        if cached_bytes <= cache_limit and reserve_bytes >= over:
            break
        evicted.append(f.block)
        cached_bytes -= cost
        reserve_bytes += cost
    # 2. uncached pages (those just evicted too) over the reserve: the queue's back first
    keep = reserve if over <= 0 else max(0, min(reserve, reserve_bytes - over))
    gone = set(evicted)
    unbacked: list[int] = []
    for f in sorted(
        (f for f in mine if not f.cached or f.block in gone),
        key=lambda f: (-f.age, min(chunks(f.block))),
    ):
        if reserve_bytes <= keep:
            break
        unbacked.append(f.block)
        reserve_bytes -= ledger.unback([f.block])
    return TrimResult(tuple(sorted(evicted)), tuple(unbacked), cached_bytes, reserve_bytes)
