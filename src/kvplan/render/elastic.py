"""The page of ``kvplan top DIR --html OUT``: the state of elastic engines drawn on their plans.

For each rank: its budget (mapped bytes, split into live / cached / other mapped from the block
counts, against the limit in force, the limit asked and the floor) and, per pool of the
engine's plan, the address band with the plan's layers and the chunks the snapshot says are
mapped (``ElasticStats.mapped_runs``). A pure function of stats snapshots and plans (the CLI
reads the files); linear in the runs and the views, and bounded: at most
:data:`~kvplan.render._svg.MAX_POOLS_DRAWN` pools per rank, one rectangle per pixel column at
most.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvplan.elastic.files import ElasticStats
from kvplan.elastic.group import GroupSnapshot
from kvplan.render._geometry import block_stride_bytes, extent, short
from kvplan.render._palette import palette
from kvplan.render._svg import (
    LEFT,
    MAX_GROUP_ROWS,
    Look,
    Marks,
    _Stripe,
    _stripes,
    _svg,
    _t,
    defs,
    esc,
    exact,
    fit,
    pool_bands,
    text_width,
    view_title,
)
from kvplan.schemas.errors import Diagnostic
from kvplan.schemas.plan import BindingPlan, Pool, View
from kvplan.units import human_bytes

MAX_RUNS_LISTED = 64
"""Runs listed per pool in the page's fold-out table (the band draws all of them)."""
WIDTH = 900
ROW = 14
MAPPED_H = 22
UNKNOWN_STYLE = ' style="fill:url(#pad)"'


@dataclass(frozen=True)
class EngineView:
    """One rank on the page: its snapshot, what ``kvplan top`` says of it, its plan (None when
    there is none to draw on; ``problem`` says why)."""

    path: Path
    stats: ElasticStats
    status: str
    age_seconds: float
    plan: BindingPlan | None = None
    problem: Diagnostic | None = None


def plan_mismatch(stats: ElasticStats, plan: BindingPlan) -> str | None:
    """Why ``plan`` is not the plan ``stats`` was taken on; None when it fits."""
    if stats.plan_fingerprint is not None and stats.plan_fingerprint != plan.fingerprint:
        return (
            f"its fingerprint {plan.fingerprint[:19]}… is not the {stats.plan_fingerprint[:19]}… "
            "the stats name"
        )
    if plan.source.num_blocks != stats.num_blocks:
        return f"it has {plan.source.num_blocks:,} blocks, the stats {stats.num_blocks:,}"
    runs = stats.mapped_runs or {}
    if runs and stats.chunk_bytes <= 0:
        return "the stats list mapped runs but their chunk_bytes is 0"
    pools = plan.pool_by_name
    for name, items in runs.items():
        pool = pools.get(name)
        if pool is None:
            return f"the stats map chunks of a pool {name[:80]!r} the plan does not have"
        chunks = -(-pool.size_bytes // stats.chunk_bytes)
        if items and items[-1][0] * stats.mapped_runs_unit >= max(chunks, 1):
            last = items[-1][0] * stats.mapped_runs_unit
            return (
                f"the stats map chunk {last:,} of pool {name[:80]!r}, which has {chunks:,} "
                f"chunks of {human_bytes(stats.chunk_bytes)}"
            )
    return None


CSS = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
margin:16px 20px;color:#111;background:#fff}
h1{font-size:18px;margin:0 0 2px}h2{font-size:15px;margin:18px 0 4px}
.meta{color:#444;margin:0 0 8px;font-size:12px}
svg{display:block;margin:0 0 8px;overflow:visible}
svg text{font:11px system-ui,-apple-system,"DejaVu Sans",sans-serif;fill:#111}
svg text.h{font-weight:600;font-size:12px}svg text.s{font-size:10px;fill:#333}
svg text.lbl{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
.band{fill:#f3f3f3;stroke:#333;stroke-width:1}.stripe{stroke:#222;stroke-width:.6}
.tick{stroke:#333}.unmapped{fill:#fff;stroke:#333;stroke-width:1}
.mapped{fill:#222}.partly{fill:#888}.live{fill:#0072B2}.cached{fill:#E69F00}.other{fill:#999}
.limit{stroke:#D55E00;stroke-width:2}.floor{stroke:#333;stroke-width:1.5;stroke-dasharray:4 2}
.asked{stroke:#CC79A7;stroke-width:2;stroke-dasharray:2 2}
table{border-collapse:collapse;font-size:12px;margin:4px 0 10px}
th,td{border:1px solid #bbb;padding:2px 6px;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#eee;white-space:nowrap}
.bad{color:#b00;font-weight:600}.warn{color:#8a5a00}
details{margin:6px 0}summary{cursor:pointer;font-weight:600}
"""


def _block_bytes(view: EngineView) -> tuple[float, bool]:
    """Bytes one block takes across all pools, and whether that is exact (from the plan)."""
    plan = view.plan
    if plan is not None and plan.pools:
        return sum(p.size_bytes / max(p.num_blocks, 1) for p in plan.pools), True
    s = view.stats
    return s.reserved_bytes / max(s.num_blocks, 1), False


def _split(view: EngineView) -> tuple[int, int, int]:
    """(live, cached, other) bytes of what is mapped, from the block counts."""
    s = view.stats
    per, _ = _block_bytes(view)
    live = min(s.mapped_bytes, round(s.live_blocks * per))
    cached = min(s.mapped_bytes - live, round(s.cached_blocks * per))
    return live, cached, s.mapped_bytes - live - cached


def _budget(view: EngineView) -> str:
    """The budget bar: mapped bytes (live, cached, other) against limit, asked, floor, peak."""
    s = view.stats
    live, cached, other = _split(view)
    marks = [s.limit_bytes, s.mapped_bytes, s.peak_mapped_bytes]
    marks += [m for m in (s.floor_bytes, s.asked_limit_bytes) if m is not None]
    top = max(max(marks), 1)
    bar_w = WIDTH - LEFT - 60
    px = bar_w / top
    y = 22
    out = [_t(0, 14, "budget", "h"), _t(0, y + 13, "mapped")]
    out.append(
        f'<rect x="{LEFT}" y="{y}" width="{bar_w:.1f}" height="18" class="unmapped">'
        f"<title>{esc(f'0 to {exact(top)}')}</title></rect>"
    )
    x = float(LEFT)
    per, exact_per = _block_bytes(view)
    about = "" if exact_per else "about "
    for part, cls, what in (
        (live, "live", f"live: {s.live_blocks:,} blocks × {about}{human_bytes(per)}"),
        (cached, "cached", f"cached: {s.cached_blocks:,} blocks × {about}{human_bytes(per)}"),
        (other, "other", "other mapped: the null block, the reserve, chunks shared with them"),
    ):
        if part <= 0:
            continue
        w = max(part * px, 1.0)
        out.append(
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="18" class="{cls}">'
            f"<title>{esc(f'{what}: {exact(part)}')}</title></rect>"
        )
        x += w
    for value, cls, label in (
        (s.limit_bytes, "limit", "limit in force"),
        (s.floor_bytes, "floor", "floor"),
        (s.asked_limit_bytes, "asked", "asked"),
    ):
        if value is None or (cls == "asked" and value == s.limit_bytes):
            continue
        lx = LEFT + value * px
        out.append(
            f'<path d="M{lx:.1f},{y - 4} v26" class="{cls}"><title>'
            f"{esc(f'{label}: {exact(value)}')}</title></path>"
        )
    if s.peak_mapped_bytes:
        lx = LEFT + s.peak_mapped_bytes * px
        out.append(
            f'<path d="M{lx:.1f},{y + 18} v6" class="tick"><title>'
            f"{esc(f'peak mapped: {exact(s.peak_mapped_bytes)}')}</title></path>"
        )
    out.append(_t(LEFT, y + 34, "0", "s"))
    out.append(_t(LEFT + bar_w, y + 34, human_bytes(top), "s", "end"))
    line = (
        f"mapped {human_bytes(s.mapped_bytes)} of the {human_bytes(s.limit_bytes)} limit in "
        f"force: live {about}{human_bytes(live)}, cached {about}{human_bytes(cached)}, other "
        f"{human_bytes(other)} · peak {human_bytes(s.peak_mapped_bytes)}"
    )
    if s.floor_bytes is not None:
        line += f" · floor {human_bytes(s.floor_bytes)}"
    line += (
        " · asked: the default (the reservation)"
        if s.asked_limit_bytes is None
        else f" · asked {human_bytes(s.asked_limit_bytes)}"
    )
    out.append(_t(LEFT, y + 50, line, "s"))
    return _svg(WIDTH, y + 56, "".join(out), "budget")


def _legend_line() -> str:
    items = [
        ("live", "live (held by requests)"),
        ("cached", "cached (freed, kept for prefix hits)"),
        ("other", "other mapped (null block, reserve)"),
    ]
    sw = "".join(
        f'<svg width="14" height="10" style="display:inline;margin:0 4px 0 10px" '
        f'aria-hidden="true"><rect width="14" height="10" class="{c}"/></svg>{esc(t)}'
        for c, t in items
    )
    return (
        f"<p class='meta'>{sw} · <span style='color:#D55E00'>━</span> limit in force · "
        "<span>┅</span> floor · <span style='color:#CC79A7'>┅</span> limit asked. "
        "Live and cached are block counts × bytes per block; chunks shared between blocks make "
        "what is mapped a little more.</p>"
    )


def _columns(
    runs: list[tuple[int, int]], unit_bytes: int, size: int, px: float, columns: int
) -> list[tuple[int, int, int, int]]:
    """Merged pixel columns ``(first px, last px + 1, first byte, mapped bytes)`` with any
    mapping, each marked full or partly by comparing mapped to spanned bytes."""
    out: list[list[int]] = []  # [c0, c1, mapped bytes, full?]
    for first, count in runs:
        lo, hi = first * unit_bytes, min((first + count) * unit_bytes, size)
        if hi <= lo:
            continue
        c0 = min(int(lo * px), columns - 1)
        c1 = min(max(int(-(-hi * px // 1)), c0 + 1), columns)
        if out and out[-1][1] >= c0:
            last = out[-1]
            last[1] = max(last[1], c1)
            last[2] += hi - lo
        else:
            out.append([c0, c1, hi - lo, 0])
    return [(c0, c1, int(c0 / px), mapped) for c0, c1, mapped, _ in out]


def _pool_state(view: EngineView, pool: Pool, look: Look, scale: float) -> str:
    """One pool: the plan's group rows (thin) and the mapped chunks under them, to scale."""
    plan = view.plan
    assert plan is not None
    s = view.stats
    band_w = max(pool.size_bytes * scale, 40.0)
    px = band_w / max(pool.size_bytes, 1)
    runs = (s.mapped_runs or {}).get(pool.name, [])
    unit_bytes = s.chunk_bytes * s.mapped_runs_unit
    mapped = sum(min((f + c) * unit_bytes, pool.size_bytes) - f * unit_bytes for f, c in runs)
    known = s.mapped_runs is not None
    head = f"pool {pool.name} · {human_bytes(pool.size_bytes)} · {pool.num_blocks:,} blocks"
    if known:
        head += f" · mapped {human_bytes(mapped)} in {len(runs):,} run(s)"
    if not known:
        sub = "which chunks are mapped is unknown (no mapped_runs in this snapshot)"
    elif s.mapped_runs_unit == 1:
        sub = f"chunks of {human_bytes(unit_bytes)}, as the engine maps them"
    else:
        sub = (
            f"coarse runs of {human_bytes(unit_bytes)} units ({s.mapped_runs_unit} chunks): "
            "a unit drawn as mapped has at least one of its chunks mapped"
        )
    top = 58
    out = [_t(0, 14, fit(head, WIDTH / 1.15), "h"), _t(0, 28, fit(sub, WIDTH), "s")]
    for k in range(5):
        at = pool.size_bytes * k // 4
        x = LEFT + at * px
        anchor = "start" if k == 0 else ("end" if k == 4 else "middle")
        out.append(f'<path d="M{x:.1f},{top - 10} v6" class="tick"/>')
        out.append(_t(x, top - 13, human_bytes(at), "s", anchor))
    by_group: dict[int, list[View]] = defaultdict(list)
    for v in plan.views:
        if v.pool == pool.name:
            by_group[v.group].append(v)
    groups = sorted(by_group)[:MAX_GROUP_ROWS]
    y = float(top)
    for gid in groups:
        out.append(_t(0, y + 11, f"g{gid}", "s"))
        for stripe in _stripes(by_group[gid], LEFT, px):
            out.append(_stripe(stripe, y, look.fill(gid), pool))
        y += ROW + 2
    hidden = len(by_group) - len(groups)
    if hidden:
        out.append(_t(LEFT, y + 10, f"{hidden} more groups not drawn", "s"))
        y += 14
    y += 4
    out.append(_t(0, y + 15, "mapped chunks" if known else "mapped: unknown"))
    what = "white = not mapped" if known else "hatched: not known (no mapped_runs)"
    out.append(
        f'<rect x="{LEFT}" y="{y:.1f}" width="{band_w:.1f}" height="{MAPPED_H}" '
        f'class="unmapped"{"" if known else UNKNOWN_STYLE}>'
        f"<title>{esc(f'pool {pool.name}: {what}')}</title></rect>"
    )
    columns = max(int(band_w), 1)
    for c0, c1, lo, got in _columns(runs, unit_bytes, pool.size_bytes, px, columns):
        hi = min(int(c1 / px), pool.size_bytes)
        full = got >= (hi - lo) * 0.999 and s.mapped_runs_unit == 1
        title = f"bytes [{lo:,}, {hi:,}) ({human_bytes(hi - lo)}): {exact(got)} mapped" + (
            "" if s.mapped_runs_unit == 1 else " or less (coarse runs)"
        )
        out.append(
            f'<rect x="{LEFT + c0:.1f}" y="{y:.1f}" width="{max(c1 - c0, 1)}" '
            f'height="{MAPPED_H}" class="{"mapped" if full else "partly"}">'
            f"<title>{esc(title)}</title></rect>"
        )
    y += MAPPED_H + 6
    if runs:
        part, y = _windows(
            runs, unit_bytes, pool, [v for v in plan.views if v.pool == pool.name], y
        )
        out.append(part)
    return _svg(WIDTH, y, "".join(out), f"mapped chunks of pool {pool.name}")


MAX_WINDOWS = 6
WINDOW_GAP = 24.0
CELL_MIN = 3.0


def windows(runs: list[tuple[int, int]], most: int = MAX_WINDOWS) -> list[tuple[int, int]]:
    """At most ``most`` unit ranges ``[first, end)`` covering every run: runs closer than the
    smallest gap that leaves ``most`` ranges are merged (the gap doubles; linear per try)."""
    gap = 0
    while True:
        out: list[list[int]] = []
        for first, count in runs:
            if out and first - out[-1][1] <= gap:
                out[-1][1] = first + count
            else:
                out.append([first, first + count])
        if len(out) <= most:
            return [(a, b) for a, b in out]
        gap = gap * 2 + 1


def _where(views: list[View], lo: int, hi: int) -> str:
    """Which layers and blocks bytes ``[lo, hi)`` hold: ``L0 L1 L2 · blocks 0–1,023``."""
    hit = sorted(
        (v for v in views if extent(v)[0] < hi and lo < extent(v)[1]),
        key=lambda v: (v.offset_bytes, v.group),
    )
    if not hit:
        return "no layer's bytes (padding)"
    names = " ".join(short(v.layer) for v in hit[:8]) + (" …" if len(hit) > 8 else "")
    first = hit[0]
    stride = block_stride_bytes(first)
    if stride <= 0:
        return names
    b0 = max((lo - first.offset_bytes) // stride, 0)
    b1 = min((hi - 1 - first.offset_bytes) // stride, first.shape[0] - 1)
    if b1 < b0:
        return names
    blocks = f"block {b0:,}" if b0 == b1 else f"blocks {b0:,}–{b1:,}"
    return f"{names} · {blocks}"


def _cell(x: float, y: float, w: float, title: str) -> str:
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 1.0):.1f}" height="{MAPPED_H}" '
        f'class="mapped"><title>{esc(title)}</title></rect>'
    )


def _windows(
    runs: list[tuple[int, int]], unit: int, pool: Pool, views: list[View], y: float
) -> tuple[str, float]:
    """The mapped runs up close: at most :data:`MAX_WINDOWS` windows on a broken axis, each
    naming the layers and blocks whose pages it holds, one cell per chunk where cells fit."""
    chunks_in_pool = max(-(-pool.size_bytes // unit), 1)
    spans = [(a, b, max(a - 1, 0), min(b + 1, chunks_in_pool)) for a, b in windows(runs)]
    avail = WIDTH - LEFT - 4 - WINDOW_GAP * (len(spans) - 1)
    total = sum(d - c for _, _, c, d in spans)
    out = [_t(0, y + 29, "up close")]
    x = float(LEFT)
    for i, (m0, m1, a, b) in enumerate(spans):  # mapped [m0, m1), drawn with a unit around
        w = max((b - a) / total * avail, 60.0)
        lo, hi = a * unit, min(b * unit, pool.size_bytes)
        where = _where(views, m0 * unit, min(m1 * unit, pool.size_bytes))
        out.append(_t(x, y + 9, f"@ {human_bytes(m0 * unit)}", "s"))
        out.append(_t(x, y + 53, fit(where, w + WINDOW_GAP - 4), "s"))
        px = w / (b - a)
        top = y + 14
        span = f"chunks {a:,}–{b - 1:,}: bytes [{lo:,}, {hi:,}); mapped: {where}"
        out.append(
            f'<rect x="{x:.1f}" y="{top:.1f}" width="{w:.1f}" height="{MAPPED_H}" '
            f'class="unmapped"><title>{esc(span)}</title></rect>'
        )
        for first, count in runs:
            c0, c1 = max(first, a), min(first + count, b)
            if c1 <= c0:
                continue
            if px >= CELL_MIN:  # one cell per unit: the chunk boundaries stay visible
                for c in range(c0, c1):
                    what = f"chunk {c:,}: bytes [{c * unit:,}, {(c + 1) * unit:,}) mapped"
                    out.append(_cell(x + (c - a) * px, top, px - 1, what))
            else:
                what = f"chunks {c0:,}–{c1 - 1:,} mapped ({human_bytes((c1 - c0) * unit)})"
                out.append(_cell(x + (c0 - a) * px, top, (c1 - c0) * px, what))
        x += w
        if i < len(spans) - 1:
            out.append(_t(x + WINDOW_GAP / 2, top + 15, "⋯", "", "middle"))
            x += WINDOW_GAP
    return "".join(out), y + 62


def _stripe(stripe: _Stripe, y: float, paint: str, pool: Pool) -> str:
    first = stripe.views[0]
    title = view_title(first, pool)
    if len(stripe.views) > 1:
        title = f"{len(stripe.views)} views: {first.layer} … {stripe.views[-1].layer}"
    label = short(first.layer)
    if len(stripe.views) > 1:
        label += "…" + short(stripe.views[-1].layer)
    label = fit(label, stripe.w)
    text = (
        _t(stripe.x + stripe.w / 2, y + 11, label, "lbl s", "middle")
        if label and text_width(label) + 4 <= stripe.w
        else ""
    )
    return (
        f'<rect x="{stripe.x:.1f}" y="{y:.1f}" width="{max(stripe.w, 1.0):.1f}" height="{ROW}" '
        f'fill="{paint}" class="stripe"><title>{esc(title)}</title></rect>{text}'
    )


def _runs_table(view: EngineView) -> str:
    s = view.stats
    if not s.mapped_runs:
        return ""
    unit = s.chunk_bytes * s.mapped_runs_unit
    rows = []
    for pool, runs in s.mapped_runs.items():
        for first, count in runs[:MAX_RUNS_LISTED]:
            lo = first * unit
            rows.append(
                f"<tr><td>{esc(pool)}</td><td class=n>{first * s.mapped_runs_unit:,}</td>"
                f"<td class=n>{count * s.mapped_runs_unit:,}</td><td class=n>{lo:,}</td>"
                f"<td class=n>{esc(human_bytes(count * unit))}</td></tr>"
            )
        if len(runs) > MAX_RUNS_LISTED:
            rows.append(
                f"<tr><td colspan=5>… {len(runs) - MAX_RUNS_LISTED:,} more runs in "
                f"{esc(pool)}</td></tr>"
            )
    return (
        "<details><summary>mapped runs</summary><table><tr><th>pool</th><th>first chunk</th>"
        "<th>chunks</th><th>first byte</th><th>bytes</th></tr>" + "".join(rows) + "</table>"
        "</details>"
    )


def _figures_table(views: list[EngineView]) -> str:
    head = (
        "<tr><th>engine</th><th>rank</th><th>state</th><th>age</th><th>mapped</th>"
        "<th>peak</th><th>limit in force</th><th>asked</th><th>floor</th><th>cache limit</th>"
        "<th>reserved</th><th>live blocks</th><th>cached blocks</th><th>failed maps</th>"
        "<th>backend</th><th>chunk</th></tr>"
    )

    def b(n: int | None) -> str:
        return "-" if n is None else esc(human_bytes(n))

    rows = []
    for v in views:
        s = v.stats
        state = (
            f"<span class='bad'>{esc(v.status)}</span>"
            if v.status
            in (
                "dead",
                "stale",
            )
            else esc(v.status)
        )
        asked = "default" if s.asked_limit_bytes is None else b(s.asked_limit_bytes)
        rows.append(
            f"<tr><td>{esc(s.engine)}</td><td class=n>{s.rank}</td><td>{state}</td>"
            f"<td class=n>{v.age_seconds:.1f} s</td><td class=n>{b(s.mapped_bytes)}</td>"
            f"<td class=n>{b(s.peak_mapped_bytes)}</td><td class=n>{b(s.limit_bytes)}</td>"
            f"<td class=n>{asked}</td><td class=n>{b(s.floor_bytes)}</td>"
            f"<td class=n>{b(s.cache_limit_bytes)}</td><td class=n>{b(s.reserved_bytes)}</td>"
            f"<td class=n>{s.live_blocks:,}</td><td class=n>{s.cached_blocks:,}</td>"
            f"<td class=n>{s.failed_maps:,}</td><td>{esc(s.backend)}</td>"
            f"<td class=n>{b(s.chunk_bytes)}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _section(view: EngineView) -> str:
    s = view.stats
    parts = [
        f"<h2>{esc(s.engine)} · rank {s.rank} · {esc(view.status)}</h2>"
        f"<p class='meta'>{esc(str(view.path))} · {esc(s.backend)} · chunks of "
        f"{esc(human_bytes(s.chunk_bytes))} · {s.num_blocks:,} blocks · "
        f"snapshot {view.age_seconds:.1f} s old</p>",
        _budget(view),
    ]
    asked = s.asked_limit_bytes
    if asked is not None and asked < s.limit_bytes:
        floor = s.floor_bytes if s.floor_bytes is not None else s.limit_bytes
        parts.append(
            f"<p class='warn'>The limit asked, {esc(exact(asked))}, is below this engine's "
            f"floor {esc(exact(floor))} (its null block and one request of max_model_len tokens "
            f"in every KV cache group): the limit in force is {esc(exact(s.limit_bytes))}.</p>"
        )
    if view.problem is not None:
        parts.append(f"<p class='warn'>{esc(view.problem.render())}</p>")
    plan = view.plan
    if plan is None:
        return "".join(parts)
    if s.mapped_runs is None and s.state == "closed":
        parts.append(
            "<p class='meta'>This is the engine's closing snapshot: its KV cache is closed and "
            "nothing is mapped any more (a closed cache records no <code>mapped_runs</code>); "
            "the figures above are its last.</p>"
        )
    elif s.mapped_runs is None:
        parts.append(
            "<p class='warn'>This snapshot carries no <code>mapped_runs</code> (written by an "
            "older kvplan, or the mapping had more pools than a snapshot records): which "
            "chunks are mapped is unknown; the figures above are exact.</p>"
        )
    (styles,) = palette(plan)
    look = Look(Marks(), styles)
    parts += pool_bands(
        plan,
        WIDTH,
        lambda pool, scale: _pool_state(view, pool, look, scale),
        "the mapped runs table lists every pool's runs",
    )
    parts.append(_runs_table(view))
    return "".join(parts)


def elastic_page(
    views: list[EngineView],
    title: str = "",
    now: float | None = None,
    drawn: int = 16,
    groups: Sequence[GroupSnapshot] = (),
) -> str:
    """The ``top --html`` page: every rank in a table, the first ``drawn`` ranks drawn; above
    them each group of ``groups`` (its budget by member: guarantees, grants, borrowed, claims)."""
    from kvplan.render._group import CSS as GROUP_CSS
    from kvplan.render._group import group_section

    now = time.time() if now is None else now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    styles: set[int] = set()
    for view in views[:drawn]:
        if view.plan is not None:
            styles.update(palette(view.plan)[0].values())
    sections = "".join(_section(v) for v in views[:drawn])
    more = (
        f"<p class='meta'>{len(views) - drawn} more ranks are in the table but not drawn.</p>"
        if len(views) > drawn
        else ""
    )
    body = (
        f"<h1>kvplan top · {esc(title)}</h1><p class='meta'>{len(views)} rank(s) · "
        f"snapshots read {esc(stamp)} · each rank's pools drawn from its plan "
        "(<code>rank&lt;N&gt;.plan.json</code> beside its stats), its mapped chunks from its "
        f"latest snapshot</p>{''.join(group_section(g, WIDTH) for g in groups)}"
        f"{_figures_table(views)}{_legend_line()}{sections}{more}"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(f'kvplan top · {title}')}</title><style>{CSS}{GROUP_CSS}</style></head><body>"
        f"{defs(styles)}{body}<p class='meta'>Drawn by kvplan from stats snapshots and plans; "
        "self-contained (no script, no fetched resources).</p></body></html>\n"
    )
