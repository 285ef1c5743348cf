"""Groups of elastic engines (``KVPLAN_GROUP``) in ``kvplan top`` and ``kvplan limit``.

``kvplan top DIR`` shows, under the engines, every group an engine there names in its stats
(or DIR itself, when it is a group directory): the budget, what is granted, borrowed,
guaranteed, claimed, and each member's share. ``kvplan limit --group DIR SIZE`` changes a
group's budget live (creating the group when it has no ledger yet);
``kvplan limit --group DIR --member NAME SIZE`` changes one member's guarantee.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from kvplan.elastic.group import (
    GroupSnapshot,
    clear_guarantee,
    read_snapshot,
    set_budget,
    set_guarantee,
)
from kvplan.schemas.errors import Diagnostic, KVPlanError, printable
from kvplan.units import human_bytes

GROUP_MARKERS = ("group.lock", "ledger.json")


def is_group(directory: Path) -> bool:
    """Whether ``directory`` is a group directory (a member joined, or a budget was set)."""
    try:
        return any((directory / name).is_file() for name in GROUP_MARKERS)
    except OSError:
        return False


def snapshots(directories: list[Path]) -> tuple[list[GroupSnapshot], list[Diagnostic]]:
    """Each group's snapshot (in order, once each), with a diagnostic for an unreadable one."""
    out: list[GroupSnapshot] = []
    problems: list[Diagnostic] = []
    seen: set[str] = set()
    for directory in directories:
        key = str(directory)
        if key in seen:
            continue
        seen.add(key)
        try:
            out.append(read_snapshot(directory))
        except KVPlanError as exc:
            problems.extend(exc.diagnostics)
    return out, problems


def member_view(group: GroupSnapshot, name: str) -> dict[str, Any] | None:
    """One member's figures in its group, as ``kvplan top --json`` adds them to its rows."""
    for m in group.members:
        if m.name == name:
            return {
                "directory": group.directory,
                "budget_bytes": group.budget_bytes,
                "member": m.name,
                "liveness": m.liveness,
                "guarantee_bytes": m.guarantee_bytes,
                "granted_bytes": m.granted_bytes,
                "borrowed_bytes": m.borrowed_bytes,
                "claim_bytes": m.claim_bytes,
                "owed_bytes": m.owed_bytes,
                "effective_limit_bytes": m.effective_limit_bytes,
            }
    return None


def group_caps(
    members: list[tuple[Path, str | None, str | None]], groups: list[GroupSnapshot]
) -> dict[Path, int]:
    """The group's effective limit of each engine that is a member: ``members`` is (stats
    path, the stats' ``group``, ``group_member``); the member's effective limit in its group's
    snapshot (its grant now less what it owes to claims: not a cap, it grows on request)."""
    by_dir = {g.directory: g for g in groups}
    caps: dict[Path, int] = {}
    for path, directory, name in members:
        group = by_dir.get(str(Path(directory))) if directory else None
        view = member_view(group, name or "") if group is not None else None
        if view is not None:
            caps[path] = int(view["effective_limit_bytes"])
    return caps


def _b(n: int) -> str:
    return human_bytes(n)


def group_table(group: GroupSnapshot, width: int) -> Table:
    """The group's figures and one line per member, within ``width`` columns."""
    title = (  # three lines, each within 80 columns
        f"group {printable(group.directory, max(20, min(width, 100) - 6))}\n"
        f"  budget {_b(group.budget_bytes)}, granted {_b(group.granted_bytes)}, free "
        f"{_b(group.free_bytes)}\n"
        f"  guaranteed {_b(group.guaranteed_bytes)}, borrowed {_b(group.borrowed_bytes)}, "
        f"claimed {_b(group.claimed_bytes)}"
    )
    if group.kept_guarantees:  # an operator's, kept across restarts
        kept = ", ".join(
            f"{printable(n, 24)} {_b(v)}" for n, v in list(group.kept_guarantees.items())[:8]
        )
        more = len(group.kept_guarantees) - 8
        title += f"\n  kept guarantees: {kept}{f', and {more} more' if more > 0 else ''}"
    table = Table(title=Text(title), title_justify="left", box=None, pad_edge=False)
    columns = ["member", "state", "guarantee", "granted", "borrowed", "claim", "limit", "x"]
    if width < 80:
        columns = columns[:-2]
    for name in columns:
        table.add_column(name, justify="left" if name in ("member", "state") else "right")
    for m in group.members:
        cells = [
            printable(m.name, 24),
            m.liveness,
            _b(m.guarantee_bytes),
            _b(m.granted_bytes),
            _b(m.borrowed_bytes),
            _b(m.claim_bytes),
            _b(m.effective_limit_bytes),
            f"{m.factor}",
        ]
        table.add_row(*[Text(c) for c in cells[: len(columns)]])
    return table


def change(directory: Path, size: int, member: str | None) -> tuple[GroupSnapshot, str]:
    """``kvplan limit --group``: the budget (created if the group has none yet), or a
    member's guarantee (kept by name across its restarts); the snapshot after it and a line
    saying what was done."""
    if member is not None:
        after = set_guarantee(directory, member, size)
        live = any(m.name == member for m in after.members)
        return after, (
            f"group {directory}: guarantee of {member} now {_b(size)}"
            + ("" if live else f" ({member} is not a member now: it gets it when it joins)")
            + f"; kept across {member}'s restarts until set again or cleared "
            f"(--member {member} --clear)"
        )
    after = set_budget(directory, size, create=True)
    return after, f"group {directory}: budget now {_b(size)}"


def clear(directory: Path, member: str) -> tuple[GroupSnapshot, str]:
    """``kvplan limit --group DIR --member NAME --clear``: forget the guarantee kept for NAME."""
    after, was = clear_guarantee(directory, member)
    if was is None:
        return after, f"group {directory}: no guarantee was kept for {member}; nothing changed"
    live = next((m for m in after.members if m.name == member), None)
    now = (
        f"; {member} keeps {_b(live.guarantee_bytes)} until it restarts, then joins with its "
        "own (KVPLAN_GROUP_GUARANTEE, else its floor)"
        if live is not None
        else f"; {member} joins with its own guarantee (KVPLAN_GROUP_GUARANTEE, else its floor)"
    )
    return after, f"group {directory}: the guarantee kept for {member} ({_b(was)}) is cleared{now}"
