"""Page index: which bytes of which pool each KV-cache block touches, from a plan alone.

Pure arithmetic over a :class:`~kvplan.schemas.plan.BindingPlan` (no torch, no driver), so
the elastic executor, validators and tests share one definition of "the pages of block b".

Conventions (those of the plan): a view's dim 0 is the block axis, ``shape[0] ==
pool.num_blocks * ratio`` where ``ratio >= 1`` kernel blocks (rows) make one manager block
(rows ``[b*ratio, (b+1)*ratio)``); the other dims describe one row. This covers
layer-outermost layouts (one range per layer and block), block-outermost packed layouts
(several layers interleaved inside one block's bytes), kernel-split views and layouts that
put heads outside blocks (several ranges per row). A view that is not block-shaped (the
whole-pool ``int8 [size_bytes]`` view of specs without per-layer views, or a row count that
is not a multiple of ``num_blocks``) is charged to every block with its full byte extent.

Ranges are half-open byte intervals ``(start, end)`` relative to the pool's first byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvplan.schemas.plan import BindingPlan, View

Range = tuple[int, int]
"""``[start, end)`` in bytes from the pool's first byte."""

MAX_RUNS = 4096
"""Most byte runs kvplan enumerates for one strided box (vLLM's layouts need one): above it,
a page-index row is charged its whole extent and the overlap check refuses (``KVP311``)."""
MAX_RANGES_PER_ROW = MAX_RUNS


@dataclass(frozen=True)
class ViewRows:
    """How one view's rows map to bytes.

    ``whole`` views touch ``template`` (absolute ranges) for every block; otherwise row
    ``r`` touches ``template`` shifted by ``base + r * row_stride`` bytes.
    """

    layer: str
    pool: str
    rows: int
    ratio: int
    base: int
    row_stride: int
    template: tuple[Range, ...]
    whole: bool


def merge_ranges(ranges: Iterable[Range]) -> list[Range]:
    """Sorted union of ``ranges``; touching or overlapping ranges coalesce, empty ones vanish."""
    out: list[Range] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


@dataclass(frozen=True)
class ByteRuns:
    """The bytes of one element-strided box: runs of ``run`` contiguous bytes starting at
    ``shift + sum(i_k * stride_k)`` for every index ``i_k < count_k`` of ``axes``
    (``(stride_k, count_k)`` in bytes, innermost first, axes that continue one another merged).
    """

    shift: int
    run: int
    axes: tuple[tuple[int, int], ...]

    @property
    def span(self) -> int:
        """Bytes from the lowest to past the highest byte touched."""
        return self.run + sum((n - 1) * s for s, n in self.axes)


def byte_runs(
    shape: list[int], stride: list[int], itemsize: int, *, exact: bool = False
) -> ByteRuns | None:
    """The one byte-run decomposition of a strided box (None: an empty box).

    ``shape``/``stride`` are in elements; a stride may be negative (``shift`` then starts
    below the first element). By default only the union of bytes matters: zero strides
    vanish and axes whose stride is at most the run extend it. ``exact`` keeps every element
    apart, as overlap checking needs: only an axis whose stride is exactly the run extends
    it, and a zero or short stride stays an axis (two elements on the same bytes).
    """
    if any(n == 0 for n in shape):
        return None
    shift = 0
    dims: list[tuple[int, int]] = []
    for n, st in zip(shape, stride, strict=True):
        if n == 1 or (st == 0 and not exact):
            continue
        if st < 0:
            shift += (n - 1) * st * itemsize
        dims.append((abs(st) * itemsize, n))
    dims.sort()
    run = itemsize
    axes: list[tuple[int, int]] = []
    for byte_stride, n in dims:
        if not axes and (byte_stride == run or (not exact and byte_stride < run)):
            run += (n - 1) * byte_stride
        elif axes and axes[-1][0] > 0 and byte_stride == axes[-1][0] * axes[-1][1]:
            inner_stride, inner_n = axes.pop()
            axes.append((inner_stride, inner_n * n))
        else:
            axes.append((byte_stride, n))
    return ByteRuns(shift, run, tuple(axes))


def run_offsets(axes: Iterable[tuple[int, int]], limit: int = MAX_RUNS) -> list[int] | None:
    """Every offset ``sum(i_k * stride_k)`` of ``axes`` (None: more than ``limit``)."""
    axes = list(axes)
    total = 1
    for _, n in axes:
        total *= n
        if total > limit:
            return None
    offsets = [0]
    for byte_stride, n in axes:
        offsets = [o + i * byte_stride for o in offsets for i in range(n)]
    return offsets


def row_template(shape: list[int], stride: list[int], itemsize: int) -> tuple[Range, ...]:
    """Byte ranges one element-strided box touches, relative to its first element's address.

    ``shape``/``stride`` are in elements (stride may be zero or negative); ranges can start
    below zero when a stride is negative. Empty boxes touch nothing; a box of more than
    :data:`MAX_RUNS` runs is charged its whole extent.
    """
    runs = byte_runs(shape, stride, itemsize)
    if runs is None:
        return ()
    offsets = run_offsets(runs.axes)
    if offsets is None:
        return ((runs.shift, runs.shift + runs.span),)
    return tuple(merge_ranges((runs.shift + o, runs.shift + o + runs.run) for o in offsets))


def view_rows(view: View, pool_num_blocks: int, pool_size: int) -> ViewRows:
    """Classify ``view`` and precompute its per-row byte template."""
    isz = view.itemsize
    shape, stride = view.shape, view.stride
    whole_pool = (
        len(shape) == 1
        and isz == 1
        and stride == [1]
        and view.offset_bytes == 0
        and shape[0] == pool_size
    )
    rows = shape[0] if shape else 0
    if whole_pool or not shape or pool_num_blocks <= 0 or rows % pool_num_blocks or not rows:
        lo, hi = view.byte_extent
        return ViewRows(view.layer, view.pool, rows, 0, 0, 0, ((lo, hi),) if hi > lo else (), True)
    return ViewRows(
        layer=view.layer,
        pool=view.pool,
        rows=rows,
        ratio=rows // pool_num_blocks,
        base=view.offset_bytes,
        row_stride=stride[0] * isz,
        template=row_template(shape[1:], stride[1:], isz),
        whole=False,
    )


class PageIndex:
    """Block id → byte ranges in every pool (see the module docstring).

    ``num_blocks`` is the largest pool's block count; valid block ids are
    ``0 <= b < num_blocks`` (a block past a smaller pool's count touches nothing there).
    """

    def __init__(self, plan: BindingPlan) -> None:
        self.pool_sizes: dict[str, int] = {p.name: p.size_bytes for p in plan.pools}
        self.num_blocks: int = max((p.num_blocks for p in plan.pools), default=0)
        pools = plan.pool_by_name
        self.views: tuple[ViewRows, ...] = tuple(
            view_rows(v, pools[v.pool].num_blocks, pools[v.pool].size_bytes)
            for v in plan.views
            if v.pool in pools
        )
        self._spans, self._fixed = _block_spans(self.views, self.pool_sizes)

    def check_block(self, block: int) -> bool:
        """Whether ``block`` is a valid block id."""
        return 0 <= block < self.num_blocks

    def _raw(self, blocks: Iterable[int]) -> dict[str, list[Range]]:
        out: dict[str, list[Range]] = {name: [] for name in self.pool_sizes}
        block_list = list(dict.fromkeys(blocks))
        if not block_list:
            return out
        for name, acc in out.items():
            acc.extend(self._fixed[name])
            for lo, hi, shift, stop in self._spans[name]:
                acc.extend((lo + b * shift, hi + b * shift) for b in block_list if b < stop)
        return out

    def block_ranges(self, block: int) -> dict[str, list[Range]]:
        """Merged byte ranges ``block`` touches, per pool (every pool is a key)."""
        return self.blocks_ranges([block])

    def blocks_ranges(self, blocks: Iterable[int]) -> dict[str, list[Range]]:
        """Merged union of the byte ranges of ``blocks``, per pool, clipped to the pool."""
        raw = self._raw(blocks)
        return {
            name: [
                (max(s, 0), min(e, self.pool_sizes[name]))
                for s, e in merge_ranges(ranges)
                if s < self.pool_sizes[name] and e > 0
            ]
            for name, ranges in raw.items()
        }

    def blocks_chunks(self, blocks: Iterable[int], chunk_bytes: int) -> dict[str, set[int]]:
        """Chunk ids (``chunk i`` = bytes ``[i*chunk_bytes, (i+1)*chunk_bytes)``) per pool."""
        if chunk_bytes <= 0:
            raise ValueError("chunk_bytes must be positive")
        block_list = list(dict.fromkeys(blocks))
        out: dict[str, set[int]] = {}
        for name, size in self.pool_sizes.items():
            ids: set[int] = set()
            if block_list:
                for s, e in self._fixed[name]:
                    s, e = max(s, 0), min(e, size)
                    if e > s:
                        ids.update(range(s // chunk_bytes, (e - 1) // chunk_bytes + 1))
            for lo, hi, shift, stop in self._spans[name]:
                for b in block_list:
                    if b < stop:
                        s, e = max(lo + b * shift, 0), min(hi + b * shift, size)
                        if e > s:
                            ids.update(range(s // chunk_bytes, (e - 1) // chunk_bytes + 1))
            out[name] = ids
        return out

    def block_chunks(self, block: int, chunk_bytes: int) -> dict[str, set[int]]:
        """Chunk ids ``block`` needs mapped, per pool."""
        return self.blocks_chunks([block], chunk_bytes)


Span = tuple[int, int, int, int]
"""``(lo, hi, shift, stop)``: block ``b < stop`` touches ``[lo + b*shift, hi + b*shift)``."""


def _block_spans(
    views: Iterable[ViewRows], pool_sizes: dict[str, int]
) -> tuple[dict[str, tuple[Span, ...]], dict[str, tuple[Range, ...]]]:
    """Per pool, the bytes of any block as few affine spans (a view's rows of block 0, merged
    with every view that shifts by as much per block) plus the ranges every block touches
    (whole views): the page index is affine in the block id, so a block's ranges are a
    multiply-add per span, not a walk of every view's rows."""
    by_shift: dict[tuple[str, int, int], list[Range]] = {}
    fixed: dict[str, list[Range]] = {name: [] for name in pool_sizes}
    for vr in views:
        if vr.whole:
            fixed[vr.pool].extend(vr.template)
            continue
        runs = by_shift.setdefault((vr.pool, vr.ratio * vr.row_stride, vr.rows // vr.ratio), [])
        for r in range(vr.ratio):
            at = vr.base + r * vr.row_stride
            runs.extend((at + s, at + e) for s, e in vr.template)
    spans: dict[str, list[Span]] = {name: [] for name in pool_sizes}
    for (pool, shift, stop), runs in by_shift.items():
        spans[pool].extend((lo, hi, shift, stop) for lo, hi in merge_ranges(runs))
    return (
        {name: tuple(found) for name, found in spans.items()},
        {name: tuple(merge_ranges(found)) for name, found in fixed.items()},
    )


def range_bytes(ranges: Iterable[Range]) -> int:
    """Total bytes of disjoint ``ranges``."""
    return sum(e - s for s, e in ranges)
