"""Rich tables shared by commands that show plans."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from rich.table import Table
from rich.text import Text

from kvplan.cli._output import cell
from kvplan.schemas.plan import BindingPlan
from kvplan.units import human_bytes

_T = TypeVar("_T")

MAX_TABLE_ROWS = 512
"""Most rows a table prints (a plan may hold 16,384 views; rich lays a table out at about
half a millisecond a row); the rest are counted under it, and ``--json`` lists them all, as
``report`` counts diagnostics past 50."""


def shown_rows(rows: Sequence[_T]) -> tuple[Sequence[_T], Text | None]:
    """The rows a table prints, and the line that counts the others (None: all shown)."""
    if len(rows) <= MAX_TABLE_ROWS:
        return rows, None
    more = len(rows) - MAX_TABLE_ROWS
    return rows[:MAX_TABLE_ROWS], Text(
        f"… and {more:,} more rows (of {len(rows):,}; --json lists them all)"
    )


def pools_table(plan: BindingPlan) -> Table:
    """One row per pool: name, size, bytes, base alignment, blocks (at most
    :data:`MAX_TABLE_ROWS`, the rest counted in the caption)."""
    rows, more = shown_rows(plan.pools)
    table = Table(title="pools", caption=more)
    for column in ("name", "size", "bytes", "alignment", "blocks"):
        table.add_column(column, justify="left" if column == "name" else "right")
    for pool in rows:
        table.add_row(
            cell(pool.name),
            cell(human_bytes(pool.size_bytes)),
            cell(f"{pool.size_bytes:,}"),
            cell(pool.alignment_bytes),
            cell(f"{pool.num_blocks:,}"),
        )
    return table
