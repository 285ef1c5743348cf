"""Rich tables shared by commands that show plans."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from rich.table import Table
from rich.text import Text

from kvplan.cli._output import cell
from kvplan.planner.names import LayerNames, dims, short_kind
from kvplan.schemas.plan import BindingPlan, View
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


def views_table(views: Sequence[View], names: LayerNames, *, kinds: bool) -> Table:
    """One row per view, one line each: group, layer (short), kind (short; with ``kinds``),
    dtype, shape, stride, byte offset. Ordered by group, then offset; at most
    :data:`MAX_TABLE_ROWS` rows (the rest counted in the caption). The same table in
    ``kvplan show`` and ``kvplan inspect``."""
    ordered = sorted(views, key=lambda v: (v.group, v.offset_bytes))
    rows, more = shown_rows(ordered)
    table = Table(title=cell(f"views by group{names.legend}"), caption=more)
    columns = ["group", "layer", *(["kind"] if kinds else []), "dtype", "shape", "stride", "offset"]
    for column in columns:
        table.add_column(
            column, justify="right" if column in ("group", "offset") else "left", no_wrap=True
        )
    for view in rows:
        values: list[object] = [view.group, names.short(view.layer)]
        if kinds:
            values.append(short_kind(view.kind))
        values += [view.dtype, dims(view.shape), dims(view.stride), view.offset_bytes]
        table.add_row(*map(cell, values))
    return table
