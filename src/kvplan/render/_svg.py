"""Inline SVG of one pool: the address band with its groups overlaid, sharers, the block zoom.

Every name from the plan goes through :func:`esc`; every shape carries a ``<title>`` with its
exact figures (shown on hover, no script). Colour is never the only carrier: groups also get
their own hatching and a ``gN`` label, changed items a text mark.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from html import escape
from typing import Literal

from kvplan.render._geometry import (
    block_stride_bytes,
    dense_page_bytes,
    extent,
    interleaved,
    is_padded,
    short,
    short_kind,
    zoom,
)
from kvplan.schemas.plan import Alias, BindingPlan, Pool, View
from kvplan.units import human_bytes

Mark = Literal["added", "removed", "changed"]
MARK_TEXT: dict[str, str] = {"added": "+", "removed": "−", "changed": "Δ"}

# Okabe–Ito (colour-blind safe), with a hatching per group for print and greyscale.
OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"]
HATCH = [
    '<path d="M0,8 L8,0" stroke="#000" stroke-opacity=".35" stroke-width="1.2"/>',
    '<path d="M0,0 L8,8" stroke="#000" stroke-opacity=".35" stroke-width="1.2"/>',
    '<circle cx="4" cy="4" r="1.3" fill="#000" fill-opacity=".4"/>',
    '<path d="M0,4 L8,4" stroke="#000" stroke-opacity=".35" stroke-width="1.2"/>',
    '<path d="M4,0 L4,8" stroke="#000" stroke-opacity=".35" stroke-width="1.2"/>',
    '<path d="M0,8 L8,0 M0,0 L8,8" stroke="#000" stroke-opacity=".3" stroke-width="1"/>',
    '<path d="M0,4 L8,4 M4,0 L4,8" stroke="#000" stroke-opacity=".3" stroke-width="1"/>',
]
CHAR_W = 7.0  # px per character at the 11 px font (DejaVu Sans digits, with margin)
LEFT = 124  # label column
ROW_H = 22
ROW_GAP = 4
ZOOM_H = 30
Place = tuple[float, float, float, int]  # a drawn stripe: x, width, bottom y, row


def esc(text: object) -> str:
    return escape(str(text), quote=True)


def exact(n: int) -> str:
    return f"{human_bytes(n)} ({n:,} B)"


COLOUR_NAMES = ("orange", "sky blue", "green", "yellow", "blue", "vermillion", "purple")
HATCH_NAMES = ("diagonal", "back-diagonal", "dots", "horizontal", "vertical", "cross", "grid")
STYLES = len(OKABE_ITO) * len(HATCH)
"""Distinct colour × hatching pairs; group ``g`` takes pair ``g % STYLES``."""


def style(group: int) -> tuple[int, int]:
    """(colour, hatching) of a group: g0..g6 differ in both, g7.. pair them differently."""
    k = group % STYLES
    colour = k % len(OKABE_ITO)
    return colour, (colour + k // len(OKABE_ITO)) % len(HATCH)


def style_name(group: int) -> str:
    colour, hatch = style(group)
    return f"{COLOUR_NAMES[colour]}, {HATCH_NAMES[hatch]} hatching"


def defs(groups: Iterable[int]) -> str:
    """Patterns for ``groups`` and the arrowhead, once per page (a page's SVGs share ids)."""
    parts = ['<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>']
    for k in sorted({g % STYLES for g in groups}):
        colour, hatch = style(k)
        parts.append(
            f'<pattern id="g{k}" width="8" height="8" patternUnits="userSpaceOnUse">'
            f'<rect width="8" height="8" fill="{OKABE_ITO[colour]}" fill-opacity=".55"/>'
            f"{HATCH[hatch]}</pattern>"
        )
    parts.append(
        '<pattern id="pad" width="6" height="6" patternUnits="userSpaceOnUse">'
        '<rect width="6" height="6" fill="#fff"/>'
        '<path d="M0,6 L6,0" stroke="#555" stroke-width="1"/></pattern>'
        '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#222"/></marker></defs></svg>'
    )
    return "".join(parts)


def fill(group: int) -> str:
    return f"url(#g{group % STYLES})"


def text_fits(text: str, width: float) -> bool:
    return len(text) * CHAR_W + 4 <= width


def fit(text: str, width: float) -> str:
    """``text`` cut with an ellipsis to ``width`` px ("" when not even one character fits)."""
    if text_fits(text, width):
        return text
    n = int((width - 4) / CHAR_W) - 1
    return text[:n] + "…" if n >= 1 else ""


def view_title(view: View, pool: Pool) -> str:
    lo, hi = extent(view)
    lines = [
        view.layer,
        f"group {view.group} · {view.kind} · pool {view.pool}",
        f"dtype {view.dtype} · shape {view.shape} · stride {view.stride} (elements)",
        f"offset {exact(view.offset_bytes)}",
        f"bytes [{lo:,}, {hi:,}) of {pool.size_bytes:,}: {exact(hi - lo)}",
    ]
    if len(view.shape) >= 2:
        page = dense_page_bytes(view)
        stride = block_stride_bytes(view)
        pad = f", padded to {exact(stride)}" if is_padded(view) else ""
        lines.append(f"block page {exact(page)}{pad}; block stride {exact(stride)}")
    return "\n".join(lines)


def _bracket(mark: str | None) -> str:
    return f"[{mark}] " if mark else ""


def _t(x: float, y: float, text: str, cls: str = "", anchor: str = "start") -> str:
    c = f' class="{cls}"' if cls else ""
    a = f' text-anchor="{anchor}"' if anchor != "start" else ""
    return f'<text x="{x:.1f}" y="{y:.1f}"{c}{a}>{esc(text)}</text>'


def _rect(x: float, y: float, w: float, h: float, paint: str, title: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 1.0):.1f}" height="{h:.1f}" '
        f'fill="{paint}"{c}><title>{esc(title)}</title></rect>'
    )


@dataclass
class Marks:
    """Diff marks for one side: pool, view and alias names → added/removed/changed."""

    pools: dict[str, Mark] = field(default_factory=dict)
    views: dict[str, Mark] = field(default_factory=dict)
    aliases: dict[str, Mark] = field(default_factory=dict)

    def tag(self, kind: Literal["pools", "views", "aliases"], name: str) -> str:
        mark = getattr(self, kind).get(name)
        return MARK_TEXT[mark] if mark else ""


@dataclass
class _Stripe:
    x: float
    w: float
    views: list[View]


def _stripes(views: list[View], x0: float, scale: float) -> list[_Stripe]:
    """One stripe per view; runs of adjacent views merged where a label would not fit."""
    out: list[_Stripe] = []
    for view in sorted(views, key=lambda v: extent(v)):
        lo, hi = extent(view)
        x, w = x0 + lo * scale, (hi - lo) * scale
        last = out[-1] if out else None
        if (
            last is not None
            and not text_fits(_stripe_label(last, Marks()), last.w)
            and x - (last.x + last.w) < 1.0
        ):
            last.w = x + w - last.x
            last.views.append(view)
        else:
            out.append(_Stripe(x, w, [view]))
    return out


def _stripe_label(stripe: _Stripe, marks: Marks) -> str:
    views = stripe.views
    tag = "".join(sorted({marks.tag("views", v.layer) for v in views}))
    if len(views) == 1:
        return tag + short(views[0].layer)
    return f"{tag}{short(views[0].layer)}…{short(views[-1].layer)}"


def _stripe_rect(
    stripe: _Stripe, y: float, group: int, pool: Pool, marks: Marks, marked: bool
) -> str:
    """One stripe of a group's row: its rectangle in the group's colour, with its title."""
    cls = "stripe marked" if marked else "stripe"
    return _rect(stripe.x, y, stripe.w, ROW_H, fill(group), _stripe_title(stripe, pool, marks), cls)


def _stripe_title(stripe: _Stripe, pool: Pool, marks: Marks, full: int = 3) -> str:
    views = stripe.views
    parts = []
    if len(views) > 1:
        lo = min(extent(v)[0] for v in views)
        hi = max(extent(v)[1] for v in views)
        parts.append(f"{len(views)} views, bytes [{lo:,}, {hi:,}) ({exact(hi - lo)})")
    for view in views[:full]:
        mark = marks.views.get(view.layer)
        head = f"[{mark}] " if mark else ""
        parts.append(head + view_title(view, pool))
    if len(views) > full:
        parts.append(f"… and {len(views) - full} more views (see the views table)")
    return "\n\n".join(parts)


def pool_band(plan: BindingPlan, pool: Pool, width: int, scale: float, marks: Marks) -> str:
    """The pool as an address band to scale, one row per group overlaid from byte 0, sharers."""
    views = [v for v in plan.views if v.pool == pool.name]
    by_group: dict[int, list[View]] = defaultdict(list)
    for view in views:
        by_group[view.group].append(view)
    groups = sorted(by_group)
    band_w = max(pool.size_bytes * scale, 40.0)
    px = band_w / max(pool.size_bytes, 1)
    top = 40
    out: list[str] = []
    tag = marks.tag("pools", pool.name)
    out.append(
        _t(
            0,
            14,
            f"{tag}pool {pool.name} · {human_bytes(pool.size_bytes)} ({pool.size_bytes:,} B) · "
            f"alignment {pool.alignment_bytes:,} B · {pool.num_blocks:,} blocks",
            "h",
        )
    )
    rows_h = max(len(groups), 1) * (ROW_H + ROW_GAP)
    out.append(
        f'<rect x="{LEFT}" y="{top - 4}" width="{band_w:.1f}" height="{rows_h + 4}" '
        f'class="{"band marked" if tag else "band"}"><title>{esc(_pool_title(pool, marks))}'
        f"</title></rect>"
    )
    for at in _ticks(views, pool.size_bytes, px):
        x = LEFT + at * px
        anchor = "start" if at == 0 else ("end" if at == pool.size_bytes else "middle")
        out.append(f'<path d="M{x:.1f},{top - 10} v6" class="tick"/>')
        out.append(_t(x, top - 13, human_bytes(at), "s", anchor))
    centres: dict[str, Place] = {}
    for row, gid in enumerate(groups):
        y = top + row * (ROW_H + ROW_GAP)
        members = by_group[gid]
        label = f"g{gid} {short_kind(members[0].kind)}"
        out.append(_t(0, y + 15, fit(label, LEFT - 6)))
        if interleaved(members) and len(members) > 1:
            lo = min(extent(v)[0] for v in members)
            hi = max(extent(v)[1] for v in members)
            names = " ".join(short(v.layer) for v in members[:12])
            more = f" +{len(members) - 12}" if len(members) > 12 else ""
            tags = "".join(sorted({marks.tag("views", v.layer) for v in members}))
            text = f"{tags}{names}{more} interleaved block by block (see zoom)"
            stripe = _Stripe(LEFT + lo * px, (hi - lo) * px, members)
            out.append(_stripe_rect(stripe, y, gid, pool, marks, bool(tags)))
            out.append(_t(stripe.x + 4, y + 15, fit(text, stripe.w - 6), "lbl"))
            for view in members:
                centres[view.layer] = (stripe.x, stripe.w, y + ROW_H, row)
            continue
        for stripe in _stripes(members, LEFT, px):
            label = _stripe_label(stripe, marks)
            marked = any(marks.views.get(v.layer) for v in stripe.views)
            out.append(_stripe_rect(stripe, y, gid, pool, marks, marked))
            label = fit(label, stripe.w)
            if label:
                out.append(_t(stripe.x + stripe.w / 2, y + 15, label, "lbl", "middle"))
            for view in stripe.views:
                centres[view.layer] = (stripe.x, stripe.w, y + ROW_H, row)
    bottom = float(top + rows_h + 6)
    aliases = [a for a in plan.aliases if a.target in centres]
    if aliases:
        lane, bottom = _sharers(aliases, centres, bottom, width, marks)
        out.append(lane)
    return _svg(width, bottom + 4, "".join(out), f"pool {pool.name}")


def _ticks(views: list[View], size: int, px: float, gap: float = 70.0) -> list[int]:
    """Axis ticks: where the layer slots start when there are a few, else quarters."""
    starts = sorted({extent(v)[0] for v in views} | {0, size})
    kept = [0]
    for at in starts[1:]:
        if ((at - kept[-1]) * px >= gap and (size - at) * px >= gap) or at == size:
            kept.append(at)
    if len(starts) > 9 or len(kept) < 3:
        return [size * k // 4 for k in range(5)]
    return kept


def _pool_title(pool: Pool, marks: Marks) -> str:
    mark = marks.pools.get(pool.name)
    return (
        f"{'[' + mark + '] ' if mark else ''}pool {pool.name}\nsize {exact(pool.size_bytes)}\n"
        f"alignment {pool.alignment_bytes:,} B\nblocks {pool.num_blocks:,}"
    )


@dataclass
class _Cluster:
    members: list[Alias]
    places: list[Place]
    x: float = 0.0
    w: float = 0.0


def _clusters(
    aliases: list[Alias], centres: dict[str, Place], avail: float, chip: float
) -> tuple[list[_Cluster], bool]:
    """Sharers grouped per target (one chip each), or per drawn stripe when that is too wide."""
    by_target: dict[str, list[Alias]] = defaultdict(list)
    for alias in aliases:
        by_target[alias.target].append(alias)
    need = len(aliases) * (chip + 3) + 14 * len(by_target)
    if need <= avail:
        targets = sorted(by_target, key=lambda t: centres[t])
        return [_Cluster(by_target[t], [centres[t]]) for t in targets], False
    by_place: dict[Place, list[Alias]] = defaultdict(list)
    for alias in aliases:
        by_place[centres[alias.target]].append(alias)
    places = sorted(by_place)
    most = max(int(avail // 62), 1)
    per = -(-len(places) // most)
    return [
        _Cluster([a for p in places[i : i + per] for a in by_place[p]], list(places[i : i + per]))
        for i in range(0, len(places), per)
    ], True


def _sharers(
    aliases: list[Alias],
    centres: dict[str, Place],
    y: float,
    width: int,
    marks: Marks,
) -> tuple[str, float]:
    """The sharers lane: chips owning 0 bytes, a bus per target, an arrow to the target.

    With too many sharers for one chip each, one chip per drawn stripe (or run of stripes)
    counts them; the aliases table names every one.
    """
    chip_w = max(max(len(short(a.layer)) for a in aliases) * CHAR_W + 6, 28.0)
    gap, cluster_gap = 3.0, 14.0
    avail = width - LEFT - 4
    clusters, compact = _clusters(aliases, centres, avail, chip_w)
    if compact:
        each = min(chip_w * 3.2, (avail - cluster_gap * len(clusters)) / len(clusters))
        for c in clusters:
            c.w = max(each, 24.0)
    else:
        for c in clusters:
            c.w = len(c.members) * (chip_w + gap) - gap
    # pack clusters left to right under their targets, then shift back inside the width
    cursor = float(LEFT)
    for c in clusters:
        want = sum(x + w / 2 for x, w, _, _ in c.places) / len(c.places)
        c.x = max(want - c.w / 2, cursor)
        cursor = c.x + c.w + cluster_gap
    overflow = cursor - cluster_gap - (width - 4)
    if overflow > 0:
        cursor = float(LEFT)
        for c in clusters:
            c.x = max(c.x - overflow, cursor)
            cursor = c.x + c.w + cluster_gap
    lane_y = y + 34
    out = [_t(0, lane_y + 13, "sharers (own 0 B)")]
    arrows: list[str] = []
    for c in clusters:
        x, members = c.x, c.members
        bus_mid = x + c.w / 2
        if compact:
            listed = "\n".join(
                f"{_bracket(marks.aliases.get(a.layer))}{a.layer} → {a.target}"
                for a in members[:40]
            )
            more = f"\n… and {len(members) - 40} more" if len(members) > 40 else ""
            marked = "".join(sorted({marks.tag("aliases", a.layer) for a in members}))
            label = f"{marked}{len(members)} sharers"
            out.append(
                _rect(
                    x,
                    lane_y,
                    c.w,
                    18,
                    "#fff",
                    f"{len(members)} sharers (own 0 bytes each):\n{listed}{more}",
                    "chip marked" if marked else "chip",
                )
            )
            label = label if text_fits(label, c.w) else fit(f"{marked}{len(members)}", c.w)
            out.append(_t(bus_mid, lane_y + 13, label, "s", "middle"))
        else:
            for i, alias in enumerate(members):
                cx = x + i * (chip_w + gap)
                tag = marks.tag("aliases", alias.layer)
                mark = marks.aliases.get(alias.layer)
                title = (
                    f"{'[' + mark + '] ' if mark else ''}{alias.layer}\nKV sharing: bound to the "
                    f"tensor of {alias.target}\nowns 0 bytes"
                )
                out.append(
                    _rect(cx, lane_y, chip_w, 18, "#fff", title, "chip marked" if tag else "chip")
                )
                out.append(
                    _t(cx + chip_w / 2, lane_y + 13, tag + short(alias.layer), "s", "middle")
                )
                out.append(f'<path d="M{cx + chip_w / 2:.1f},{lane_y} v-6" class="bus"/>')
            out.append(
                f'<path d="M{x + chip_w / 2:.1f},{lane_y - 6} H{x + c.w - chip_w / 2:.1f}" '
                f'class="bus"/>'
            )
        start_y = lane_y - (0 if compact else 6)
        targets = sorted({a.target for a in members})
        what = f"{len(members)} sharer(s) → {', '.join(targets[:6])}"
        what += " …" if len(targets) > 6 else ""
        for sx, sw, ty, _ in c.places:
            inset = min(8.0, sw / 2)
            tx = min(max(bus_mid, sx + inset), sx + sw - inset)
            path = f"M{bus_mid:.1f},{start_y:.1f} L{tx:.1f},{ty + 2:.1f}"
            arrows.append(f'<path d="{path}" class="halo"/>')
            arrows.append(
                f'<path d="{path}" class="arrow" marker-end="url(#arrow)">'
                f"<title>{esc(what)}</title></path>"
            )
    return "".join(arrows) + "".join(out), lane_y + 22


def _svg(width: float, height: float, body: str, label: str) -> str:
    return (
        f'<svg width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{esc(label)}">'
        f"{body}</svg>"
    )


def pool_zoom(plan: BindingPlan, pool: Pool, width: int, marks: Marks, blocks: int = 4) -> str:
    """Where blocks 0..blocks-1 of each layer live: a broken address axis, one row per group."""
    views = [v for v in plan.views if v.pool == pool.name]
    if not views:
        return ""
    z = zoom(views, blocks)
    groups = sorted({v.group for v in views})
    brk = 30.0
    avail = width - LEFT - 4 - brk * (len(z.segments) - 1)
    total = sum(s.end - s.start for s in z.segments) or 1
    top = 44
    out = [
        _t(
            0,
            14,
            f"zoom: blocks 0–{blocks - 1} of pool {pool.name} (where block b of each layer lives)",
            "h",
        )
    ]
    rows_h = len(groups) * (ZOOM_H + ROW_GAP)
    for row, gid in enumerate(groups):
        kind = next(v.kind for v in views if v.group == gid)
        out.append(
            _t(0, top + row * (ZOOM_H + ROW_GAP) + 19, fit(f"g{gid} {short_kind(kind)}", LEFT - 6))
        )
    x = float(LEFT)
    for i, seg in enumerate(z.segments):
        w = max((seg.end - seg.start) / total * avail, 24.0)
        px = w / max(seg.end - seg.start, 1)
        out.append(_t(x, top - 22, f"@ {human_bytes(seg.start)}", "s"))
        out.append(_t(x, top - 10, f"{seg.start:,} B", "s"))
        out.append(
            f'<rect x="{x:.1f}" y="{top - 3}" width="{w:.1f}" height="{rows_h + 2}" '
            f'fill="url(#pad)" class="seg"><title>{esc(_seg_title(seg.start, seg.end))}</title>'
            f"</rect>"
        )
        for chunk in seg.chunks:
            row = groups.index(chunk.view.group)
            y = top + row * (ZOOM_H + ROW_GAP)
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
                    fill(chunk.view.group),
                    title,
                    "stripe marked" if mark else "stripe",
                )
            )
            layer = short(chunk.view.layer)
            if text_fits(f"{layer}·{what}", cw):
                out.append(_t(cx + cw / 2, y + 19, f"{layer}·{what}", "lbl", "middle"))
            elif text_fits(layer, cw) and text_fits(what, cw):
                out.append(_t(cx + cw / 2, y + 13, layer, "lbl", "middle"))
                out.append(_t(cx + cw / 2, y + 26, what, "lbl", "middle"))
            else:  # one line: the layer where its blocks start, the block after that
                for label in (layer, what) if chunk.block == 0 else (what,):
                    if text_fits(label, cw):
                        out.append(_t(cx + cw / 2, y + 19, label, "lbl", "middle"))
                        break
        x += w
        if i < len(z.segments) - 1:
            skipped = z.segments[i + 1].start - seg.end
            out.append(_t(x + brk / 2, top + rows_h / 2 + 4, "⋯", "brk", "middle"))
            out.append(
                f'<rect x="{x:.1f}" y="{top}" width="{brk:.1f}" height="{rows_h}" '
                f'fill="transparent"><title>{esc(f"{exact(skipped)} not shown")}</title></rect>'
            )
            x += brk
    y = top + rows_h + 14
    notes = [
        "hatched: bytes that group does not use in these blocks (padding, or a slot only "
        "other groups use)"
    ]
    if z.hidden_segments or z.hidden_chunks:
        notes.append(
            f"not drawn: {z.hidden_segments} more address segment(s), "
            f"{z.hidden_chunks} more block chunk(s) (see the views table)"
        )
    for note in notes:
        out.append(_t(LEFT, y, note, "s"))
        y += 14
    return _svg(width, y, "".join(out), f"zoom of pool {pool.name}")


def _seg_title(start: int, end: int) -> str:
    return f"bytes [{start:,}, {end:,}) ({exact(end - start)})"
