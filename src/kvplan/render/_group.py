"""A group of elastic engines on the ``kvplan top --html`` page, drawn from its snapshot.

One picture per group, above the engines: the budget as a bar, and on it, to one scale,

* **guaranteed**: each member's guarantee (charged: × its factor), stacked in member order;
* **granted**: each member's grant, stacked — the part within its guarantee solid, the part
  above it (**borrowed**) pale, so who borrows from whom reads off one row;
* **claimed**: each member's claim (what it waits for below its guarantee), dashed;

with the budget and every member's guarantee boundary marked, then a table of every figure.
A pure function of :class:`~kvplan.elastic.group.GroupSnapshot` (the CLI reads it), bounded
by :data:`MAX_MEMBERS_DRAWN` members.
"""

from __future__ import annotations

from kvplan.elastic.group import GroupSnapshot
from kvplan.render._svg import LEFT, _svg, _t, esc, exact, fit
from kvplan.units import human_bytes

MAX_MEMBERS_DRAWN = 32
"""Members drawn in a group's bars (every member is in its table)."""
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#555")
"""One colour per member (Okabe-Ito, colour-blind safe), repeated past eight."""
ROW_H = 18
ROWS = ("guaranteed", "granted", "claimed")

CSS = """
.gfree{fill:#fff;stroke:#333;stroke-width:1}.borrowed{fill-opacity:.35}
.claim{fill:#fff;fill-opacity:0;stroke-width:2;stroke-dasharray:5 3}
.budget{stroke:#D55E00;stroke-width:2}.gmark{stroke:#111;stroke-width:1.5}
"""


def _rect(x: float, y: float, w: float, cls: str, colour: str, title: str) -> str:
    paint = f' fill="{colour}"' if "claim" not in cls else f' stroke="{colour}"'
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 1.0):.1f}" height="{ROW_H}" '
        f'class="{cls}"{paint}><title>{esc(title)}</title></rect>'
    )


def _label(x: float, y: float, w: float, text: str) -> str:
    shown = fit(text, w)
    return _t(x + 3, y + 13, shown, "lbl") if shown else ""


def group_picture(group: GroupSnapshot, width: float) -> str:
    """The group's SVG: guaranteed, granted (borrowed pale) and claimed bytes by member."""
    members = group.members[:MAX_MEMBERS_DRAWN]
    guaranteed = sum(m.guarantee_bytes * m.factor for m in members)
    claimed = sum(m.claim_bytes * m.factor for m in members)
    top = max(group.budget_bytes, group.granted_bytes, guaranteed, claimed, 1)
    bar_w = width - LEFT - 60
    px = bar_w / top
    out = [_t(0, 14, f"group budget {human_bytes(group.budget_bytes)}", "h")]
    y0 = 24
    for row, name in enumerate(ROWS):
        y = y0 + row * (ROW_H + 8)
        out.append(_t(0, y + 13, name))
        out.append(
            f'<rect x="{LEFT}" y="{y}" width="{bar_w:.1f}" height="{ROW_H}" class="gfree">'
            f"<title>{esc(f'{name}: 0 to {exact(top)}')}</title></rect>"
        )
    x_guarantee = x_grant = x_claim = float(LEFT)
    y_g, y_r, y_c = (y0 + i * (ROW_H + 8) for i in range(3))
    for i, m in enumerate(members):
        colour = COLOURS[i % len(COLOURS)]
        who = f"{m.name} ({m.liveness}, x{m.factor})"
        g = m.guarantee_bytes * m.factor
        w = g * px
        if w > 0:
            out.append(
                _rect(x_guarantee, y_g, w, "guarantee", colour, f"{who}: guarantee {exact(g)}")
            )
            out.append(_label(x_guarantee, y_g, w, m.name))
            x_guarantee += w
            out.append(
                f'<path d="M{x_guarantee:.1f},{y_g - 3} v{3 * ROW_H + 22}" class="gmark">'
                f"<title>{esc(f'end of the guarantees up to {m.name}')}</title></path>"
            )
        within = min(m.granted_bytes, m.guarantee_bytes) * m.factor
        for part, cls, what in (
            (within, "granted", "granted within its guarantee"),
            (m.borrowed_bytes, "granted borrowed", "borrowed (granted above its guarantee)"),
        ):
            if part > 0:
                out.append(_rect(x_grant, y_r, part * px, cls, colour, f"{who}: {what}: "
                                 f"{exact(part)}"))  # fmt: skip
                if cls == "granted":
                    out.append(_label(x_grant, y_r, part * px, m.name))
                x_grant += part * px
        claim = m.claim_bytes * m.factor
        if claim > 0:
            title = f"{who}: claims {exact(claim)} below its guarantee (owed by the borrowers)"
            out.append(_rect(x_claim, y_c, claim * px, "claim", colour, title))
            out.append(_label(x_claim, y_c, claim * px, m.name))
            x_claim += claim * px
    budget_x = LEFT + group.budget_bytes * px
    out.append(
        f'<path d="M{budget_x:.1f},{y0 - 6} v{3 * ROW_H + 28}" class="budget"><title>'
        f"{esc(f'budget: {exact(group.budget_bytes)}')}</title></path>"
    )
    y_end = y0 + 3 * (ROW_H + 8)
    out.append(_t(LEFT, y_end + 6, "0", "s"))
    out.append(_t(LEFT + bar_w, y_end + 6, human_bytes(top), "s", "end"))
    label = f"group {group.directory}: budget, guarantees, grants and claims by member"
    return _svg(width, y_end + 12, "".join(out), label)


def _members_table(group: GroupSnapshot) -> str:
    head = (
        "<tr><th>member</th><th>state</th><th>x</th><th>guarantee</th><th>granted</th>"
        "<th>borrowed</th><th>claim</th><th>owed</th><th>limit (effective)</th><th>floor</th>"
        "<th>pid</th></tr>"
    )
    rows = []
    for i, m in enumerate(group.members):
        colour = COLOURS[i % len(COLOURS)] if i < MAX_MEMBERS_DRAWN else "#fff"
        state = esc(m.liveness) if m.liveness == "alive" else f"<span class=bad>{m.liveness}</span>"
        rows.append(
            f"<tr><td><span style='color:{colour}'>■</span> {esc(m.name)}</td><td>{state}</td>"
            f"<td class=n>{m.factor}</td><td class=n>{esc(human_bytes(m.guarantee_bytes))}</td>"
            f"<td class=n>{esc(human_bytes(m.granted_bytes))}</td>"
            f"<td class=n>{esc(human_bytes(m.borrowed_bytes))}</td>"
            f"<td class=n>{esc(human_bytes(m.claim_bytes))}</td>"
            f"<td class=n>{esc(human_bytes(m.owed_bytes))}</td>"
            f"<td class=n>{esc(human_bytes(m.effective_limit_bytes))}</td>"
            f"<td class=n>{esc(human_bytes(m.floor_bytes))}</td><td class=n>{m.pid}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def group_section(group: GroupSnapshot, width: float) -> str:
    """A group's heading, figures, picture and members table."""
    more = max(0, len(group.members) - MAX_MEMBERS_DRAWN)
    note = f"<p class='meta'>{more} more members are in the table, not drawn.</p>" if more else ""
    figures = (
        f"budget {human_bytes(group.budget_bytes)} · granted {human_bytes(group.granted_bytes)} "
        f"· free {human_bytes(group.free_bytes)} · guaranteed "
        f"{human_bytes(group.guaranteed_bytes)} · borrowed {human_bytes(group.borrowed_bytes)} "
        f"· claimed {human_bytes(group.claimed_bytes)} · owed {human_bytes(group.owed_bytes)} "
        f"· revision {group.revision:,}"
    )
    return (
        f"<h2>group {esc(group.directory)} · {len(group.members)} member(s)</h2>"
        f"<p class='meta'>{esc(figures)}. Bars to one scale: each member's guarantee; its "
        "grant, solid within its guarantee and pale above it (borrowed); its claim, dashed "
        "(bytes it waits for below its guarantee, owed by the borrowers). Bytes are charged "
        "(× the member's factor); the red line is the budget.</p>"
        f"{group_picture(group, width)}{note}{_members_table(group)}"
    )
