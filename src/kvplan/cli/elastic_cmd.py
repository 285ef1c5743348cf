"""``kvplan top`` and ``kvplan limit``: watch elastic engines and change their budget.

``top DIR`` reads every ``rank<N>.stats.json`` under DIR (two subdirectory levels) and shows
one row per engine and rank, refreshed live; ``--once`` prints the table once, ``--json``
prints the snapshot as JSON. ``limit DIR SIZE`` writes ``DIR/limit.json``, which the engines
dumping into DIR watch. Exit codes: 0 shown/written, 1 no stats files under DIR, 2 an error.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvplan import units
from kvplan.cli._output import (
    EXIT_DIFFERENT,
    EXIT_ERROR,
    cell,
    guarded,
    print_json,
    report,
    stderr_console,
    stdout_console,
)
from kvplan.elastic.files import (
    ElasticStats,
    read_stats_tree,
    write_limit,
)
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error, printable
from kvplan.units import human_bytes

STALE_SECONDS = 5.0
"""A snapshot older than this (of an engine not closed) is marked stale."""
MAX_INTERVAL = 3600.0
MAX_ENGINE_CHARS = 48
"""Longest engine id shown in the table (longer ones are cut in the middle)."""

_ZERO = re.compile(r"\s*0+(?:\.0*)?\s*(?:[KMGTPE]?I?B?)?\s*", re.IGNORECASE | re.ASCII)


def _directory(path: Path, option: str = "DIR") -> Path:
    if not path.exists():
        raise KVPlanError(
            error(
                Code.DIRECTORY_MISSING,
                printable(str(path)),
                f"{option}: the directory does not exist.",
                "pass the engines' KVPLAN_DUMP_DIR (create it first)",
            )
        )
    if not path.is_dir():
        raise KVPlanError(
            error(
                Code.DIRECTORY_MISSING,
                printable(str(path)),
                f"{option}: this is not a directory.",
                "pass the engines' KVPLAN_DUMP_DIR, the directory of the rank<N>.stats.json files",
            )
        )
    return path


def parse_limit_size(text: str, option: str, *, zero_ok: bool = False) -> int:
    """A size for ``kvplan limit`` (``24GiB``; ``0`` only where ``zero_ok``), read by the one
    size reader (``KVP020`` unreadable, ``KVP405`` above 1 PiB)."""
    if zero_ok and _ZERO.fullmatch(text):
        return 0
    return units.parse_size(text, option, limit=units.MAX_OPTION_BYTES)


# -- limit ----------------------------------------------------------------------------------


def limit_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="the engines' dump directory")],
    size: Annotated[str, typer.Argument(metavar="SIZE", help="physical KV budget, e.g. 24GiB")],
    cache: Annotated[
        str | None,
        typer.Option(
            "--cache",
            metavar="SIZE",
            help="bytes of freed-but-cached KV kept backed (0 allowed; default: the engines')",
        ),
    ] = None,
) -> None:
    """Set the physical KV budget of the elastic engines that dump into DIR (DIR/limit.json)."""
    limit = parse_limit_size(size, "SIZE")
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
    _directory(directory)
    path = write_limit(directory, limit, cache_limit)
    cached = "the engines' default" if cache_limit is None else _bytes(cache_limit)
    stdout_console().print(
        Text(printable(f"wrote {path}: limit {_bytes(limit)}, cache limit {cached}"))
    )


def _bytes(n: int) -> str:
    return human_bytes(n) if n < 1024 else f"{human_bytes(n)} ({n} B)"


# -- top ------------------------------------------------------------------------------------

Snapshot = list[tuple[Path, ElasticStats | Diagnostic]]


def _split(snapshot: Snapshot) -> tuple[list[tuple[Path, ElasticStats]], list[Diagnostic]]:
    stats = [(p, s) for p, s in snapshot if isinstance(s, ElasticStats)]
    diags = [s for _, s in snapshot if isinstance(s, Diagnostic)]
    stats.sort(key=lambda item: (item[1].engine, item[1].rank, str(item[0])))
    return stats, diags


def _age(stats: ElasticStats, now: float) -> Text:
    age = max(0.0, now - stats.time)
    shown = f"{age:.0f}s" if age >= 10 else f"{age:.1f}s"
    if stats.state != "closed" and age > STALE_SECONDS:
        return Text(f"stale {shown}", style="bold red")
    return Text(shown)


def _table(stats: list[tuple[Path, ElasticStats]], directory: Path, now: float) -> Table:
    table = Table(title=Text(printable(f"kvplan top {directory}")))
    for column in (
        "engine",
        "rank",
        "state",
        "mapped",
        "peak",
        "limit",
        "reserved",
        "live",
        "cached",
        "maps",
        "unmaps",
        "failed",
        "map time",
        "age",
    ):
        table.add_column(column, justify="left" if column in ("engine", "state") else "right")
    for _, s in stats:
        table.add_row(
            Text(printable(s.engine, MAX_ENGINE_CHARS)),
            cell(s.rank),
            cell(s.state),
            cell(human_bytes(s.mapped_bytes)),
            cell(human_bytes(s.peak_mapped_bytes)),
            cell(human_bytes(s.limit_bytes)),
            cell(human_bytes(s.reserved_bytes)),
            cell(f"{s.live_blocks:,}"),
            cell(f"{s.cached_blocks:,}"),
            cell(f"{s.maps:,}"),
            cell(f"{s.unmaps:,}"),
            cell(f"{s.failed_maps:,}"),
            cell(f"{s.map_seconds * 1e3:,.1f} ms"),
            _age(s, now),
        )
    return table


def _view(snapshot: Snapshot, directory: Path, now: float) -> RenderableType:
    stats, diags = _split(snapshot)
    parts: list[RenderableType] = [_table(stats, directory, now)]
    if not stats:
        parts.append(Text("no readable stats files (yet)"))
    parts.extend(Text(d.render(), style="yellow") for d in diags)
    return Group(*parts)


def _json(stats: list[tuple[Path, ElasticStats]], now: float) -> list[dict[str, Any]]:
    out = []
    for path, s in stats:
        row: dict[str, Any] = {"path": str(path), **s.model_dump(mode="json")}
        row["age_seconds"] = round(max(0.0, now - s.time), 3)
        row["stale"] = s.state != "closed" and now - s.time > STALE_SECONDS
        out.append(row)
    return out


def _live(directory: Path, interval: float) -> None:
    from rich.live import Live

    console = stdout_console()
    with Live(
        _view(read_stats_tree(directory), directory, time.time()),
        console=console,
        auto_refresh=False,
        transient=False,
    ) as live:
        while True:
            time.sleep(interval)
            live.update(_view(read_stats_tree(directory), directory, time.time()), refresh=True)


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
    _directory(directory)
    snapshot = read_stats_tree(directory)
    if not snapshot:
        stderr_console().print(
            Text(printable(f"no rank<N>.stats.json files under {directory}")),
        )
        raise typer.Exit(EXIT_DIFFERENT)
    now = time.time()
    stats, diags = _split(snapshot)
    # a diagnostic about DIR itself: the tree was cut at its bounds (or DIR cannot be listed)
    refused = any(isinstance(s, Diagnostic) and path == directory for path, s in snapshot)
    if json_out or once or refused:
        if json_out:
            print_json(_json(stats, now))
        elif once:
            stdout_console().print(_table(stats, directory, now))
        report(diags)
        if not stats or refused:
            raise typer.Exit(EXIT_ERROR)
        return
    try:
        _live(directory, interval)
    except KeyboardInterrupt:
        return


def register(app: typer.Typer) -> None:
    """Add ``top`` and ``limit`` to ``app``."""
    app.command("top")(guarded(top_command))
    app.command("limit")(guarded(limit_command))
