"""Do two tensor-backed views of one group share a byte? Decided exactly, in bounded work.

A view's bytes are a union of *progressions of byte runs*: after dropping size-1 axes,
sorting axes by stride and merging the axes that continue one another, a view is
``count`` runs of ``run`` bytes at ``start + k * period`` (``k < count``), one such
progression per index of the remaining (enumerated) axes. vLLM's layouts give one
progression per view; kvplan accepts at most :data:`MAX_PROGRESSIONS_PER_VIEW`.

Two progressions share a byte iff some pair ``(i, j)`` has ``j*q - i*p`` in a small
integer window; the number of such pairs is a difference of clamped floor sums, computed
with the Euclid-like ``floor_sum`` in ``O(log)`` steps, so the answer is exact for any
strides, offsets and sizes. Candidate pairs come from sweeps that never enumerate
blocks: views are first split into clusters of chain-overlapping byte extents, then
progressions are paired by their footprint modulo the gcd of the cluster's periods (or,
for runs longer than that, by byte extent). Every candidate examined counts against a
budget (:data:`MAX_PAIR_CHECKS` per plan); a plan that exhausts it is refused (``KVP311``)
instead of being half-checked.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kvplan.planner.page_index import MAX_RUNS, byte_runs, run_offsets
from kvplan.schemas.plan import View

MAX_PROGRESSIONS_PER_VIEW = MAX_RUNS
"""Enumerated run progressions one view may have (vLLM layouts need 1)."""
MAX_PAIR_CHECKS = 200_000
"""Candidate progression pairs examined per plan before kvplan refuses to decide."""
MAX_PROGRESSIONS = 1 << 16
"""Run progressions of all views of a plan together (bounds memory)."""
MAX_FINDINGS_PER_GROUP = 8


@dataclass(frozen=True)
class Finding:
    """``kind``: ``pair`` (views ``a`` and ``b`` share bytes), ``self`` (two elements of view
    ``a`` share bytes) or ``complex`` (deciding needs more work than the budget allows)."""

    kind: str
    a: str
    b: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Prog:
    owner: int
    start: int
    run: int
    count: int
    period: int

    @property
    def end(self) -> int:
        return self.start + (self.count - 1) * self.period + self.run


class Budget:
    """Pair checks left for one plan."""

    def __init__(self, checks: int = MAX_PAIR_CHECKS) -> None:
        self.left = checks
        self.progressions = MAX_PROGRESSIONS

    def spend(self) -> bool:
        self.left -= 1
        return self.left >= 0


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a*i + b) / m) for i in range(n))`` for ``n, a, b >= 0``, ``m > 0``."""
    total = 0
    while True:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b = divmod(y_max, m)
        m, a = a, m


def _clamped_sum(m: int, q: int, c: int, p: int, n: int) -> int:
    """``sum(clamp(floor((j*q + c) / p) + 1, 0, n) for j in range(m))``, ``q, p > 0``."""
    j0 = min(m, max(0, -(c // q)))  # first j with j*q + c >= 0
    j1 = min(m, max(j0, -((c - (n - 1) * p) // q)))  # first j with j*q + c >= (n-1)*p
    middle = floor_sum(j1 - j0, p, q, j0 * q + c) + (j1 - j0) if j1 > j0 else 0
    return middle + n * (m - j1)


def _hits_in(lo: int, hi: int, step: int, count: int) -> bool:
    """Is some ``k * step`` (``0 <= k < count``) in ``[lo, hi]``?"""
    if count == 1 or step == 0:
        return lo <= 0 <= hi
    first = max(0, -((-lo) // step))
    return first < count and first * step <= hi


def progressions_share(a: Prog, b: Prog) -> bool:
    """Exact: does some run of ``a`` share a byte with some run of ``b``?"""
    if a.end <= b.start or b.end <= a.start:
        return False
    # runs a0 + i*p and b0 + j*q intersect iff j*q - i*p lies in [lo, hi]
    lo = a.start - b.start - b.run + 1
    hi = a.start - b.start + a.run - 1
    n, p, m, q = a.count, a.period, b.count, b.period
    if n == 1 or p == 0:
        return _hits_in(lo, hi, q, m)
    if m == 1 or q == 0:
        return _hits_in(-hi, -lo, p, n)
    # quick reject: j*q - i*p is always a multiple of gcd(p, q)
    g = _gcd(p, q)
    if (hi // g) * g < lo:
        return False
    # pairs (i, j) with i*p <= j*q - lo, minus those with i*p <= j*q - hi - 1
    return _clamped_sum(m, q, -lo, p, n) > _clamped_sum(m, q, -hi - 1, p, n)


def _gcd(x: int, y: int) -> int:
    while y:
        x, y = y, x % y
    return x


def view_progressions(view: View, owner: int) -> list[Prog] | None:
    """The runs of ``view`` as progressions (None: more than :data:`MAX_RUNS` of them).

    Strides must be non-negative (``_check_view`` refuses others first). The longest axis of
    :func:`~kvplan.planner.page_index.byte_runs` is the progression; the others are enumerated.
    """
    runs = byte_runs(view.shape, view.stride, view.itemsize, exact=True)
    if runs is None:
        return []
    start = view.offset_bytes + runs.shift
    if not runs.axes:
        return [Prog(owner, start, runs.run, 1, 0)]
    k = max(range(len(runs.axes)), key=lambda i: runs.axes[i][1])
    period, count = runs.axes[k]
    starts = run_offsets(runs.axes[:k] + runs.axes[k + 1 :])
    if starts is None:
        return None
    return [Prog(owner, start + x, runs.run, count, period) for x in starts]


def _residue_candidates(progs: list[Prog], period: int) -> Iterator[tuple[Prog, Prog]]:
    """Pairs of progressions (runs at most ``period`` long) whose footprints modulo
    ``period`` intersect."""
    spans: list[tuple[int, int, int]] = []
    for i, prog in enumerate(progs):
        lo = prog.start % period
        hi = lo + prog.run
        if hi <= period:
            spans.append((lo, hi, i))
        else:
            spans.append((lo, period, i))
            spans.append((0, hi - period, i))
    spans.sort()
    active: list[tuple[int, int]] = []  # heap of (end, index)
    for lo, hi, i in spans:
        while active and active[0][0] <= lo:
            heapq.heappop(active)
        for _, j in active:
            if j != i:
                yield progs[j], progs[i]
        heapq.heappush(active, (hi, i))


def _extent_candidates(progs: list[Prog], bucket_of: list[int]) -> Iterator[tuple[Prog, Prog]]:
    """Pairs with intersecting byte extents, except pairs inside one same-period bucket."""
    order = sorted(range(len(progs)), key=lambda i: progs[i].start)
    active: dict[int, list[tuple[int, int]]] = defaultdict(list)  # bucket -> heap (end, i)
    for i in order:
        prog = progs[i]
        mine = bucket_of[i]
        for bucket, heap in active.items():
            while heap and heap[0][0] <= prog.start:
                heapq.heappop(heap)
            if bucket == mine and bucket >= 0:
                continue
            for _, j in heap:
                yield progs[j], prog
        heapq.heappush(active[mine], (prog.end, i))


def find_overlaps(views: Sequence[View], budget: Budget | None = None) -> list[Finding]:
    """Views (of one group) that share bytes with another view or with themselves."""
    budget = budget or Budget()
    progs: list[Prog] = []
    findings: list[Finding] = []
    for owner, view in enumerate(views):
        mine = view_progressions(view, owner)
        if mine is None:
            findings.append(
                Finding(
                    "complex",
                    view.layer,
                    detail=f"more than {MAX_PROGRESSIONS_PER_VIEW} strided runs per block "
                    f"pattern (shape {_short(view.shape)}, stride {_short(view.stride)})",
                )
            )
            continue
        budget.progressions -= len(mine)
        if budget.progressions < 0:
            findings.append(
                Finding(
                    "complex",
                    view.layer,
                    detail=f"the plan's views have more than {MAX_PROGRESSIONS} strided run "
                    "progressions in all",
                )
            )
            return findings
        for prog in mine:
            if prog.count > 1 and prog.period < prog.run:
                findings.append(
                    Finding(
                        "self",
                        view.layer,
                        detail=f"runs of {prog.run} contiguous bytes start only {prog.period} "
                        "bytes apart",
                    )
                )
                break
        progs.extend(mine)
    if any(f.kind == "complex" for f in findings):
        return findings
    selfs = {f.a for f in findings}
    seen: set[tuple[int, int]] = set()
    for cluster in _extent_clusters(progs):
        for x, y in _cluster_candidates(cluster):
            if not budget.spend():
                findings.append(
                    Finding(
                        "complex",
                        views[y.owner].layer,
                        detail=f"the plan needs more than {MAX_PAIR_CHECKS} overlap checks",
                    )
                )
                return findings
            a, b = sorted((x.owner, y.owner))
            if (a, b) in seen or (a == b and views[a].layer in selfs):
                continue
            if not progressions_share(x, y):
                continue
            seen.add((a, b))
            if a == b:
                selfs.add(views[a].layer)
                findings.append(
                    Finding("self", views[a].layer, detail="two of its strided runs intersect")
                )
            else:
                findings.append(Finding("pair", views[a].layer, views[b].layer))
            if len(findings) >= MAX_FINDINGS_PER_GROUP:
                return findings
    return findings


def _extent_clusters(progs: list[Prog]) -> Iterator[list[Prog]]:
    """Maximal sets of progressions whose byte extents chain-overlap (singletons skipped)."""
    cluster: list[Prog] = []
    reach = 0
    for prog in sorted(progs, key=lambda p: p.start):
        if cluster and prog.start >= reach:
            if len(cluster) > 1:
                yield cluster
            cluster = []
        cluster.append(prog)
        reach = max(reach, prog.end) if len(cluster) > 1 else prog.end
    if len(cluster) > 1:
        yield cluster


def _cluster_candidates(progs: list[Prog]) -> Iterator[tuple[Prog, Prog]]:
    """Candidate pairs of one cluster (every pair that may share a byte, maybe more).

    With ``G`` the gcd of the cluster's periods, ``j*q - i*p`` is a multiple of ``G`` for
    any two progressions, so two whose runs (no longer than ``G``) are disjoint modulo ``G``
    cannot meet: those are paired by a sweep over footprints modulo ``G``. Progressions
    with longer runs are paired with everything by byte extent, and so is every pair when
    the footprints crowd the circle (the modulus would filter little).
    """
    modulus = 0
    for prog in progs:
        if prog.count > 1:
            modulus = _gcd(modulus, prog.period)
    filtered = [modulus > 0 and prog.run <= modulus for prog in progs]
    # the residue sweep only pays off when footprints do not crowd the circle
    if sum(p.run for p, f in zip(progs, filtered, strict=True) if f) > 4 * modulus:
        filtered = [False] * len(progs)
    if any(filtered):
        yield from _residue_candidates(
            [p for p, f in zip(progs, filtered, strict=True) if f], modulus
        )
    yield from _extent_candidates(progs, [0 if f else -1 for f in filtered])


def _short(values: Sequence[int], limit: int = 8) -> str:
    """A list for a message, at most ``limit`` entries."""
    if len(values) <= limit:
        return str(list(values))
    return "[" + ", ".join(str(v) for v in values[:limit]) + f", ... ({len(values)} entries)]"
