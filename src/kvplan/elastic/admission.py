"""Admission under a binding budget without walking vLLM's free queue: an incremental index.

:func:`kvplan.elastic.ledger.admit` answers "which free blocks fit in ``headroom`` bytes" by
walking the free queue. When blocks share chunks (cuda-vmm's 2 MiB chunks under 64 KiB
pages) that walk is the only exact answer for the queue's order, and it costs 21-133 ms
per change of the pool at 16k-100k blocks. :class:`AdmissionIndex` answers the same
question for an order of its own in O(log n) per call and per pool event:

* **zero-cost blocks** first — free blocks whose every chunk is mapped (backed free blocks,
  and unbacked ones whose chunks other blocks map): those *without* prefix-cache entries in
  vLLM's free-queue order, then
* **unbacked blocks that map memory**, by ascending block id, taken while the union of
  their new chunks fits the headroom and **stopping at the first that does not**, then
* zero-cost blocks *with* prefix-cache entries, in vLLM's free-queue order (vLLM's LRU:
  cached KV is evicted last, as :func:`admit` over vLLM's queue does while memory fits).

Zero-cost blocks are always taken, so the count is ``zero-cost + k`` where ``k`` is the
longest run of costly blocks (ascending id) whose new chunks fit. Every chunk not mapped
is charged to the lowest block id that touches it; then the new chunks of the costly blocks
up to id ``x`` cost exactly the prefix sum of those charges up to ``x`` (every block that
touches an unmapped chunk is free and unbacked: blocks in use are backed). Two Fenwick
trees over block ids (charges, and which blocks are costly) give ``k`` by one descent.

This is :func:`admit` over :meth:`AdmissionIndex.order` except that ``admit`` would go on
past the first costly block that does not fit and take later ones that happen to; the index
stops (its count is a prefix of ``admit``'s picks over that order). With uniform ledgers
(every block owns its chunks, one cost) both are the same.

Events the index is told (:class:`AdmissionIndex` methods; the pool subclass calls them):
blocks entering vLLM's free queue (:meth:`appended`, :meth:`prepended`), leaving it
(:meth:`removed`: handed out or hit), gaining or losing prefix-cache entries
(:meth:`cached`, :meth:`evicted`); backing and unbacking reach it from the ledger itself
(:meth:`~kvplan.elastic.ledger.Ledger.listen`: one call per chunk that is mapped or given
back). No torch, no vLLM.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from kvplan.elastic.ledger import Chunk, Ledger


class Fenwick:
    """Prefix sums over ``n`` non-negative integers: add, prefix, and two descents."""

    def __init__(self, values: Sequence[int]) -> None:
        n = len(values)
        tree = [0] * (n + 1)
        for i, v in enumerate(values, 1):
            tree[i] += v
            j = i + (i & -i)
            if j <= n:
                tree[j] += tree[i]
        self.n = n
        self.tree = tree
        self.top = 1 << max(0, n.bit_length() - 1) if n else 0

    def add(self, i: int, delta: int) -> None:
        tree, n = self.tree, self.n
        i += 1
        while i <= n:
            tree[i] += delta
            i += i & -i

    def prefix(self, count: int) -> int:
        """Sum of the first ``count`` values."""
        tree = self.tree
        total = 0
        while count > 0:
            total += tree[count]
            count -= count & -count
        return total

    def longest_within(self, bound: int) -> int:
        """The largest ``count`` whose prefix sum is at most ``bound`` (values >= 0)."""
        tree, n = self.tree, self.n
        pos = 0
        step = self.top
        while step:
            nxt = pos + step
            if nxt <= n and tree[nxt] <= bound:
                pos = nxt
                bound -= tree[nxt]
            step >>= 1
        return pos

    def kth(self, k: int) -> int:
        """Index of the ``k``-th unit (1-based ``k``) of 0/1 values."""
        tree, n = self.tree, self.n
        pos = 0
        step = self.top
        while step:
            nxt = pos + step
            if nxt <= n and tree[nxt] < k:
                pos = nxt
                k -= tree[nxt]
            step >>= 1
        return pos


@dataclass(frozen=True)
class _Track:
    """One byte run of every block in one pool: block ``b`` touches bytes
    ``[start + b*shift, start + b*shift + length)`` (clipped to the pool), ``b < blocks``."""

    pool: int
    start: int
    length: int
    shift: int
    blocks: int
    size: int
    first: int
    """Lowest chunk id it touches."""
    last: int
    """Highest chunk id it touches."""


def _interval(t: _Track, b: int, chunk: int) -> tuple[int, int] | None:
    s = t.start + b * t.shift
    e = s + t.length
    s, e = max(s, 0), min(e, t.size)
    if s >= e:
        return None
    return s // chunk, (e - 1) // chunk


def _users(t: _Track, c: int, chunk: int) -> tuple[int, int] | None:
    """The blocks ``[lo, hi]`` of track ``t`` that touch chunk ``c``."""
    x = min((c + 1) * chunk, t.size)  # start < x
    y = c * chunk  # end > y
    a, length, d = t.start, t.length, t.shift
    if d > 0:
        lo = (y - a - length) // d + 1
        hi = -((a - x) // d) - 1
    elif d < 0:
        d = -d
        lo = (a - x) // d + 1
        hi = -((y - a - length) // d) - 1
    else:
        if not (a < x and a + length > y):
            return None
        lo, hi = 0, t.blocks - 1
    lo, hi = max(lo, 0), min(hi, t.blocks - 1)
    return (lo, hi) if lo <= hi else None


def _tracks(ledger: Ledger) -> tuple[list[_Track], dict[int, set[int]]]:
    """The ledger's page index as tracks, and the chunks every block touches (whole views)."""
    tracks: list[_Track] = []
    everyone: dict[int, set[int]] = {}
    chunk = ledger.chunk_bytes
    sizes = ledger.index.pool_sizes
    pool_of = {name: i for i, name in enumerate(ledger.pool_names)}
    for vr in ledger.index.views:
        p = pool_of[vr.pool]
        size = sizes[vr.pool]
        if vr.whole:
            for lo, hi in vr.template:
                s, e = max(lo, 0), min(hi, size)
                if s < e:
                    everyone.setdefault(p, set()).update(range(s // chunk, (e - 1) // chunk + 1))
            continue
        for k in range(min(vr.ratio, vr.rows)):
            blocks = -(-(vr.rows - k) // vr.ratio)
            for lo, hi in vr.template:
                if hi <= lo or blocks <= 0:
                    continue
                draft = _Track(
                    p, vr.base + k * vr.row_stride + lo, hi - lo, vr.ratio * vr.row_stride,
                    blocks, size, 0, 0,
                )  # fmt: skip
                ends = [_interval(draft, 0, chunk), _interval(draft, blocks - 1, chunk)]
                if ends[0] is None or ends[1] is None:  # a validated plan's rows lie in the pool
                    raise ValueError(f"view {vr.layer}: rows outside pool {vr.pool}")
                first = min(ends[0][0], ends[1][0])
                last = max(ends[0][1], ends[1][1])
                tracks.append(
                    _Track(draft.pool, draft.start, draft.length, draft.shift, blocks, size,
                           first, last)
                )  # fmt: skip
    return tracks, everyone


class AdmissionIndex:
    """Free blocks that fit a headroom, in the index's order (see the module docstring).

    ``free_order``: vLLM's free queue now, front first; ``cached``: the free blocks that hold
    prefix-cache entries. The index listens to ``ledger`` from now on (backing, unbacking).
    """

    def __init__(
        self, ledger: Ledger, free_order: Iterable[int], cached: Iterable[int] = ()
    ) -> None:
        self.ledger = ledger
        n = self.num_blocks = ledger.num_blocks
        self.chunk = ledger.chunk_bytes
        self.tracks, self.everyone = _tracks(ledger)
        covered = max((t.blocks for t in self.tracks), default=0)
        if any(self.everyone.values()):
            covered = n
        self.covered = min(covered, n)
        """Blocks ``[0, covered)`` touch at least one chunk; the others none."""
        by_pool: dict[int, list[_Track]] = {}
        for t in sorted(self.tracks, key=lambda t: (t.pool, t.first)):
            by_pool.setdefault(t.pool, []).append(t)
        self._by_pool = by_pool
        self._firsts = {p: [t.first for t in ts] for p, ts in by_pool.items()}
        self._reach: dict[int, list[int]] = {}
        for p, ts in by_pool.items():
            reach, far = [], -1
            for t in ts:
                far = max(far, t.last)
                reach.append(far)
            self._reach[p] = reach
        self._nchunks = [-1] * n
        self._plain = [(t.pool, t.start, t.length, t.shift, t.blocks, t.size) for t in self.tracks]
        self.mapped = [0] * n
        """Per block: how many of its chunks are mapped."""
        self.free = [False] * n
        self.is_cached = [False] * n
        self.seq = [0] * n
        self.head = 0
        self.tail = 0
        self.nfree = 0
        self.ncostly = 0
        self._heaps: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], [])
        # charges: every chunk not mapped, to its lowest user
        mapped_chunks = set(ledger.refs)
        charges = [0] * n
        for chunk_id, low in self._lowest_users().items():
            if chunk_id not in mapped_chunks:
                charges[low] += ledger.chunk_size(chunk_id)
        self.charges = Fenwick(charges)
        self.costly = Fenwick([0] * n)
        for c in mapped_chunks:
            self._count_mapped(c, +1)  # nothing is free yet: counts only
        cached_set = set(cached)
        costly = [0] * n
        for b in free_order:
            self.free[b] = True
            self.seq[b] = self.tail
            self.tail += 1
            self.is_cached[b] = b in cached_set
            self.nfree += 1
            if self.zero_cost(b):
                self._heaps[self.is_cached[b]].append((self.seq[b], b))
            else:
                costly[b] = 1
        self.ncostly = sum(costly)
        self.costly = Fenwick(costly)
        for heap in self._heaps:
            heapq.heapify(heap)
        ledger.listen(self)

    # -- geometry -----------------------------------------------------------------------------
    def _lowest_users(self) -> dict[Chunk, int]:
        """Every chunk some block touches, with the lowest block id that touches it."""
        chunk = self.chunk
        low: dict[Chunk, int] = {}
        for p, ids in self.everyone.items():
            if self.covered:
                for c in ids:
                    low[(p, c)] = 0
        for t in self.tracks:
            span = t.last - t.first + 1
            if span <= t.blocks:  # fewer chunks than blocks: ask each chunk
                for c in range(t.first, t.last + 1):
                    users = _users(t, c, chunk)
                    if users is not None:
                        key = (t.pool, c)
                        if users[0] < low.get(key, 1 << 62):
                            low[key] = users[0]
            elif t.shift > 0:  # chunks grow with the block id: one sweep
                seen = t.first - 1
                pool = t.pool
                for b in range(t.blocks):
                    iv = _interval(t, b, chunk)
                    if iv is None or iv[1] <= seen:
                        continue
                    for c in range(max(iv[0], seen + 1), iv[1] + 1):
                        key = (pool, c)
                        if b < low.get(key, 1 << 62):
                            low[key] = b
                    seen = iv[1]
            else:
                for b in range(t.blocks):
                    iv = _interval(t, b, chunk)
                    if iv is None:
                        continue
                    for c in range(iv[0], iv[1] + 1):
                        key = (t.pool, c)
                        if b < low.get(key, 1 << 62):
                            low[key] = b
        return low

    def _block_intervals(self, b: int) -> dict[int, list[tuple[int, int]]]:
        per_pool: dict[int, list[tuple[int, int]]] = {}
        if not 0 <= b < self.covered:
            return per_pool
        for p, ids in self.everyone.items():
            per_pool.setdefault(p, []).extend((c, c) for c in ids)
        chunk = self.chunk
        for t in self.tracks:
            if b < t.blocks:
                iv = _interval(t, b, chunk)
                if iv is not None:
                    per_pool.setdefault(t.pool, []).append(iv)
        return per_pool

    def block_chunks(self, b: int) -> set[Chunk]:
        """The chunks block ``b`` touches (what :meth:`Ledger.chunks` says, by arithmetic)."""
        return {
            (p, c)
            for p, ivs in self._block_intervals(b).items()
            for lo, hi in ivs
            for c in range(lo, hi + 1)
        }

    def nchunks(self, b: int) -> int:
        """How many chunks block ``b`` touches (cached)."""
        found = self._nchunks[b]
        if found >= 0:
            return found
        found = 0
        if 0 <= b < self.covered:
            chunk = self.chunk
            ivs: list[tuple[int, int, int]] = [
                (p, c, c) for p, ids in self.everyone.items() for c in ids
            ]
            for pool, start, length, shift, blocks, size in self._plain:
                if b < blocks:
                    s = start + b * shift
                    e = s + length
                    s = 0 if s < 0 else s
                    e = size if e > size else e
                    if s < e:
                        ivs.append((pool, s // chunk, (e - 1) // chunk))
            ivs.sort()
            pool_at, end = -1, -1
            for pool, lo, hi in ivs:
                if pool != pool_at:
                    pool_at, end = pool, -1
                if hi > end:
                    found += hi - max(lo, end + 1) + 1
                    end = hi
        self._nchunks[b] = found
        return found

    def users(self, c: Chunk) -> list[tuple[int, int]]:
        """The blocks that touch chunk ``c``, as sorted disjoint ``[lo, hi]`` ranges."""
        p, i = c
        ranges: list[tuple[int, int]] = []
        if i in self.everyone.get(p, ()) and self.covered:
            return [(0, self.covered - 1)]
        tracks = self._by_pool.get(p)
        if tracks:
            j = bisect_right(self._firsts[p], i) - 1
            reach = self._reach[p]
            while j >= 0 and reach[j] >= i:
                t = tracks[j]
                if t.last >= i:
                    found = _users(t, i, self.chunk)
                    if found is not None:
                        ranges.append(found)
                j -= 1
        if len(ranges) < 2:
            return ranges
        ranges.sort()
        merged = [ranges[0]]
        for lo, hi in ranges[1:]:
            if lo <= merged[-1][1] + 1:
                if hi > merged[-1][1]:
                    merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        return merged

    # -- state --------------------------------------------------------------------------------
    def zero_cost(self, b: int) -> bool:
        """Whether every chunk of ``b`` is mapped (backing it maps nothing)."""
        m = self.mapped[b]
        if m == 0:
            return b >= self.covered
        return m == self.nchunks(b)

    def _count_mapped(self, c: Chunk, delta: int) -> None:
        """Chunk ``c`` was mapped (+1) or given back (-1): its users' counts, and which free
        blocks are costly."""
        mapped, free, costly = self.mapped, self.free, self.costly
        nchunks = self.nchunks
        for lo, hi in self.users(c):
            end = hi + 1
            after = [v + delta for v in mapped[lo:end]]
            mapped[lo:end] = after
            window = free[lo:end]
            if True not in window:
                continue
            # zero-cost exactly when every chunk is mapped: became (+1) or stopped being (-1)
            edge = 0 if delta > 0 else -1
            for i in [i for i, f in enumerate(window) if f]:
                b = lo + i
                if after[i] - nchunks(b) != edge:
                    continue
                if delta > 0:
                    costly.add(b, -1)
                    self.ncostly -= 1
                    self._push(b)
                else:
                    costly.add(b, 1)
                    self.ncostly += 1

    def _push(self, b: int) -> None:
        heap = self._heaps[self.is_cached[b]]
        heapq.heappush(heap, (self.seq[b], b))
        if len(heap) > 2 * self.nfree + 1024:
            self._compact(heap, self.is_cached[b])

    def _valid(self, entry: tuple[int, int], cached: bool) -> bool:
        seq, b = entry
        return (
            self.free[b]
            and self.seq[b] == seq
            and self.is_cached[b] == cached
            and self.zero_cost(b)
        )

    def _compact(self, heap: list[tuple[int, int]], cached: bool) -> None:
        kept = list({e for e in heap if self._valid(e, cached)})
        heapq.heapify(kept)
        heap[:] = kept

    def _enter(self, b: int, seq: int, cached: bool) -> None:
        if self.free[b]:
            self._leave(b)
        self.free[b] = True
        self.seq[b] = seq
        self.is_cached[b] = cached
        self.nfree += 1
        if self.zero_cost(b):
            self._push(b)
        else:
            self.costly.add(b, 1)
            self.ncostly += 1

    def _leave(self, b: int) -> None:
        self.free[b] = False
        self.nfree -= 1
        if not self.zero_cost(b):
            self.costly.add(b, -1)
            self.ncostly -= 1

    # -- events (the pool subclass calls these) --------------------------------------------
    def appended(self, blocks: Iterable[int], cached: Iterable[int] = ()) -> None:
        """``blocks`` entered vLLM's free queue at its back, in this order; ``cached``: those
        of them that hold prefix-cache entries."""
        hashed = set(cached)
        for b in blocks:
            self._enter(b, self.tail, b in hashed)
            self.tail += 1

    def prepended(self, blocks: Sequence[int], cached: Iterable[int] = ()) -> None:
        """``blocks`` entered vLLM's free queue at its front (``blocks[0]`` first)."""
        hashed = set(cached)
        base = self.head - len(blocks)
        for i, b in enumerate(blocks):
            self._enter(b, base + i, b in hashed)
        self.head = base

    def removed(self, blocks: Iterable[int]) -> None:
        """``blocks`` left vLLM's free queue (handed out, or hit by the prefix cache)."""
        for b in blocks:
            if self.free[b]:
                self._leave(b)

    def cached(self, blocks: Iterable[int]) -> None:
        """``blocks`` gained prefix-cache entries."""
        self._mark(blocks, True)

    def evicted(self, blocks: Iterable[int]) -> None:
        """``blocks`` lost their prefix-cache entries."""
        self._mark(blocks, False)

    def _mark(self, blocks: Iterable[int], cached: bool) -> None:
        for b in blocks:
            if self.is_cached[b] != cached:
                self.is_cached[b] = cached
                if self.free[b] and self.zero_cost(b):
                    self._push(b)

    # ledger listener
    def chunk_mapped(self, c: Chunk) -> None:
        low = self._low(c)
        if low is not None:
            self.charges.add(low, -self.ledger.chunk_size(c))
        self._count_mapped(c, +1)

    def chunk_unmapped(self, c: Chunk) -> None:
        low = self._low(c)
        if low is not None:
            self.charges.add(low, self.ledger.chunk_size(c))
        self._count_mapped(c, -1)

    def _low(self, c: Chunk) -> int | None:
        found = self.users(c)
        return found[0][0] if found else None

    # -- queries ------------------------------------------------------------------------------
    def costly_fitting(self, headroom: int) -> int:
        """How many costly blocks (ascending id) fit ``headroom`` before the first that does
        not."""
        if headroom < 0 or not self.ncostly:
            return 0
        return self.costly.prefix(self.charges.longest_within(headroom))

    def count(self, headroom: int) -> int:
        """How many free blocks can be handed out within ``headroom`` bytes (O(log n))."""
        return self.nfree - self.ncostly + self.costly_fitting(headroom)

    def _front(self, cached: bool, n: int, out: list[int]) -> None:
        heap = self._heaps[cached]
        popped: list[tuple[int, int]] = []
        seen: set[int] = set()
        while heap and len(out) < n:
            entry = heapq.heappop(heap)
            if entry[1] in seen or not self._valid(entry, cached):
                continue
            seen.add(entry[1])
            popped.append(entry)
            out.append(entry[1])
        for entry in popped:
            heapq.heappush(heap, entry)

    def pick(self, n: int, headroom: int) -> list[int]:
        """The first ``n`` blocks :meth:`count` counts, in the index's order (fewer when
        fewer fit): zero-cost uncached ones by queue order, then costly ones by id, then
        cached zero-cost ones by queue order. O((n + garbage) log n)."""
        out: list[int] = []
        self._front(False, n, out)
        if len(out) < n:
            take = min(n - len(out), self.costly_fitting(headroom))
            out.extend(self.costly.kth(k) for k in range(1, take + 1))
        if len(out) < n:
            self._front(True, n, out)
        return out

    def order(self) -> Iterator[int]:
        """Every free block in the index's order (for tests and inspection; O(n log n))."""
        free = [b for b in range(self.num_blocks) if self.free[b]]
        zero = [b for b in free if self.zero_cost(b)]
        yield from sorted((b for b in zero if not self.is_cached[b]), key=self.seq.__getitem__)
        yield from (b for b in free if not self.zero_cost(b))
        yield from sorted((b for b in zero if self.is_cached[b]), key=self.seq.__getitem__)
