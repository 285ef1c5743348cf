"""What the picture shows, computed from a plan: stripes, block chunks, segments, per-token bytes.

Pure integer arithmetic on :class:`~kvplan.schemas.plan.BindingPlan`; no drawing here.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise
from typing import Any

from kvplan.schemas.layout import KVCacheLayout
from kvplan.schemas.plan import BindingPlan, View

MAX_RUNS_PER_BLOCK = 64
"""A block made of more byte runs than this (heads outside blocks) is drawn as its extent."""


def extent(view: View) -> tuple[int, int]:
    """``view.byte_extent``, memoised (a large page asks for it many times)."""
    return _extent(view.offset_bytes, tuple(view.shape), tuple(view.stride), view.itemsize)


@lru_cache(maxsize=1 << 17)
def _extent(
    offset: int, shape: tuple[int, ...], stride: tuple[int, ...], isz: int
) -> tuple[int, int]:
    if 0 in shape:
        return (offset, offset)
    lo = sum((n - 1) * s for n, s in zip(shape, stride, strict=True) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(shape, stride, strict=True) if s >= 0)
    return (offset + lo * isz, offset + (hi + 1) * isz)


def short(layer: str) -> str:
    """``L13`` for ``….layers.13.self_attn.attn``; the name itself otherwise."""
    match = re.search(r"layers\.(\d+)\.", layer)
    return f"L{match.group(1)}" if match else layer


def short_kind(kind: str) -> str:
    return kind.removesuffix("Spec").removesuffix("KVCache") or kind


def block_runs(view: View) -> list[tuple[int, int]] | None:
    """Byte runs ``[start, end)`` of block 0 relative to the view's offset, sorted.

    ``None`` when the view has no block axis (a 1-D whole-pool view), a negative stride, or
    more than :data:`MAX_RUNS_PER_BLOCK` runs; callers then use the view's extent.
    """
    if len(view.shape) < 2 or any(s < 0 for s in view.stride):
        return None
    isz = view.itemsize
    dims = sorted(
        (
            (stride * isz, size)
            for size, stride in zip(view.shape[1:], view.stride[1:], strict=True)
            if size > 1
        ),
    )
    run = isz
    outer: list[tuple[int, int]] = []
    for i, (stride, size) in enumerate(dims):
        if stride == run:
            run *= size
        else:
            outer = dims[i:]
            break
    count = math.prod(size for _, size in outer)
    if count > MAX_RUNS_PER_BLOCK:
        return None
    starts = [0]
    for stride, size in outer:
        starts = [s + k * stride for s in starts for k in range(size)]
    return sorted((s, s + run) for s in starts)


def block_stride_bytes(view: View) -> int:
    return view.stride[0] * view.itemsize if len(view.shape) >= 2 else 0


def dense_page_bytes(view: View) -> int:
    """Bytes one block of the view holds (its elements, no padding)."""
    return view.itemsize * math.prod(view.shape[1:]) if len(view.shape) >= 2 else 0


def is_padded(view: View) -> bool:
    """Layer-outermost view whose block stride exceeds its page: padded pages."""
    runs = block_runs(view)
    if runs is None or len(runs) != 1:
        return False
    page = runs[0][1] - runs[0][0]
    return block_stride_bytes(view) > page and _is_layer_outermost(view)


def _is_layer_outermost(view: View) -> bool:
    return len(view.stride) >= 2 and all(view.stride[0] >= s for s in view.stride[1:])


def block_tokens(view: View) -> int | None:
    """Tokens one block of a ``[B, H, N, C]`` attention view holds (``N``); ``None`` for Mamba
    state, other shapes, and plans whose views are not vLLM 0.33's logical shape."""
    kind = view.spec_kind
    if len(view.shape) != 4 or (kind is not None and kind.is_mamba) or view.shape[2] <= 0:
        return None
    return view.shape[2]


def bytes_per_token(view: View) -> float | None:
    """Page bytes ÷ states per block for a ``[B, H, N, C]`` attention view; ``None`` otherwise."""
    kind = view.spec_kind
    if len(view.shape) != 4 or (kind is not None and kind.is_mamba) or view.shape[2] <= 0:
        return None
    return dense_page_bytes(view) / view.shape[2]


@dataclass
class Chunk:
    """Block ``block`` of ``view``: one byte run ``[start, end)`` in the pool."""

    view: View
    block: int
    start: int
    end: int
    whole: bool = False  # no block axis: the view's whole extent


@dataclass
class Segment:
    """A contiguous window of the pool drawn in the zoom; gaps inside are padding."""

    start: int
    end: int
    chunks: list[Chunk] = field(default_factory=list)
    reach: int = 1  # the largest gap kept inside: the largest block stride of its chunks


@dataclass
class Zoom:
    blocks: int
    segments: list[Segment]
    hidden_segments: int
    hidden_chunks: int


_Row = tuple[int, int, int, int, int, bool]  # start, group, end, block, view index, whole


def _rows(views: list[View], blocks: int) -> tuple[list[_Row], list[tuple[int, int, int, int]]]:
    """Every chunk of blocks ``0..blocks-1`` as a sortable tuple (sorted), and per view with a
    block axis ``(offset, block stride, first run's start, blocks)`` for the fences."""
    rows: list[_Row] = []
    axes: list[tuple[int, int, int, int]] = []
    for vi, view in enumerate(views):
        runs = block_runs(view)
        if runs is None:
            lo, hi = extent(view)
            rows.append((lo, view.group, hi, 0, vi, True))
            continue
        bsz = block_stride_bytes(view)
        off = view.offset_bytes
        for b in range(min(blocks, view.shape[0])):
            base = off + b * bsz
            rows.extend((base + s, view.group, base + e, b, vi, False) for s, e in runs)
        axes.append((off, bsz, runs[0][0], view.shape[0]))
    rows.sort()
    return rows, axes


def zooms(
    views: list[View], counts: Iterable[int], max_segments: int = 6, max_chunks: int = 160
) -> dict[int, Zoom]:
    """:func:`zoom` for each block count in ``counts``, sharing one sort of the chunks.

    Linear in the chunks after that sort; only the chunks drawn become :class:`Chunk` objects.
    """
    counts = sorted(set(counts))
    rows, axes = _rows(views, counts[-1])
    reach_of = [max(block_stride_bytes(v), 1) for v in views]
    out: dict[int, Zoom] = {}
    for blocks in counts:
        chosen = rows if blocks == counts[-1] else [r for r in rows if r[3] < blocks]
        fences = sorted(o + blocks * b + r0 for o, b, r0, n in axes if blocks < n)
        segments: list[list[Any]] = []  # [start, end, reach, rows]
        for row in chosen:
            seg = segments[-1] if segments else None
            if seg is not None and row[0] - seg[1] < seg[2]:
                seg[1] = max(seg[1], row[2])
                seg[3].append(row)
                seg[2] = max(seg[2], reach_of[row[4]])
            else:
                segments.append([row[0], row[2], reach_of[row[4]], [row]])
        for seg in segments:  # trailing padding of the last block up to the next block's start
            at = bisect.bisect_left(fences, seg[1])
            if at < len(fences) and 0 < fences[at] - seg[1] < seg[2]:
                seg[1] = fences[at]
        hidden_chunks = sum(len(s[3]) for s in segments[max_segments:])
        kept: list[Segment] = []
        budget = max_chunks
        for start, end, reach, members in segments[:max_segments]:
            if budget <= 0:
                hidden_chunks += len(members)
                continue
            if len(members) > budget:
                cut = members[budget][0]  # cut at an address, not inside an overlay
                keep = [r for r in members[:budget] if r[0] < cut] or members[:budget]
                hidden_chunks += len(members) - len(keep)
                members, end = keep, max(r[2] for r in keep)
            budget -= len(members)
            chunks = [Chunk(views[r[4]], r[3], r[0], r[2], r[5]) for r in members]
            kept.append(Segment(start, end, chunks, reach))
        out[blocks] = Zoom(blocks, kept, len(segments) - len(kept), hidden_chunks)
    return out


def zoom(views: list[View], blocks: int = 4, max_segments: int = 6, max_chunks: int = 160) -> Zoom:
    """Where blocks ``0..blocks-1`` of each view live, as address segments.

    A gap between two chunks shorter than the earlier chunk's block stride is padding (kept
    inside the segment); a longer gap breaks the axis. At most ``max_segments`` segments and
    ``max_chunks`` chunks are kept; the rest are counted.
    """
    return zooms(views, [blocks], max_segments, max_chunks)[blocks]


def interleaved(views: list[View]) -> bool:
    """Whether the extents of ``views`` (one group, one pool) overlap: block-outermost."""
    spans = sorted(extent(v) for v in views)
    return any(a[1] > b[0] for a, b in pairwise(spans))


@dataclass(frozen=True)
class Memory:
    """The memory summary beside the picture.

    ``per_token`` is ``None`` for plans whose views are not vLLM 0.33's logical
    ``[B, H, N, C]`` (the legacy strategies' backend shapes do not say tokens per block).
    """

    per_token: float | None  # tensor-backed attention views
    shared_per_token: float  # what the sharers would add with caches of their own
    per_block: int
    pool_bytes: int
    saved_bytes: int
    backed: int
    aliased: int

    @property
    def saved_share(self) -> float:
        total = (self.per_token or 0.0) + self.shared_per_token
        return self.shared_per_token / total if total else 0.0


def is_logical(plan: BindingPlan) -> bool:
    """Whether the plan's views are vLLM 0.33's logical ``[B, H, N, C]`` (a KVCacheLayout);
    the legacy strategies' backend shapes do not say tokens per block."""
    return plan.source.layout in KVCacheLayout.__members__


def memory(plan: BindingPlan) -> Memory:
    logical = is_logical(plan)
    per_token = sum(bytes_per_token(v) or 0.0 for v in plan.views)
    shared = 0.0
    for alias in plan.aliases:
        target = plan.view_by_layer.get(alias.target)
        if target is not None:
            shared += bytes_per_token(target) or 0.0
    s = plan.summary
    return Memory(
        per_token if logical else None,
        shared if logical else 0.0,
        s.bytes_per_block,
        s.pool_bytes,
        s.alias_saved_bytes,
        s.tensor_backed_layers,
        s.aliased_layers,
    )
