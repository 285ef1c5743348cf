"""``kvplan apply PLAN``: bind a saved plan with a backend, verify it, report time and memory.

torch (and cuda-python) load only inside the command, never when the CLI is imported.
"""

from __future__ import annotations

import re
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from kvplan import units
from kvplan.cli._documents import load_document_as_plan
from kvplan.cli._output import EXIT_ERROR, cell, guarded, print_json, report, stdout_console
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error, show_value
from kvplan.schemas.plan import BindingPlan
from kvplan.units import human_bytes

Mode = Literal["eager", "elastic"]


class ModeName(StrEnum):
    eager = "eager"
    elastic = "elastic"


def check_backend(name: str) -> str:
    """``--backend``: a name in the executor's registry (read when the command runs, so a
    backend registered with ``register_backend`` is accepted); else a usage error."""
    from kvplan.executor.backends import backend_names

    known = backend_names()
    if name not in known:
        raise typer.BadParameter(f"{name!r} is not a backend; known: {', '.join(known)}")
    return name


def parse_block_ranges(text: str) -> list[range]:
    """``0-3,8`` → ``[range(0, 4), range(8, 9)]``: the ranges, never the expanded list."""
    out: list[range] = []
    for part in filter(None, (p.strip(" \t") for p in text.split(","))):
        match = re.fullmatch(r"([0-9]{1,19})(?:-([0-9]{1,19}))?", part)  # ASCII digits only
        if not match:
            raise KVPlanError(
                error(
                    Code.SCHEMA,
                    "--blocks",
                    f"Cannot read block range {show_value(part)}.",
                    "e.g. 0-15,32",
                )
            )
        lo = int(match.group(1))
        hi = int(match.group(2) or lo)
        if hi < lo:
            raise KVPlanError(
                error(Code.SCHEMA, "--blocks", f"range {lo}-{hi} is empty.", "write low-high")
            )
        out.append(range(lo, hi + 1))
    return out


def parse_blocks(text: str, num_blocks: int | None = None) -> list[int]:
    """``0-3,8`` → ``[0, 1, 2, 3, 8]`` (sorted, without repeats).

    Every range is checked against ``num_blocks`` (``KVP404``) and the count against
    :data:`MAX_BLOCK_IDS` (``KVP405``) before any list is built: ``0-999999999`` costs nothing.
    """
    ranges = parse_block_ranges(text)
    if num_blocks is not None:
        for r in ranges:
            if r[-1] >= num_blocks:
                raise KVPlanError(
                    error(
                        Code.BLOCK_OUT_OF_RANGE,
                        "--blocks",
                        f"block {r[-1]} is out of range: the plan has {num_blocks} blocks "
                        f"(0-{num_blocks - 1}).",
                        f"pick block ids below {num_blocks}",
                    )
                )
    if sum(len(r) for r in ranges) > MAX_BLOCK_IDS:
        raise KVPlanError(
            error(
                Code.OPTION_OUT_OF_RANGE,
                "--blocks",
                f"more than {MAX_BLOCK_IDS:,} block ids.",
                "name fewer blocks",
            )
        )
    ids: set[int] = set()
    for r in ranges:
        ids.update(r)
    return sorted(ids)


MAX_BLOCK_IDS = 1 << 24
"""Most block ids ``--blocks`` names when no plan bounds them."""


def _run(
    plan: BindingPlan,
    backend: str,
    device: str | None,
    mode: Mode,
    chunk: int | None,
    blocks: list[int],
) -> tuple[dict[str, Any], list[Diagnostic]]:
    from kvplan.executor import apply, verify

    clock = time.perf_counter
    cache = apply(plan, backend=backend, device=device, mode=mode, chunk_size=chunk)
    with cache:
        timings = dict(cache.timings_ms)
        t0 = clock()
        if blocks:
            cache.ensure_mapped(blocks)
            timings["ensure_mapped"] = (clock() - t0) * 1e3
        t1 = clock()
        diags = verify(plan, cache.tensors, pools=cache.pools)
        timings["verify"] = (clock() - t1) * 1e3
        stats = cache.stats()
        t2 = clock()
    timings["close"] = (clock() - t2) * 1e3
    stats["timings_ms"] = {k: round(v, 3) for k, v in timings.items()}
    return stats, diags


def _table(plan: BindingPlan, stats: dict[str, Any], ok: bool) -> Table:

    table = Table(title=f"kvplan apply ({stats['backend']}, {stats['mode']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, ms in stats["timings_ms"].items():
        table.add_row(f"{name} (ms)", f"{ms:.3f}")
    table.add_row("device", cell(stats["device"]))
    table.add_row(
        "pools / views / aliases", f"{len(plan.pools)} / {len(plan.views)} / {len(plan.aliases)}"
    )
    table.add_row("chunk", human_bytes(stats["chunk_bytes"]))
    table.add_row(
        "reserved", f"{human_bytes(stats['reserved_bytes'])} ({stats['reserved_bytes']} B)"
    )
    table.add_row("mapped", f"{human_bytes(stats['mapped_bytes'])} ({stats['mapped_bytes']} B)")
    if stats["mode"] == "elastic":
        table.add_row("mapped blocks", str(stats["mapped_blocks"]))
    table.add_row("verify", "ok" if ok else "FAILED")
    return table


def apply_command(
    plan_path: Annotated[
        Path, typer.Argument(metavar="PLAN", help="plan file: .json, .yaml, .yml")
    ],
    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            "-b",
            callback=check_backend,
            help="memory backend: a registered name (meta, torch, host-vmm, cuda-vmm, ...)",
        ),
    ] = "cuda-vmm",
    mode: Annotated[
        ModeName, typer.Option(help="eager: map everything; elastic: reserve only")
    ] = ModeName.eager,
    device: Annotated[str | None, typer.Option(help="torch device, e.g. cpu or cuda:0")] = None,
    chunk_size: Annotated[
        str | None,
        typer.Option(
            "--chunk-size",
            help="physical chunk size, e.g. 2MiB, 32MiB [default: eager 128MiB (at most the "
            "pool), elastic the backend granularity]",
        ),
    ] = None,
    blocks: Annotated[
        str | None, typer.Option(help="elastic: block ids to map after apply, e.g. 0-15,32")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Apply PLAN with a backend, verify every tensor, print timings (ms) and memory."""
    chunk = (
        units.parse_size(chunk_size, "--chunk-size", limit=units.MAX_OPTION_BYTES)
        if chunk_size is not None
        else None
    )
    if blocks:
        parse_block_ranges(blocks)  # syntax first, before the plan is read
    plan = load_document_as_plan(plan_path)
    bound = max([plan.source.num_blocks, *(pool.num_blocks for pool in plan.pools)])
    block_ids = parse_blocks(blocks, bound) if blocks else []
    run_mode: Mode = "elastic" if mode is ModeName.elastic else "eager"
    # backend failures arrive as KVP402 from the executor; anything else is a kvplan bug and
    # is reported as one (KVP019) by the error boundary, never dressed as a driver failure
    stats, diags = _run(plan, backend, device, run_mode, chunk, block_ids)
    ok = not any(d.is_error for d in diags)
    if json_out:
        print_json(
            {
                "plan": {
                    "path": str(plan_path),
                    "fingerprint": plan.fingerprint,
                    "pools": len(plan.pools),
                    "views": len(plan.views),
                    "aliases": len(plan.aliases),
                },
                **{k: v for k, v in stats.items() if k != "timings_ms"},
                "timings_ms": stats["timings_ms"],
                "verify": {
                    "ok": ok,
                    "diagnostics": [d.model_dump(mode="json") for d in diags],
                },
            }
        )
    else:
        stdout_console().print(_table(plan, stats, ok))
    if diags:
        report(diags)
    if not ok:
        raise typer.Exit(EXIT_ERROR)


def register(app: typer.Typer) -> None:
    """Add the ``apply`` command to ``app``."""
    app.command("apply")(guarded(apply_command))  # guarded here too: tests register it alone
