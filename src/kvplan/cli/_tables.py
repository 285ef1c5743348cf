"""Rich tables shared by commands that show plans."""

from __future__ import annotations

from rich.table import Table

from kvplan.cli._output import cell
from kvplan.schemas.plan import BindingPlan
from kvplan.units import human_bytes


def pools_table(plan: BindingPlan) -> Table:
    """One row per pool: name, size, bytes, base alignment, blocks."""
    table = Table(title="pools")
    for column in ("name", "size", "bytes", "alignment", "blocks"):
        table.add_column(column, justify="left" if column == "name" else "right")
    for pool in plan.pools:
        table.add_row(
            cell(pool.name),
            cell(human_bytes(pool.size_bytes)),
            cell(f"{pool.size_bytes:,}"),
            cell(pool.alignment_bytes),
            cell(f"{pool.num_blocks:,}"),
        )
    return table
