"""What the picture shows, computed from a plan: stripes, block chunks, segments, per-token bytes.

Pure integer arithmetic on :class:`~kvplan.schemas.plan.BindingPlan`; no drawing here.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise

from kvplan.schemas.layout import KVCacheLayout
from kvplan.schemas.plan import BindingPlan, View

MAX_RUNS_PER_BLOCK = 64
"""A block made of more byte runs than this (heads outside blocks) is drawn as its extent."""


def extent(view: View) -> tuple[int, int]:
    """``view.byte_extent``, memoised (a large page asks for it many times)."""
    return _extent(view.offset_bytes, tuple(view.shape), tuple(view.stride), view.itemsize)


@lru_cache(maxsize=16384)
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


def _chunks(view: View, blocks: int) -> tuple[list[Chunk], list[int]]:
    """Chunks of blocks ``0..blocks-1`` and the start of block ``blocks`` (a fence)."""
    runs = block_runs(view)
    if runs is None:
        lo, hi = extent(view)
        return [Chunk(view, 0, lo, hi, whole=True)], []
    bsz = block_stride_bytes(view)
    n = min(blocks, view.shape[0])
    chunks = [
        Chunk(view, b, view.offset_bytes + b * bsz + s, view.offset_bytes + b * bsz + e)
        for b in range(n)
        for s, e in runs
    ]
    fences = [view.offset_bytes + n * bsz + runs[0][0]] if n < view.shape[0] else []
    return chunks, fences


def zoom(views: list[View], blocks: int = 4, max_segments: int = 6, max_chunks: int = 160) -> Zoom:
    """Where blocks ``0..blocks-1`` of each view live, as address segments.

    A gap between two chunks shorter than the earlier chunk's block stride is padding (kept
    inside the segment); a longer gap breaks the axis.
    """
    chunks: list[Chunk] = []
    fences: list[int] = []
    for view in views:
        c, f = _chunks(view, blocks)
        chunks += c
        fences += f
    chunks.sort(key=lambda c: (c.start, c.view.group, c.end))
    fences.sort()
    segments: list[Segment] = []
    for chunk in chunks:
        seg = segments[-1] if segments else None
        stride = max(block_stride_bytes(chunk.view), 1)
        if seg is not None and chunk.start - seg.end < seg.reach:
            seg.end = max(seg.end, chunk.end)
            seg.chunks.append(chunk)
            seg.reach = max(seg.reach, stride)
        else:
            segments.append(Segment(chunk.start, chunk.end, [chunk], stride))
    for seg in segments:  # trailing padding of the last block up to the next block's start
        at = bisect.bisect_left(fences, seg.end)
        if at < len(fences) and 0 < fences[at] - seg.end < seg.reach:
            seg.end = fences[at]
    shown = segments[:max_segments]
    hidden_chunks = sum(len(s.chunks) for s in segments[max_segments:])
    kept: list[Segment] = []
    budget = max_chunks
    for seg in shown:
        if budget <= 0:
            hidden_chunks += len(seg.chunks)
            continue
        if len(seg.chunks) > budget:
            cut = seg.chunks[budget].start  # cut at an address, not inside an overlay
            keep = [c for c in seg.chunks[:budget] if c.start < cut] or seg.chunks[:budget]
            hidden_chunks += len(seg.chunks) - len(keep)
            seg.chunks = keep
            seg.end = max(c.end for c in keep)
        budget -= len(seg.chunks)
        kept.append(seg)
    return Zoom(blocks, kept, len(segments) - len(kept), hidden_chunks)


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
