"""Inline SVG of one pool: the address band with its groups overlaid, sharers, the block zoom.

Every name from the plan goes through :func:`esc`; every shape carries a ``<title>`` with its
exact figures (shown on hover, no script). Colour is never the only carrier: groups also get
their own hatching and a ``gN`` label, changed items a text mark.

Every function here is linear in what it draws, and what it draws is bounded (rows, stripes
merged below a label's width, zoom segments and chunks, sharer chips), whatever the plan's size.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
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
)
from kvplan.render._palette import OKABE_ITO, STYLES, style
from kvplan.schemas.errors import UNSAFE_CHARS
from kvplan.schemas.plan import Alias, BindingPlan, Pool, View
from kvplan.units import human_bytes

Mark = Literal["added", "removed", "changed"]
MARK_TEXT: dict[str, str] = {"added": "+", "removed": "−", "changed": "Δ"}

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
MAX_GROUP_ROWS = 24
"""Group rows drawn per band and zoom; the legend and the views table name every group."""
MAX_POOLS_DRAWN = 8
"""Pools drawn as bands on one page (every page lists every pool in a table)."""
ARROW_HEAD = 8.0
LABEL_PAD = 3.0
"""Room kept free of arrows around a label (its white outline is 1.5 px)."""
Place = tuple[float, float, float, int]  # a drawn stripe: x, width, bottom y, row


_CONTROL = re.compile(f"[\x00-\x09\x0b-\x1f{UNSAFE_CHARS}]")  # line breaks kept


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def esc(text: object) -> str:
    """``text`` for HTML: escaped, control and bidi-override characters shown as ``\\x1b``
    (a document's names cannot hide or reorder what the page says); line breaks kept (the
    tooltips' lines)."""
    return escape(_CONTROL.sub(_visible, str(text)), quote=True)


def exact(n: int) -> str:
    return f"{human_bytes(n)} ({n:,} B)"


def round_bytes(n: int) -> str:
    """A power of two in its largest whole unit: ``512 B``, ``16 KiB``, ``2 MiB``."""
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


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
class Look:
    """How one plan is drawn on a page: its diff marks and each group's style."""

    marks: Marks = field(default_factory=Marks)
    styles: Mapping[int, int] = field(default_factory=dict)

    def style(self, group: int) -> int:
        return self.styles.get(group, group) % STYLES

    def fill(self, group: int) -> str:
        return f"url(#s{self.style(group)})"


def defs(styles: Iterable[int]) -> str:
    """Patterns for the style indices used and the arrowhead, once per page (a page's SVGs
    share ids)."""
    parts = ['<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>']
    for k in sorted({s % STYLES for s in styles}):
        colour, hatch = style(k)
        parts.append(
            f'<pattern id="s{k}" width="8" height="8" patternUnits="userSpaceOnUse">'
            f'<rect width="8" height="8" fill="{OKABE_ITO[colour]}" fill-opacity=".55"/>'
            f"{HATCH[hatch]}</pattern>"
        )
    parts.append(
        '<pattern id="pad" width="6" height="6" patternUnits="userSpaceOnUse">'
        '<rect width="6" height="6" fill="#fff"/>'
        '<path d="M0,6 L6,0" stroke="#555" stroke-width="1"/></pattern>'
        f'<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="{ARROW_HEAD:g}" '
        f'markerHeight="{ARROW_HEAD:g}" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#222"/></marker></defs></svg>'
    )
    return "".join(parts)


def text_width(text: str) -> float:
    return len(text) * CHAR_W


def text_fits(text: str, width: float) -> bool:
    return text_width(text) + 4 <= width


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
class _Stripe:
    x: float
    w: float
    views: list[View]


def _range_label(first: View, last: View | None) -> str:
    return short(first.layer) if last is None else f"{short(first.layer)}…{short(last.layer)}"


def _stripes(views: list[View], x0: float, scale: float) -> list[_Stripe]:
    """One stripe per view; runs of adjacent views merged where a label would not fit."""
    out: list[_Stripe] = []
    for view in sorted(views, key=lambda v: extent(v)):
        lo, hi = extent(view)
        x, w = x0 + lo * scale, (hi - lo) * scale
        last = out[-1] if out else None
        if last is not None and x - (last.x + last.w) < 1.0:
            tail = last.views[-1] if len(last.views) > 1 else None
            if not text_fits(_range_label(last.views[0], tail), last.w):
                last.w = x + w - last.x
                last.views.append(view)
                continue
        out.append(_Stripe(x, w, [view]))
    return out


def _stripe_label(stripe: _Stripe, marks: Marks) -> str:
    views = stripe.views
    tag = "".join(sorted({marks.tag("views", v.layer) for v in views}))
    return tag + _range_label(views[0], views[-1] if len(views) > 1 else None)


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


@dataclass
class _Label:
    """A stripe's label, drawn after the arrows are placed (an arrow it cannot avoid cuts it)."""

    row: int
    y: float
    text: str
    x0: float  # the stripe's room for it
    x1: float
    start: bool  # left-aligned at x0 + 4 (else centred in [x0, x1])

    @property
    def span(self) -> tuple[float, float]:
        if self.start:
            return (self.x0 + 4, self.x0 + 4 + text_width(self.text))
        mid, half = (self.x0 + self.x1) / 2, text_width(self.text) / 2
        return (mid - half, mid + half)

    def clear_of(self, x: float) -> None:
        """Cut or move the text so that it stays ``LABEL_PAD`` px away from ``x`` (as far as
        :func:`_stem_x` keeps arrows from labels: a label it kept clear is left alone)."""
        lo, hi = self.span
        pad = LABEL_PAD
        if not lo - pad < x < hi + pad:
            return
        left, right = (self.x0, x - pad), (x + pad, self.x1)
        if self.start:
            self.text = fit(self.text, left[1] - left[0] - 4) if left[1] - left[0] > 8 else ""
            return
        room = max(left, right, key=lambda r: r[1] - r[0])
        self.x0, self.x1 = room
        self.text = fit(self.text, room[1] - room[0])

    def svg(self) -> str:
        if not self.text:
            return ""
        if self.start:
            return _t(self.x0 + 4, self.y, self.text, "lbl")
        return _t((self.x0 + self.x1) / 2, self.y, self.text, "lbl", "middle")


@dataclass
class _Band:
    """What the sharers lane needs from the band: where each layer and each label is."""

    top: float
    bottom: float
    centres: dict[str, Place] = field(default_factory=dict)
    labels: list[_Label] = field(default_factory=list)


def pool_bands(
    plan: BindingPlan, width: float, draw: Callable[[Pool, float], str], listed_in: str
) -> list[str]:
    """``draw(pool, scale)`` for the first :data:`MAX_POOLS_DRAWN` pools, on one byte scale
    (the largest pool fills the width), then a note of how many are not drawn and where
    ``listed_in`` lists them."""
    largest = max((p.size_bytes for p in plan.pools), default=1) or 1
    scale = (width - LEFT - 8) / largest
    parts = [draw(pool, scale) for pool in plan.pools[:MAX_POOLS_DRAWN]]
    hidden = len(plan.pools) - MAX_POOLS_DRAWN
    if hidden > 0:
        parts.append(f"<p class='meta'>{hidden} more pools are not drawn; {listed_in}.</p>")
    return parts


def pool_band(plan: BindingPlan, pool: Pool, width: int, scale: float, look: Look) -> str:
    """The pool as an address band to scale, one row per group overlaid from byte 0, sharers."""
    marks = look.marks
    views = [v for v in plan.views if v.pool == pool.name]
    by_group: dict[int, list[View]] = defaultdict(list)
    for view in views:
        by_group[view.group].append(view)
    groups = sorted(by_group)
    hidden = groups[MAX_GROUP_ROWS:]
    groups = groups[:MAX_GROUP_ROWS]
    band_w = max(pool.size_bytes * scale, 40.0)
    px = band_w / max(pool.size_bytes, 1)
    top = 40
    out: list[str] = []
    tag = marks.tag("pools", pool.name)
    head = (
        f"{tag}pool {pool.name} · {human_bytes(pool.size_bytes)} ({pool.size_bytes:,} B) · "
        f"alignment {pool.alignment_bytes:,} B · {pool.num_blocks:,} blocks"
    )
    out.append(_t(0, 14, fit(head, width / 1.15), "h"))  # bold 12 px: wider than 11 px
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
    band = _Band(top, top + rows_h)
    for row, gid in enumerate(groups):
        y = top + row * (ROW_H + ROW_GAP)
        members = by_group[gid]
        label = f"g{gid} {short_kind(members[0].kind)}"
        out.append(_t(0, y + 15, fit(label, LEFT - 6)))
        if len(members) > 1 and interleaved(members):
            lo = min(extent(v)[0] for v in members)
            hi = max(extent(v)[1] for v in members)
            names = " ".join(short(v.layer) for v in members[:12])
            more = f" +{len(members) - 12}" if len(members) > 12 else ""
            tags = "".join(sorted({marks.tag("views", v.layer) for v in members}))
            stripe = _Stripe(LEFT + lo * px, (hi - lo) * px, members)
            text = fit(f"{tags}{names}{more} interleaved block by block (see zoom)", stripe.w - 6)
            out.append(_stripe_rect(stripe, y, gid, pool, look, bool(tags)))
            if text:
                band.labels.append(_Label(row, y + 15, text, stripe.x, stripe.x + stripe.w, True))
            for view in members:
                band.centres[view.layer] = (stripe.x, stripe.w, y + ROW_H, row)
            continue
        for stripe in _stripes(members, LEFT, px):
            marked = any(marks.views.get(v.layer) for v in stripe.views)
            out.append(_stripe_rect(stripe, y, gid, pool, look, marked))
            label = fit(_stripe_label(stripe, marks), stripe.w)
            if label:
                band.labels.append(_Label(row, y + 15, label, stripe.x, stripe.x + stripe.w, False))
            for view in stripe.views:
                band.centres[view.layer] = (stripe.x, stripe.w, y + ROW_H, row)
    bottom = float(top + rows_h + 6)
    if hidden:
        out.append(
            _t(
                LEFT,
                bottom + 10,
                f"{len(hidden)} more groups (g{hidden[0]}…g{hidden[-1]}) are not drawn: "
                "the legend and the views table list them",
                "s",
            )
        )
        bottom += 14
    aliases = [a for a in plan.aliases if a.target in band.centres]
    lane = ""
    if aliases:
        lane, bottom, stems = _sharers(aliases, band, bottom, width, marks)
        for x, row in stems:  # an arrow that found no way between the labels cuts them
            for item in band.labels:
                if item.row >= row:
                    item.clear_of(x)
    out.extend(item.svg() for item in band.labels)
    out.append(lane)
    return _svg(width, bottom + 4, "".join(out), f"pool {pool.name}")


def _stripe_rect(
    stripe: _Stripe, y: float, group: int, pool: Pool, look: Look, marked: bool
) -> str:
    """One stripe of a group's row: its rectangle in the group's style, with its title."""
    cls = "stripe marked" if marked else "stripe"
    title = _stripe_title(stripe, pool, look.marks)
    return _rect(stripe.x, y, stripe.w, ROW_H, look.fill(group), title, cls)


def _ticks(views: list[View], size: int, px: float, gap: float = 70.0) -> list[int]:
    """Axis ticks: where the layer slots start when there are a few, else quarters."""
    starts = sorted({extent(v)[0] for v in views} | {0, size})
    kept = [0]
    for at in starts[1:]:
        if ((at - kept[-1]) * px >= gap and (size - at) * px >= gap) or at == size:
            kept.append(at)
    if len(starts) > 9 or len(kept) < 3:
        quarters = [size * k // 4 for k in range(1, 4)]
        return [0, *(q for q in quarters if (q - 0) * px >= gap and (size - q) * px >= gap), size]
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


def _free_x(lo: float, hi: float, want: float, blocked: list[tuple[float, float]]) -> float | None:
    """The point of ``[lo, hi]`` nearest ``want`` outside every ``blocked`` interval."""
    if lo > hi:
        return None
    gaps: list[tuple[float, float]] = []
    cursor = lo
    for a, b in sorted(blocked):
        if b < cursor:
            continue
        if a > hi:
            break
        if a > cursor:
            gaps.append((cursor, a))
        cursor = max(cursor, b)
    if cursor <= hi:
        gaps.append((cursor, hi))
    best: float | None = None
    for a, b in gaps:
        x = min(max(want, a), b)
        if best is None or abs(x - want) < abs(best - want):
            best = x
    return best


def _stem_x(place: Place, want: float, band: _Band, stems: list[float]) -> float:
    """Where an arrow to ``place`` enters it: inside the stripe, clear of every label in the
    rows it crosses (the target's row and those below it) and of the other arrows."""
    sx, sw, _, row = place
    inset = min(sw / 2, max(6.0, min(24.0, sw / 8)))  # clear of the stripe's edges
    lo, hi = sx + inset, sx + sw - inset
    labels = [
        (lo - LABEL_PAD, hi + LABEL_PAD)
        for lo, hi in (label.span for label in band.labels if label.row >= row)
    ]
    others = [(x - 5.0, x + 5.0) for x in stems]
    for blocked in (labels + others, labels):
        found = _free_x(lo, hi, want, blocked)
        if found is not None:
            return found
    return min(max(want, lo), hi)


def _sharers(
    aliases: list[Alias],
    band: _Band,
    y: float,
    width: int,
    marks: Marks,
) -> tuple[str, float, list[tuple[float, int]]]:
    """The sharers lane: chips owning 0 bytes, a bus per target, an arrow into the target;
    also each arrow's x and the row it ends in.

    Each arrow runs straight up into its target's stripe and ends inside that stripe's row (its
    head within the row), entering where no label of the rows it crosses is; under the chips a
    line says which layers they read. With too many sharers for one chip each, one chip per
    drawn stripe (or run of stripes) counts them; the aliases table names every one.
    """
    centres = band.centres
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
    stems: list[float] = []
    ends: list[tuple[float, int]] = []
    elbows = 0
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
            bus = (x + 4, x + c.w - 4, float(lane_y))
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
            first, last = x + chip_w / 2, x + c.w - chip_w / 2
            out.append(f'<path d="M{first:.1f},{lane_y - 6} H{last:.1f}" class="bus"/>')
            bus = (first, last, float(lane_y - 6))
        targets = list(dict.fromkeys(a.target for a in members))
        names = ", ".join(short(t) for t in targets[:4]) + (" …" if len(targets) > 4 else "")
        reads = fit(f"↑ read {names}", c.w + cluster_gap - 2)
        if reads:
            out.append(_t(bus_mid, lane_y + 31, reads, "s", "middle"))
        what = f"{len(members)} sharer(s) → {', '.join(targets[:6])}"
        what += " …" if len(targets) > 6 else ""
        for place in c.places:
            tx = _stem_x(place, min(max(bus_mid, bus[0]), bus[1]), band, stems)
            stems.append(tx)
            ends.append((tx, place[3]))
            tip = place[2] - ROW_H + ARROW_HEAD + 6  # the head lies inside the target's row
            if bus[0] <= tx <= bus[1]:
                path = f"M{tx:.1f},{bus[2]:.1f} V{tip:.1f}"
            else:  # along the gap under the band, then up
                level = band.bottom + 10 + 5 * (elbows % 4)
                elbows += 1
                path = f"M{bus_mid:.1f},{bus[2]:.1f} V{level:.1f} H{tx:.1f} V{tip:.1f}"
            arrows.append(f'<path d="{path}" class="halo"/>')
            arrows.append(
                f'<path d="{path}" class="arrow" marker-end="url(#arrow)">'
                f"<title>{esc(what)}</title></path>"
            )
    return "".join(arrows) + "".join(out), lane_y + 36, ends


def _svg(width: float, height: float, body: str, label: str) -> str:
    return (
        f'<svg width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{esc(label)}">'
        f"{body}</svg>"
    )
