"""``kvplan top`` and ``kvplan limit``: watch elastic engines and change their budget.

``top DIR`` reads every ``rank<N>.stats.json`` under DIR (two subdirectory levels) and shows
one row per engine and rank, refreshed live; ``--once`` prints the table once, ``--json``
prints the snapshot as JSON. ``limit DIR SIZE`` changes the same engines: it writes
``limit.json`` into each engine's own dump directory under DIR (which the engine watches),
``KVP429`` when no engine dumps there. Exit codes: 0 shown/written, 1 no stats files under DIR
(top) or written below an engine's floor (limit), 2 an error.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvplan import units
from kvplan.cli import _group_view, _limit_targets, _top_page
from kvplan.cli._dump_dirs import trusted_directory
from kvplan.cli._output import (
    EXIT_DIFFERENT,
    EXIT_ERROR,
    guarded,
    print_json,
    report,
    stderr_console,
    stdout_console,
)
from kvplan.elastic.files import (
    ElasticStats,
    limit_path,
    read_stats_tree,
    write_limit,
)
from kvplan.elastic.group import is_group_directory
from kvplan.elastic.status import EngineStatus, engine_status
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error, printable, warning
from kvplan.schemas.loading import check_output
from kvplan.units import human_bytes

MAX_INTERVAL = 3600.0
CAPPED_NOTE = (
    "limit*: a group member's effective limit, its grant now less what it owes to claims; not "
    "a cap: it grows on request while the group's budget has free bytes"
)
"""What a ``*`` in the limit column means (docs/elastic.md, "The limit in force")."""
MAX_ENGINE_CHARS = 48
"""Longest engine id shown in the table (longer ones are cut in the middle)."""

_ZERO = re.compile(r"\s*0+(?:\.0*)?\s*(?:[KMGTPE]?I?B?)?\s*", re.IGNORECASE | re.ASCII)


def parse_limit_size(text: str, option: str, *, zero_ok: bool = False) -> int:
    """A size for ``kvplan limit`` (``24GiB``; ``0`` only where ``zero_ok``), read by the one
    size reader (``KVP020`` unreadable, ``KVP405`` above 1 PiB)."""
    if zero_ok and _ZERO.fullmatch(text):
        return 0
    return units.parse_size(text, option, limit=units.MAX_OPTION_BYTES)


# -- limit ----------------------------------------------------------------------------------


def limit_command(
    directory_text: Annotated[
        str,
        typer.Argument(
            metavar="DIR",
            help="the engines' dump directory, or the folder kvplan top shows them in",
        ),
    ],
    size: Annotated[
        str | None,
        typer.Argument(metavar="SIZE", help="physical KV budget, e.g. 24GiB (none with --clear)"),
    ] = None,
    cache: Annotated[
        str | None,
        typer.Option(
            "--cache",
            metavar="SIZE",
            help="bytes of freed-but-cached KV kept backed (0 allowed; default: the engines')",
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="print what was written and each engine's floor")
    ] = False,
    group: Annotated[
        bool,
        typer.Option(
            "--group",
            help="DIR is a group of engines (KVPLAN_GROUP): set its one budget (creating the "
            "group if it has none yet), or with --member a member's guarantee",
        ),
    ] = False,
    member: Annotated[
        str | None,
        typer.Option(
            "--member",
            metavar="NAME",
            help="with --group: set NAME's guarantee (kept across its restarts)",
        ),
    ] = None,
    clear: Annotated[
        bool,
        typer.Option(
            "--clear", help="with --group --member NAME and no SIZE: forget NAME's kept guarantee"
        ),
    ] = False,
) -> None:
    """Set the physical KV budget of every elastic engine kvplan top shows under DIR (the
    limit.json of each engine's own dump directory: DIR and two levels below it), or of a
    group of engines (--group DIR; without it, only a DIR that really is a group: a
    group.lock and a valid ledger, not a marker file).

    Exit 0 written; 1 written, but below the floor of an engine (that engine raises it to its
    floor); 2 an error, KVP429 when no engine dumps under DIR (nothing written)."""
    if not directory_text.strip():
        raise KVPlanError(
            error(
                Code.DIRECTORY_MISSING,
                "DIR",
                "the directory is empty (an empty path would be the working directory).",
                "name the directory: the engines' KVPLAN_DUMP_DIR, or the group's KVPLAN_GROUP",
            )
        )
    directory = Path(directory_text)
    if clear:
        _clear_guarantee(directory, size, member, cache, json_out)
        return
    if size is None:
        raise KVPlanError(
            error(
                Code.USAGE,
                "SIZE",
                "no size was given.",
                "pass SIZE, e.g. kvplan limit DIR 24GiB (or --group DIR --member NAME --clear "
                "to forget a kept guarantee)",
            )
        )
    limit = parse_limit_size(size, "SIZE")
    if group or member is not None or is_group_directory(directory):
        _limit_group(directory, limit, member, cache, json_out)
        return
    cache_limit = parse_limit_size(cache, "--cache", zero_ok=True) if cache is not None else None
    if cache_limit is not None and cache_limit > limit:
        raise KVPlanError(
            error(
                Code.BAD_LIMIT,
                "--cache",
                f"the cache limit {human_bytes(cache_limit)} is above the limit "
                f"{human_bytes(limit)}; cached KV is part of the budget.",
                "pass a --cache at most SIZE",
            )
        )
    trusted_directory(directory)  # commands come from DIR and the engines' directories below
    targets = _limit_targets.find_targets(directory)
    for folder in targets.folders:
        trusted_directory(folder)
    engines = targets.engines
    watching = [e for e in engines if e.status.status not in _limit_targets.GONE]
    below = [e for e in watching if e.stats.floor_bytes is not None and limit < e.stats.floor_bytes]
    for folder in targets.folders:  # refuse a link or a special file before writing any
        check_output(limit_path(folder), within=folder)
    paths = [write_limit(folder, limit, cache_limit) for folder in targets.folders]
    cached = "the engines' default" if cache_limit is None else _bytes(cache_limit)
    if json_out:
        print_json(
            {
                "paths": [str(p) for p in paths],
                "limit_bytes": limit,
                "cache_limit_bytes": cache_limit,
                "below_floor": bool(below),
                "engines": [
                    {
                        "path": str(e.path),
                        "limit_path": str(limit_path(e.folder)),
                        "engine": e.stats.engine,
                        "rank": e.stats.rank,
                        "status": e.status.status,
                        "floor_bytes": e.stats.floor_bytes,
                        "limit_in_force_bytes": None
                        if e.status.status in _limit_targets.GONE
                        else max(limit, e.stats.floor_bytes or 0),
                    }
                    for e in engines
                ],
            }
        )
    else:
        console = stdout_console()
        for folder, path in zip(targets.folders, paths, strict=True):
            console.print(
                Text(
                    printable(
                        f"wrote {path} ({_limit_targets.names(engines, folder)}): limit "
                        f"{_bytes(limit)}, cache limit {cached}"
                    )
                )
            )
    report(
        [
            *(warning(d.code, d.location, d.message, d.hint or "") for d in targets.unreadable),
            *(
                warning(
                    Code.LIMIT_BELOW_FLOOR,
                    "SIZE",
                    f"the limit {_bytes(limit)} is below the floor of "
                    f"{printable(e.stats.engine, MAX_ENGINE_CHARS)} rank {e.stats.rank}, "
                    f"{_bytes(e.stats.floor_bytes or 0)} (its null block and one request of "
                    "max_model_len tokens in every KV cache group): that engine raises the "
                    "limit to its floor.",
                    f"pass at least {_bytes(e.stats.floor_bytes or 0)} for the limit to be in "
                    "force as asked",
                )
                for e in below
            ),
        ]
    )
    if below:
        raise typer.Exit(EXIT_DIFFERENT)


def _limit_group(
    directory: Path, size: int, member: str | None, cache: str | None, json_out: bool
) -> None:
    if cache is not None:
        raise KVPlanError(
            error(
                Code.USAGE,
                "--cache",
                "a group has one budget for its members' mapped bytes; each member keeps its "
                "own cache limit (its dump directory's limit.json).",
                "drop --cache, or run kvplan limit on the member's dump directory",
            )
        )
    # the group files create what a budget may create (the directory 0700 included) and
    # refuse the rest (a link, another user's directory); a guarantee creates nothing
    after, said = _group_view.change(directory, size, member)
    if json_out:
        print_json(after.model_dump(mode="json"))
    else:
        stdout_console().print(Text(printable(said)))


def _clear_guarantee(
    directory: Path, size: str | None, member: str | None, cache: str | None, json_out: bool
) -> None:
    if member is None or size is not None or cache is not None:
        raise KVPlanError(
            error(
                Code.USAGE,
                "--clear",
                "--clear forgets the guarantee kept for one member of a group: it takes "
                "--member NAME and no SIZE or --cache.",
                "run kvplan limit --group DIR --member NAME --clear",
            )
        )
    after, said = _group_view.clear(directory, member)
    if json_out:
        print_json(after.model_dump(mode="json"))
    else:
        stdout_console().print(Text(printable(said)))


def _bytes(n: int) -> str:
    return human_bytes(n) if n < 1024 else f"{human_bytes(n)} ({n} B)"


# -- top ------------------------------------------------------------------------------------

Snapshot = list[tuple[Path, ElasticStats | Diagnostic]]
Row = tuple[Path, ElasticStats, EngineStatus]


def _split(snapshot: Snapshot, now: float) -> tuple[list[Row], list[Diagnostic]]:
    stats = [(p, s) for p, s in snapshot if isinstance(s, ElasticStats)]
    diags = [s for _, s in snapshot if isinstance(s, Diagnostic)]
    stats.sort(key=lambda item: (item[1].engine, item[1].rank, str(item[0])))
    return [(p, s, engine_status(s, now)) for p, s in stats], diags


def short_bytes(n: int | None) -> str:
    """Three significant digits: ``640 KiB``, ``1.00 GiB``, ``24.0 GiB`` (``-`` for None)."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 999.5 or unit == "TiB":
            if unit == "B":
                return f"{n} B"
            return (
                f"{value:.2f} {unit}"
                if value < 9.995
                else (f"{value:.1f} {unit}" if value < 99.95 else f"{value:.0f} {unit}")
            )
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def human_seconds(seconds: float) -> str:
    """``850 µs``, ``12.5 ms``, ``1.25 s``, ``310 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 100.0:
        return f"{seconds:.2f} s" if seconds < 10.0 else f"{seconds:.1f} s"
    return f"{seconds:,.0f} s"


def _age(age: float) -> str:
    return f"{age:.0f}s" if age >= 10 else f"{age:.1f}s"


def _state(status: EngineStatus) -> Text:
    if status.status == "stale":
        return Text(f"stale {_age(status.age_seconds)}", style="bold yellow")
    if status.status == "dead":
        return Text("dead", style="bold red")
    return Text(status.status)


def raised(stats: ElasticStats) -> bool:
    """The limit asked is below the engine's floor, so the limit in force is the floor."""
    asked = stats.asked_limit_bytes
    return (
        asked is not None
        and asked < stats.limit_bytes
        and (stats.floor_bytes is None or asked < stats.floor_bytes)
    )


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Row], Text | str]
    rank: int
    """Which columns go first when the table is too wide: the highest ``rank`` first."""
    right: bool = True


def _asked(row: Row) -> Text | str:
    s = row[1]
    if s.asked_limit_bytes is None:
        return "default"
    text = short_bytes(s.asked_limit_bytes)
    return Text(text + "<", style="yellow") if raised(s) else text


COLUMNS: tuple[Column, ...] = (
    Column("engine", lambda r: r[1].engine, 0, right=False),
    Column("rank", lambda r: str(r[1].rank), 1),
    Column("state", lambda r: _state(r[2]), 2, right=False),
    Column("mapped", lambda r: short_bytes(r[1].mapped_bytes), 3),
    Column("peak", lambda r: short_bytes(r[1].peak_mapped_bytes), 11),
    Column("limit", lambda r: short_bytes(r[1].limit_bytes), 4),
    Column("asked", _asked, 8),
    Column("floor", lambda r: short_bytes(r[1].floor_bytes), 14),
    Column("cache lim", lambda r: short_bytes(r[1].cache_limit_bytes), 7),
    Column("reserved", lambda r: short_bytes(r[1].reserved_bytes), 15),
    Column("live", lambda r: f"{r[1].live_blocks:,}", 5),
    Column("cached", lambda r: f"{r[1].cached_blocks:,}", 6),
    Column("maps", lambda r: f"{r[1].maps:,}", 16),
    Column("unmaps", lambda r: f"{r[1].unmaps:,}", 17),
    Column("failed", lambda r: f"{r[1].failed_maps:,}", 9),
    Column("map time", lambda r: human_seconds(r[1].map_seconds), 10),
    Column("age", lambda r: _age(r[2].age_seconds), 12),
)
"""Every column of ``kvplan top``, in display order; ``rank`` orders them for dropping."""
GAP = 2
"""Characters between two columns (``box.SIMPLE_HEAD``, no edge, collapsed padding)."""
MIN_ENGINE_CHARS = 12


def _text(value: Text | str) -> Text:
    return value if isinstance(value, Text) else Text(value)


Caps = dict[Path, int]
"""The group's effective limit of each engine that is a member (by stats path): its grant
now less what it owes, not a cap (it grows while the budget has free bytes)."""


def in_force(row: Row, caps: Caps) -> int:
    """The limit in force: the engine's own (``limit_bytes``), or its effective limit in its
    group when lower."""
    cap = caps.get(row[0])
    return row[1].limit_bytes if cap is None else min(row[1].limit_bytes, cap)


def capped(row: Row, caps: Caps) -> bool:
    return in_force(row, caps) < row[1].limit_bytes


def _cell(column: Column, row: Row, caps: Caps) -> Text:
    if column.header == "limit" and capped(row, caps):  # "*": the group's effective limit
        return Text(short_bytes(in_force(row, caps)) + "*", style="yellow")
    return _text(column.cell(row))


def _fit(rows: list[Row], width: int, caps: Caps) -> tuple[list[Column], int, list[Column]]:
    """The columns that fit ``width`` (by rank), the engine column's width, those left out."""
    cells = {
        c.header: [_cell(c, r, caps) for r in rows] if c.header != "engine" else [] for c in COLUMNS
    }
    need = {c.header: max([len(c.header), *(t.cell_len for t in cells[c.header])]) for c in COLUMNS}
    engine_full = max([6, *(len(printable(r[1].engine, MAX_ENGINE_CHARS)) for r in rows)])
    engine = min(engine_full, max(MIN_ENGINE_CHARS, width // 6))
    used = engine
    kept: list[Column] = [COLUMNS[0]]
    for column in sorted(COLUMNS[1:], key=lambda c: c.rank):
        if used + GAP + need[column.header] <= width:
            kept.append(column)
            used += GAP + need[column.header]
    if used < width and engine < engine_full:  # room left: the engine names in full
        engine = min(engine_full, engine + width - used)
    order = {c.header: i for i, c in enumerate(COLUMNS)}
    kept.sort(key=lambda c: order[c.header])
    dropped = [c for c in COLUMNS if c not in kept]
    return kept, engine, dropped


def _table(
    rows: list[Row], directory: Path, width: int, caps: Caps | None = None
) -> tuple[Table, list[Column]]:
    caps = caps or {}
    columns, engine_chars, dropped = _fit(rows, width, caps)
    table = Table(
        title=Text(printable(f"kvplan top {directory}", max(width, 20))),
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    for column in columns:
        table.add_column(column.header, justify="right" if column.right else "left", no_wrap=True)
    for row in rows:
        table.add_row(
            *(
                Text(printable(row[1].engine, engine_chars))
                if c.header == "engine"
                else _cell(c, row, caps)
                for c in columns
            )
        )
    return table, dropped


MAX_NOTES = 8


def _notes(rows: list[Row], dropped: list[Column], caps: Caps | None = None) -> list[Text]:
    """Lines under the table: limits raised to a floor or capped by a group, dead or stale
    engines, hidden columns."""
    out: list[str] = []
    for row in rows:
        _, s, status = row
        who = f"{printable(s.engine, MAX_ENGINE_CHARS)} rank {s.rank}"
        if capped(row, caps or {}):
            out.append(
                f"{who}: limit* in force {short_bytes(in_force(row, caps or {}))}, its grant "
                f"in its group now (its own limit {short_bytes(s.limit_bytes)})"
            )
        if raised(s):
            floor = s.floor_bytes if s.floor_bytes is not None else s.limit_bytes
            out.append(
                f"{who}: asked {short_bytes(s.asked_limit_bytes)}, below its floor "
                f"{short_bytes(floor)}; in force: {short_bytes(s.limit_bytes)}"
            )
        if status.status in ("dead", "stale"):
            out.append(f"{who}: {status.status}: {status.reason}")
    if any(capped(row, caps or {}) for row in rows):
        out.append(CAPPED_NOTE)
    if len(out) > MAX_NOTES:
        out = [*out[: MAX_NOTES - 1], f"... and {len(out) - MAX_NOTES + 1} more (see --json)"]
    notes = [Text(line, style="yellow") for line in out]
    if dropped:
        notes.append(
            Text(
                "not shown at this width: "
                + ", ".join(c.header for c in dropped)
                + " (--json has every field)"
            )
        )
    return notes


def _view(snapshot: Snapshot, directory: Path, now: float, width: int) -> RenderableType:
    rows, diags = _split(snapshot, now)
    groups, problems = _groups_of(rows, directory)
    caps = _caps(rows, groups)
    table, dropped = _table(rows, directory, width, caps)
    parts: list[RenderableType] = [table]
    if not rows:
        parts.append(Text("no readable stats files (yet)"))
    parts.extend(_notes(rows, dropped, caps))
    parts.extend(_group_view.group_table(group, width) for group in groups)
    diags = [*diags, *problems]
    parts.extend(Text(d.render(), style="yellow") for d in diags)
    return Group(*parts)


def _groups_of(rows: list[Row], directory: Path) -> tuple[list[Any], list[Diagnostic]]:
    """The groups DIR is or its engines name (``KVPLAN_GROUP``), each read once."""
    named = [Path(s.group) for _, s, _ in rows if s.group]
    if _group_view.is_group(directory):
        named.insert(0, directory)
    return _group_view.snapshots(named)


def _caps(rows: list[Row], groups: list[Any]) -> Caps:
    return _group_view.group_caps([(p, s.group, s.group_member) for p, s, _ in rows], groups)


def _json(rows: list[Row], groups: list[Any] | None = None) -> list[dict[str, Any]]:
    by_dir = {g.directory: g for g in groups or []}
    caps = _caps(rows, groups or [])
    out = []
    for path, s, status in rows:
        row: dict[str, Any] = {"path": str(path), **s.model_dump(mode="json")}
        group = by_dir.get(str(Path(s.group))) if s.group else None
        row["group_view"] = (
            _group_view.member_view(group, s.group_member or "") if group is not None else None
        )
        row["age_seconds"] = round(status.age_seconds, 3)
        row["status"] = status.status
        row["alive"] = status.alive
        row["stale"] = status.status == "stale"
        row["limit_raised_to_floor"] = raised(s)
        row["limit_in_force_bytes"] = in_force((path, s, status), caps)
        out.append(row)
    return out


def _wait_for_stats(directory: Path, interval: float) -> Snapshot:
    """Live mode before the first stats file: say so and poll (Ctrl-C ends, exit 1)."""
    stderr_console().print(
        Text(
            printable(
                f"waiting for rank<N>.stats.json files under {directory} "
                f"(set KVPLAN_DUMP_DIR there for the engines; Ctrl-C ends)"
            )
        )
    )
    try:
        while True:
            time.sleep(interval)
            snapshot = read_stats_tree(directory)
            if snapshot:
                return snapshot
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_DIFFERENT) from None


def _live(directory: Path, interval: float, snapshot: Snapshot) -> None:
    from rich.live import Live

    console = stdout_console()
    with Live(
        _view(snapshot, directory, time.time(), console.width),
        console=console,
        auto_refresh=False,
        transient=False,
    ) as live:
        while True:
            time.sleep(interval)
            frame = _view(read_stats_tree(directory), directory, time.time(), console.width)
            live.update(frame, refresh=True)


def top_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="the engines' dump directory")],
    interval_text: Annotated[
        str,
        typer.Option(
            "--interval", metavar="SECONDS", help="seconds between refreshes", show_default=True
        ),
    ] = "1",
    once: Annotated[bool, typer.Option("--once", help="print the table once and exit")] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="print one snapshot as JSON and exit")
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="OUT",
            help="draw which pages of which pools are mapped (stats + the engines' plans), "
            "print the table once and exit",
        ),
    ] = None,
) -> None:
    """Show the elastic memory of every engine and rank dumping under DIR, live (Ctrl-C quits)."""
    interval = units.parse_number(interval_text, "--interval")
    if not math.isfinite(interval) or not 0 < interval <= MAX_INTERVAL:
        raise KVPlanError(
            error(
                Code.OPTION_OUT_OF_RANGE,
                "--interval",
                f"the interval must be above 0 and at most {MAX_INTERVAL:.0f} seconds, "
                f"got {interval}.",
                "pass e.g. --interval 1",
            )
        )
    trusted_directory(directory)
    snapshot = read_stats_tree(directory)
    live = not (json_out or once or html is not None)
    if not snapshot and _group_view.is_group(directory):
        _show_groups(directory, json_out)
        return
    if not snapshot:
        if live:
            snapshot = _wait_for_stats(directory, interval)
        else:
            stderr_console().print(
                Text(printable(f"no rank<N>.stats.json files under {directory}")),
            )
            raise typer.Exit(EXIT_DIFFERENT)
    # a diagnostic about DIR itself: the listing was cut at its bounds (or DIR cannot be
    # listed): a refusal in every mode, live included (exit 2 after what was read)
    refused = any(isinstance(s, Diagnostic) and path == directory for path, s in snapshot)
    if live and not refused:
        try:
            _live(directory, interval, snapshot)
        except KeyboardInterrupt:
            return
        return
    now = time.time()
    rows, diags = _split(snapshot, now)
    groups, group_problems = _groups_of(rows, directory)
    diags = [*diags, *group_problems]
    if html is not None and rows:
        diags = [*diags, *_top_page.write_page(html, directory, rows, now, groups)]
    if json_out:
        print_json(_json(rows, groups))
    else:
        console = stdout_console()
        caps = _caps(rows, groups)
        table, dropped = _table(rows, directory, console.width, caps)
        console.print(table)
        for line in _notes(rows, dropped, caps):
            console.print(line, soft_wrap=False)
        for group in groups:
            console.print(_group_view.group_table(group, console.width))
    report(diags)
    if not rows or refused:
        raise typer.Exit(EXIT_ERROR)


def _show_groups(directory: Path, json_out: bool) -> None:
    groups, problems = _group_view.snapshots([directory])
    if json_out and groups:
        print_json(groups[0].model_dump(mode="json"))
    elif groups:
        console = stdout_console()
        console.print(_group_view.group_table(groups[0], console.width))
    report(problems)
    if not groups:
        raise typer.Exit(EXIT_ERROR)


def register(app: typer.Typer) -> None:
    """Add ``top`` and ``limit`` to ``app``."""
    app.command("top")(guarded(top_command))
    app.command("limit")(guarded(limit_command))
