"""Rich tables shared by commands that show plans."""

from __future__ import annotations

from rich.table import Table

from kvplan.schemas.plan import BindingPlan
from kvplan.units import human_bytes


def pools_table(plan: BindingPlan) -> Table:
    """One row per pool: name, size, bytes, base alignment, blocks."""
    table = Table(title="pools")
    for column in ("name", "size", "bytes", "alignment", "blocks"):
        table.add_column(column, justify="left" if column == "name" else "right")
    for pool in plan.pools:
        table.add_row(
            pool.name,
            human_bytes(pool.size_bytes),
            f"{pool.size_bytes:,}",
            str(pool.alignment_bytes),
            f"{pool.num_blocks:,}",
        )
    return table
