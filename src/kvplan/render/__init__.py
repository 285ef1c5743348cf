"""A picture of the binding: one self-contained HTML page (inline SVG and CSS, no script).

``plan_page(plan)`` draws a plan, ``diff_page(a, b)`` two plans side by side with their
differences marked, ``drift_page`` what ``kvplan golden check --html`` writes. Pure functions
of plans (no torch, no vLLM); every name from a document is HTML-escaped.
"""

from __future__ import annotations

import json
from typing import Any

from kvplan.planner.diff import Change, diff_plans
from kvplan.render._geometry import (
    block_tokens,
    dense_page_bytes,
    extent,
    is_logical,
    memory,
    short_kind,
)
from kvplan.render._palette import palette, style_name
from kvplan.render._svg import (
    MARK_TEXT,
    Look,
    Marks,
    defs,
    esc,
    exact,
    pool_band,
    pool_bands,
)
from kvplan.render._zoom import pool_zoom
from kvplan.render.elastic import EngineView, elastic_page
from kvplan.schemas.plan import BindingPlan
from kvplan.units import human_bytes

__all__ = ["EngineView", "diff_page", "drift_page", "elastic_page", "plan_page"]

MAX_POOLS_ZOOMED = 2
"""Pools whose first blocks are zoomed (one pool per layer would repeat the same zoom)."""
MAX_CHANGES_LISTED = 5000

CSS = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
margin:16px 20px;color:#111;background:#fff}
h1{font-size:18px;margin:0 0 2px}h2{font-size:15px;margin:14px 0 6px}
h3{font-size:14px;margin:4px 0 6px}
.meta{color:#444;margin:0 0 10px;font-size:12px}.meta code{font-size:11px}
.layout{display:flex;gap:18px;align-items:flex-start;flex-wrap:wrap}
.side{display:flex;gap:18px;align-items:flex-start}.side>section{min-width:0}
.fig svg{display:block;margin:0 0 10px;overflow:visible}
svg text{font:11px system-ui,-apple-system,"DejaVu Sans",sans-serif;fill:#111}
svg text.h{font-weight:600;font-size:12px}svg text.s{font-size:10px;fill:#333}
svg text.brk{font-size:18px;fill:#333}
svg text.lbl{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
.band{fill:#f3f3f3;stroke:#333;stroke-width:1}
.stripe{stroke:#222;stroke-width:.6}.seg{stroke:#999;stroke-width:.6}
.chip{stroke:#333;stroke-width:1;stroke-dasharray:3 2}
.marked{stroke:#000;stroke-width:2.6;stroke-dasharray:none}
.tick{stroke:#333}.bus{stroke:#333;fill:none;stroke-width:1}
.arrow{stroke:#222;fill:none;stroke-width:1.3}.halo{stroke:#fff;fill:none;stroke-width:4}
aside{flex:0 0 340px;font-size:12px}
table{border-collapse:collapse;font-size:12px;margin:4px 0 10px}
th,td{border:1px solid #bbb;padding:2px 6px;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#eee;white-space:nowrap}
.sw{display:inline-block;width:26px;height:12px;border:1px solid #222;vertical-align:middle;
margin-right:6px}
details{margin:6px 0}summary{cursor:pointer;font-weight:600}
.mark{font-weight:700}
"""


def _swatch(look: Look, group: int) -> str:
    """A legend swatch: the group's colour and hatching as a tiny SVG."""
    return (
        f'<svg class="sw" width="26" height="12" aria-hidden="true"><rect width="26" height="12" '
        f'fill="{look.fill(group)}"/></svg>'
    )


MAX_LEGEND_GROUPS = 24


def _legend(plan: BindingPlan, look: Look, marks: bool, other: Look | None = None) -> str:
    """The legend of ``plan``'s groups; with ``other`` (a diff's A side) the A group drawn in
    the same style is named beside each group."""
    groups: dict[int, list[str]] = {}
    tokens: dict[int, set[int]] = {}
    logical = is_logical(plan)
    for view in plan.views:
        groups.setdefault(view.group, []).append(view.kind)
        n = block_tokens(view) if logical else None
        if n is not None:
            tokens.setdefault(view.group, set()).add(n)
    same = {}
    if other is not None:
        same = {k: g for g, k in other.styles.items()}
    rows = []
    for gid in sorted(groups)[:MAX_LEGEND_GROUPS]:
        kinds = sorted(set(groups[gid]))
        per = tokens.get(gid)
        block = f" · {'/'.join(str(t) for t in sorted(per))} tokens per block" if per else ""
        was = same.get(look.style(gid))
        twin = f" (A: g{was})" if other is not None and was is not None and was != gid else ""
        rows.append(
            f"<li>{_swatch(look, gid)}<b>g{gid}</b>{twin} "
            f"{esc(', '.join(short_kind(x) for x in kinds))} · "
            f"{len(groups[gid])} view(s){block} · {style_name(look.style(gid))}</li>"
        )
    if len(groups) > MAX_LEGEND_GROUPS:
        rows.append(f"<li>… {len(groups) - MAX_LEGEND_GROUPS} more groups</li>")
    rows.append(
        '<li><svg class="sw" width="26" height="12" aria-hidden="true"><rect width="26" '
        'height="12" fill="url(#pad)"/></svg>padding / unused by that group</li>'
    )
    rows.append(
        '<li><svg class="sw" width="26" height="12" aria-hidden="true"><rect width="26" '
        'height="12" fill="#fff" class="chip"/></svg>sharer (KV sharing alias): owns 0 bytes; '
        "the arrow ends inside the stripe of the layer whose tensor it is bound to</li>"
    )
    if marks:
        rows.append(
            "<li><span class='mark'>Δ</span> changed, <span class='mark'>+</span> added, "
            "<span class='mark'>−</span> removed (thick outline)</li>"
        )
    colours = (
        "Colours follow the layers: a group of B takes the style of the group of A it shares "
        "the most layers with. "
        if other is not None
        else ""
    )
    return (
        "<h3>legend</h3><ul style='list-style:none;padding:0;margin:0'>" + "".join(rows) + "</ul>"
        "<p class='meta'>Groups overlay the same bytes from offset 0, as vLLM overlays them: "
        f"a block id belongs to one group at a time. {colours}Hover any shape for exact "
        "figures.</p>"
    )


def _summary(plan: BindingPlan) -> str:
    m = memory(plan)
    src = plan.source
    rows: list[tuple[str, str]] = [
        ("layout", src.layout or "-"),
        ("vLLM", src.vllm_version or "?"),
        ("blocks", f"{src.num_blocks:,}"),
        ("pools", f"{len(plan.pools)} · {exact(m.pool_bytes)}"),
        ("tensor-backed layers", str(m.backed)),
        ("aliased layers (sharers)", f"{m.aliased} · own 0 B"),
        ("bytes per block", exact(m.per_block)),
        ("block size", _block_size(plan)),
    ]
    if m.per_token is None:
        rows.append(("KV bytes per token", "not derivable from this plan's backend shapes"))
    else:
        rows.append(("KV bytes per token", f"{m.per_token:,.0f} B ({human_bytes(m.per_token)})"))
    if m.aliased and m.per_token is not None:
        rows += [
            (
                "without KV sharing",
                f"{m.per_token + m.shared_per_token:,.0f} B per token",
            ),
            (
                "KV sharing saves",
                f"{m.shared_per_token:,.0f} B per token ({m.saved_share:.0%}); "
                f"{exact(m.saved_bytes)} at {src.num_blocks:,} blocks",
            ),
        ]
    elif m.aliased:
        rows.append(("KV sharing saves", f"{exact(m.saved_bytes)} at {src.num_blocks:,} blocks"))
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return (
        f"<h3>memory</h3><table>{body}</table>{_saving_reason(plan)}<p class='meta'>Per token: "
        "each attention view's page ÷ its states per block (Mamba state excluded); a sharer "
        "would need its target's.</p>"
    )


def _block_size(plan: BindingPlan) -> str:
    """Tokens per block, per group (the N axis of the ``[B, H, N, C]`` attention views)."""
    per: dict[int, set[int]] = {}
    for view in plan.views if is_logical(plan) else ():
        n = block_tokens(view)
        if n is not None:
            per.setdefault(n, set()).add(view.group)
    if not per:
        return "not derivable from this plan's views (no [B, H, N, C] attention view)"
    if len(per) == 1:
        return f"{next(iter(per)):,} tokens per block"
    return (
        "; ".join(f"{n:,} tokens ({_group_list(sorted(gs))})" for n, gs in sorted(per.items()))
        + " per block"
    )


def _group_list(groups: list[int]) -> str:
    shown = ", ".join(f"g{g}" for g in groups[:6])
    return shown + (f" +{len(groups) - 6}" if len(groups) > 6 else "")


def _saving_reason(plan: BindingPlan) -> str:
    """Why "KV sharing saves" can exceed the pool, in one line (only when it does)."""
    m = memory(plan)
    if not m.aliased or m.saved_bytes <= m.pool_bytes:
        return ""
    blocks = plan.source.num_blocks
    views = plan.view_by_layer
    pages = [dense_page_bytes(views[a.target]) for a in plan.aliases if a.target in views]
    if len(set(pages)) == 1 and pages[0] * len(pages) * blocks == m.saved_bytes:
        what = f"{len(pages)} sharers × a {human_bytes(pages[0])} page × {blocks:,} blocks"
    else:
        per = human_bytes(m.saved_bytes // max(blocks, 1))
        what = f"{m.aliased} sharers' pages ({per} per block) × {blocks:,} blocks"
    groups = len({v.group for v in plan.views})
    line = (
        f"Why KV sharing saves more than the pool holds: {what} is what the sharers would "
        f"need on their own, while vLLM overlays the {groups} groups on the same "
        f"{human_bytes(m.pool_bytes)} (a block id belongs to one group at a time)."
    )
    return f"<p class='meta'>{esc(line)}</p>"


def _figures(plan: BindingPlan, width: int, look: Look) -> str:
    parts = pool_bands(
        plan,
        width,
        lambda pool, scale: pool_band(plan, pool, width, scale, look),
        "the pools table lists every pool",
    )
    for pool in plan.pools[:MAX_POOLS_ZOOMED]:
        parts.append(pool_zoom(plan, pool, width, look))
    if len(plan.pools) > MAX_POOLS_ZOOMED:
        parts.append(
            f"<p class='meta'>The first blocks of the first {MAX_POOLS_ZOOMED} pools are "
            "zoomed; hover the other pools' stripes for their figures.</p>"
        )
    if not plan.pools:
        parts.append("<p class='meta'>This plan has no pools.</p>")
    return "".join(parts)


def _tables(plan: BindingPlan, marks: Marks | None = None, open_: bool = False) -> str:
    marks = marks or Marks()

    def tag(kind: Any, name: str) -> str:
        t = marks.tag(kind, name)
        return f"<span class='mark'>{t}</span> " if t else ""

    op = " open" if open_ else ""
    pools = "".join(
        f"<tr><td>{tag('pools', p.name)}{esc(p.name)}</td><td class=n>{p.size_bytes:,}</td>"
        f"<td class=n>{esc(human_bytes(p.size_bytes))}</td><td class=n>{p.alignment_bytes:,}</td>"
        f"<td class=n>{p.num_blocks:,}</td></tr>"
        for p in plan.pools
    )
    views = "".join(
        f"<tr><td>{tag('views', v.layer)}{esc(v.layer)}</td><td class=n>{v.group}</td>"
        f"<td>{esc(v.pool)}</td><td>{esc(v.kind)}</td><td>{esc(v.dtype)}</td>"
        f"<td>{esc(v.shape)}</td><td>{esc(v.stride)}</td><td class=n>{v.offset_bytes:,}</td>"
        f"<td class=n>{extent(v)[1] - extent(v)[0]:,}</td></tr>"
        for v in plan.views
    )
    group_of = {v.layer: v.group for v in plan.views}
    aliases = "".join(
        f"<tr><td>{tag('aliases', a.layer)}{esc(a.layer)}</td><td>{esc(a.target)}</td>"
        f"<td class=n>{group_of.get(a.target, '-')}</td><td class=n>0</td></tr>"
        for a in plan.aliases
    )
    return (
        f"<details{op}><summary>pools ({len(plan.pools)})</summary><table><tr><th>pool</th>"
        "<th>size B</th><th>size</th><th>alignment B</th><th>blocks</th></tr>"
        f"{pools}</table></details>"
        f"<details{op}><summary>views ({len(plan.views)} tensor-backed layers)</summary><table>"
        "<tr><th>layer</th><th>group</th><th>pool</th><th>kind</th><th>dtype</th><th>shape</th>"
        "<th>stride (elements)</th><th>offset B</th><th>extent B</th></tr>"
        f"{views}</table></details>"
        f"<details{op}><summary>aliases ({len(plan.aliases)} sharers)</summary><table>"
        "<tr><th>sharer</th><th>bound to the tensor of</th><th>target group</th>"
        f"<th>owns B</th></tr>{aliases}</table></details>"
    )


def _page(title: str, body: str, *looks: Look) -> str:
    styles = {k for look in looks for k in look.styles.values()}
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{defs(styles)}{body}"
        "<p class='meta'>Drawn by kvplan from the plan alone; self-contained (no script, no "
        "fetched resources).</p></body></html>\n"
    )


def _meta(plan: BindingPlan) -> str:
    src = plan.source
    return (
        f"<p class='meta'>plan <code>{esc(plan.fingerprint[:23])}…</code> · vLLM "
        f"{esc(src.vllm_version or '?')} · layout {esc(src.layout or '-')} · "
        f"{src.num_blocks:,} blocks · {len(plan.pools)} pool(s), {len(plan.views)} views, "
        f"{len(plan.aliases)} aliases</p>"
    )


def plan_page(plan: BindingPlan, title: str | None = None, width: int = 900) -> str:
    """One self-contained HTML page drawing ``plan``."""
    name = title or f"plan {plan.fingerprint[:19]}"
    (styles,) = palette(plan)
    look = Look(Marks(), styles)
    body = (
        f"<h1>KV binding · {esc(name)}</h1>{_meta(plan)}"
        f"<main class='layout'><section class='fig'>{_figures(plan, width, look)}</section>"
        f"<aside>{_summary(plan)}{_legend(plan, look, marks=False)}</aside></main>"
        f"{_tables(plan)}"
    )
    return _page(f"kvplan · {name}", body, look)


def _marks(changes: list[Change]) -> tuple[Marks, Marks]:
    a, b = Marks(), Marks()
    for c in changes:
        if c.section not in ("pools", "views", "aliases"):
            continue
        for side, present in ((a, c.change != "added"), (b, c.change != "removed")):
            if present:
                getattr(side, c.section)[c.key] = c.change
    return a, b


def _value(v: Any) -> str:
    if v is None:
        return ""
    text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    return text if len(text) <= 400 else text[:399] + "…"


def _changes_table(changes: list[Change]) -> str:
    if not changes:
        return "<p><b>No differences</b>: the plans are identical.</p>"
    rows = "".join(
        f"<tr><td>{esc(c.section)}</td><td>{esc(c.key)}</td><td>"
        f"<span class='mark'>{MARK_TEXT[c.change]}</span> {esc(c.change)}</td>"
        f"<td>{esc(c.field)}</td><td><code>{esc(_value(c.old))}</code></td>"
        f"<td><code>{esc(_value(c.new))}</code></td></tr>"
        for c in changes[:MAX_CHANGES_LISTED]
    )
    more = (
        f"<p class='meta'>{len(changes) - MAX_CHANGES_LISTED} more changes: run "
        "<code>kvplan diff</code> for the full list.</p>"
        if len(changes) > MAX_CHANGES_LISTED
        else ""
    )
    return (
        "<table><tr><th>section</th><th>key</th><th>change</th><th>field</th><th>old (A)</th>"
        f"<th>new (B)</th></tr>{rows}</table>{more}"
    )


def diff_page(
    a: BindingPlan,
    b: BindingPlan,
    labels: tuple[str, str] = ("A", "B"),
    title: str | None = None,
    note: str = "",
    width: int = 660,
) -> str:
    """Both plans side by side, changed pools/views/aliases marked, the field-level changes."""
    diff = diff_plans(a, b)
    ma, mb = _marks(diff.changes)
    styles_a, styles_b = palette(a, b)
    look_a, look_b = Look(ma, styles_a), Look(mb, styles_b)
    name = title or f"{labels[0]} vs {labels[1]}"
    counts = {k: sum(1 for c in diff.changes if c.change == k) for k in MARK_TEXT}
    verdict = (
        "identical plans"
        if diff.same
        else f"{len(diff.changes)} change(s): {counts['changed']} changed, "
        f"{counts['added']} added, {counts['removed']} removed"
    )
    columns, summaries = [], []
    for label, plan, look in ((labels[0], a, look_a), (labels[1], b, look_b)):
        columns.append(
            f"<section class='fig'><h2>{esc(label)}</h2>{_meta(plan)}"
            f"{_figures(plan, width, look)}</section>"
        )
        summaries.append(f"<section><h2>{esc(label)}</h2>{_summary(plan)}</section>")
    body = (
        f"<h1>KV binding diff · {esc(name)}</h1><p class='meta'>A = {esc(labels[0])} · "
        f"B = {esc(labels[1])} · <b>{esc(verdict)}</b></p>"
        + (f"<p>{esc(note)}</p>" if note else "")
        + f"<div class='side'>{''.join(columns)}</div>"
        f"<h2>field-level changes (A → B)</h2>{_changes_table(diff.changes)}"
        f"<div class='side'>{''.join(summaries)}</div>"
        f"<aside style='max-width:none'>{_legend(b, look_b, marks=True, other=look_a)}</aside>"
        f"<h2>A: {esc(labels[0])}</h2>{_tables(a, ma)}<h2>B: {esc(labels[1])}</h2>"
        f"{_tables(b, mb)}"
    )
    return _page(f"kvplan diff · {name}", body, look_a, look_b)


def drift_page(
    name: str,
    stored: BindingPlan | None,
    regenerated: BindingPlan,
    input_changed: bool = False,
) -> str:
    """The page ``kvplan golden check --html`` writes for a drifted model.

    The stored plan against the regenerated one; the regenerated plan alone when no plan was
    stored.
    """
    if stored is None:
        return plan_page(regenerated, title=f"{name}: regenerated (no stored plan.json)")
    note = "The captured input document changed." if input_changed else ""
    return diff_page(
        stored, regenerated, ("stored plan.json", "regenerated"), title=name, note=note
    )
