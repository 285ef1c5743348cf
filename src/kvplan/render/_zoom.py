"""Inline SVG of one pool's block zoom: a few blocks drawn at a readable scale, each chunk of
each view a chip, the address segments between them broken.

Split from :mod:`kvplan.render._svg` (the band and the sharers), whose helpers it uses. Linear
in what it draws, and what it draws is bounded (zoom segments and chunks), whatever the plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

from kvplan.render._geometry import (
    Chunk,
    Zoom,
    short,
    short_kind,
    zooms,
)
from kvplan.render._svg import (
    CHAR_W,
    LEFT,
    MAX_GROUP_ROWS,
    ROW_GAP,
    ZOOM_H,
    Look,
    _rect,
    _svg,
    _t,
    esc,
    exact,
    fit,
    round_bytes,
    text_fits,
    view_title,
)
from kvplan.schemas.plan import BindingPlan, Pool
from kvplan.units import human_bytes

MIN_SEGMENT_W = 24.0
SEGMENT_BREAK = 30.0


@dataclass
class _ZoomLayout:
    zoom: Zoom
    widths: list[float]
    scale: float  # px per byte of the segments drawn to scale
    widened: int  # segments drawn wider than to scale (too small to see)
    unnamed: int  # chips too narrow for their layer's name


def _layout(z: Zoom, avail_all: float) -> _ZoomLayout:
    avail = avail_all - SEGMENT_BREAK * (len(z.segments) - 1)
    total = sum(s.end - s.start for s in z.segments) or 1
    scale = avail / total
    widths = [max((s.end - s.start) * scale, MIN_SEGMENT_W) for s in z.segments]
    widened = sum(
        1 for s, w in zip(z.segments, widths, strict=True) if w > (s.end - s.start) * scale
    )
    unnamed = 0
    for seg, w in zip(z.segments, widths, strict=True):
        px = w / max(seg.end - seg.start, 1)
        for chunk in seg.chunks:
            if not text_fits(short(chunk.view.layer), (chunk.end - chunk.start) * px):
                unnamed += 1
    return _ZoomLayout(z, widths, scale, widened, unnamed)


def _block_spans(chunks: Iterable[Chunk]) -> list[tuple[int, int, int]] | None:
    """(block, first byte, end byte) per block of a segment, when the blocks lie one after
    another (each block's chunks before the next block's); None otherwise."""
    spans: dict[int, list[int]] = {}
    for chunk in chunks:
        if chunk.whole:
            return None
        span = spans.setdefault(chunk.block, [chunk.start, chunk.end])
        span[0], span[1] = min(span[0], chunk.start), max(span[1], chunk.end)
    ordered = sorted((lo, hi, b) for b, (lo, hi) in spans.items())
    if len(ordered) < 2 or any(a[1] > b[0] for a, b in pairwise(ordered)):
        return None
    return [(b, lo, hi) for lo, hi, b in ordered]


def pool_zoom(plan: BindingPlan, pool: Pool, width: int, look: Look, blocks: int = 4) -> str:
    """Where blocks 0..blocks-1 of each layer live: a broken address axis, one row per group.

    Fewer blocks are zoomed (2, then 1) when the chips of ``blocks`` blocks would be too narrow
    to name their layers; a block axis names the blocks of a segment whose blocks lie one
    after another; a scale bar gives the bytes per pixel of the segments drawn to scale.
    """
    marks = look.marks
    views = [v for v in plan.views if v.pool == pool.name]
    if not views:
        return ""
    kinds: dict[int, str] = {}
    for view in views:
        kinds.setdefault(view.group, view.kind)
    groups = sorted(kinds)[:MAX_GROUP_ROWS]
    row_of = {gid: i for i, gid in enumerate(groups)}
    drawn = [v for v in views if v.group in row_of]
    avail = width - LEFT - 4
    tries = sorted({blocks, min(blocks, 2), 1}, reverse=True)
    candidates = zooms(drawn, tries)
    for n in tries:
        lay = _layout(candidates[n], avail)
        if lay.unnamed == 0:
            break
    z, blocks = lay.zoom, lay.zoom.blocks
    top = 64
    head = (
        f"zoom: blocks 0–{blocks - 1} of pool {pool.name} (where block b of each layer lives)"
        if blocks > 1
        else f"zoom: block 0 of pool {pool.name} (where block 0 of each layer lives)"
    )
    out = [_t(0, 14, fit(head, width / 1.15), "h")]
    rows_h = len(groups) * (ZOOM_H + ROW_GAP)
    for gid in groups:
        y = top + row_of[gid] * (ZOOM_H + ROW_GAP) + 19
        out.append(_t(0, y, fit(f"g{gid} {short_kind(kinds[gid])}", LEFT - 6)))
    x = float(LEFT)
    for i, (seg, w) in enumerate(zip(z.segments, lay.widths, strict=True)):
        px = w / max(seg.end - seg.start, 1)
        out.append(_t(x, top - 34, f"@ {human_bytes(seg.start)}", "s"))
        out.append(_t(x, top - 22, f"{seg.start:,} B", "s"))
        out.append(
            f'<rect x="{x:.1f}" y="{top - 3}" width="{w:.1f}" height="{rows_h + 2}" '
            f'fill="url(#pad)" class="seg"><title>{esc(_seg_title(seg.start, seg.end))}</title>'
            f"</rect>"
        )
        spans = _block_spans(seg.chunks)
        for block, lo, hi in spans or []:
            bx0, bx1 = x + (lo - seg.start) * px, x + (hi - seg.start) * px
            out.append(f'<path d="M{bx0 + 1:.1f},{top - 6} v-4 H{bx1 - 1:.1f} v4" class="bus"/>')
            if text_fits(f"b{block}", bx1 - bx0):
                out.append(_t((bx0 + bx1) / 2, top - 12, f"b{block}", "s", "middle"))
        for chunk in seg.chunks:
            y = top + row_of[chunk.view.group] * (ZOOM_H + ROW_GAP)
            cx, cw = x + (chunk.start - seg.start) * px, (chunk.end - chunk.start) * px
            mark = marks.views.get(chunk.view.layer)
            what = "all blocks" if chunk.whole else f"b{chunk.block}"
            title = (
                f"{'[' + mark + '] ' if mark else ''}{chunk.view.layer}\n{what}: bytes "
                f"[{chunk.start:,}, {chunk.end:,}) ({exact(chunk.end - chunk.start)})\n"
                + view_title(chunk.view, pool)
            )
            out.append(
                _rect(
                    cx,
                    y,
                    cw,
                    ZOOM_H,
                    look.fill(chunk.view.group),
                    title,
                    "stripe marked" if mark else "stripe",
                )
            )
            out.extend(_chip_label(short(chunk.view.layer), what, cx, cw, y))
        x += w
        if i < len(z.segments) - 1:
            skipped = z.segments[i + 1].start - seg.end
            out.append(_t(x + SEGMENT_BREAK / 2, top + rows_h / 2 + 4, "⋯", "brk", "middle"))
            out.append(
                f'<rect x="{x:.1f}" y="{top}" width="{SEGMENT_BREAK:.1f}" height="{rows_h}" '
                f'fill="transparent"><title>{esc(f"{exact(skipped)} not shown")}</title></rect>'
            )
            x += SEGMENT_BREAK
    y = top + rows_h + 18
    out.append(_scale_bar(lay.scale, y, lay.widened))
    y += 18
    notes = [
        "hatched: bytes that group does not use in these blocks (padding, or a slot only "
        "other groups use)"
    ]
    if z.hidden_segments or z.hidden_chunks:
        notes.append(
            f"not drawn: {z.hidden_segments} more address segment(s), "
            f"{z.hidden_chunks} more block chunk(s) (see the views table)"
        )
    if lay.unnamed:
        notes.append(
            f"{lay.unnamed} chip(s) too narrow for their layer's name even for block 0 alone: "
            "hover them (or see the views table)"
        )
    hidden_groups = len(kinds) - len(groups)
    if hidden_groups:
        notes.append(f"{hidden_groups} more groups are not drawn (see the views table)")
    for note in notes:
        for line in wrap(note, width - LEFT - 4, 6.0):
            out.append(_t(LEFT, y, line, "s"))
            y += 14
    return _svg(width, y, "".join(out), f"zoom of pool {pool.name}")


def wrap(text: str, width: float, char_w: float = CHAR_W) -> list[str]:
    """``text`` in lines of at most ``width`` px, broken between words."""
    most = max(int(width / char_w), 8)
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= most:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _chip_label(layer: str, what: str, cx: float, cw: float, y: float) -> list[str]:
    """A zoom chip's text: the layer always when it fits, the block beside or under it."""
    mid = cx + cw / 2
    if text_fits(f"{layer}·{what}", cw):
        return [_t(mid, y + 19, f"{layer}·{what}", "lbl", "middle")]
    if text_fits(layer, cw) and text_fits(what, cw):
        return [_t(mid, y + 13, layer, "lbl", "middle"), _t(mid, y + 26, what, "lbl", "middle")]
    if text_fits(layer, cw):
        return [_t(mid, y + 19, layer, "lbl", "middle")]
    return []


def _scale_bar(scale: float, y: float, widened: int) -> str:
    """A bar of a power-of-two byte count, 40–80 px long at ``scale`` px per byte."""
    size = 1
    while size * 2 * scale <= 80:
        size *= 2
    length = size * scale
    x0, x1 = float(LEFT), LEFT + length
    note = f"{round_bytes(size)} (segments to scale"
    note += f"; {widened} segment(s) too small to see drawn wider)" if widened else ")"
    return (
        f'<path d="M{x0:.1f},{y - 4:.1f} v8 M{x0:.1f},{y:.1f} H{x1:.1f} M{x1:.1f},{y - 4:.1f} '
        f'v8" class="tick"/>' + _t(x1 + 6, y + 4, note, "s")
    )


def _seg_title(start: int, end: int) -> str:
    return f"bytes [{start:,}, {end:,}) ({exact(end - start)})"
