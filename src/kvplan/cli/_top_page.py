"""``kvplan top --html OUT``: the engines' mapped pages drawn on their plans, and above them
the groups they are members of (``kvplan.render.elastic``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kvplan.cli._output import cell, stderr_console
from kvplan.elastic.files import ElasticStats
from kvplan.elastic.status import EngineStatus
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, printable, warning
from kvplan.schemas.loading import write_text_atomic
from kvplan.schemas.plan import BindingPlan

Row = tuple[Path, ElasticStats, EngineStatus]
MAX_ENGINE_CHARS = 48


def write_page(
    out: Path, directory: Path, rows: list[Row], now: float, groups: list[Any] | None = None
) -> list[Diagnostic]:
    """``top --html OUT``: the engines' mapped pages drawn on their plans, under the groups
    they are members of (``groups``: their snapshots); the problems."""
    from kvplan.render import EngineView, elastic_page
    from kvplan.render.elastic import plan_mismatch

    views: list[EngineView] = []
    problems: list[Diagnostic] = []
    plans: dict[Path, BindingPlan | Diagnostic] = {}
    for index, (path, stats, status) in enumerate(rows):
        plan_file = path.parent / f"rank{stats.rank}.plan.json"
        plan: BindingPlan | None = None
        problem: Diagnostic | None = None
        if index < MAX_ENGINES_DRAWN:
            if plan_file not in plans:
                plans[plan_file] = _load_plan(plan_file, stats)
            found = plans[plan_file]
            if isinstance(found, Diagnostic):
                problem = found
            else:
                mismatch = plan_mismatch(stats, found)
                if mismatch is None:
                    plan = found
                else:
                    problem = warning(
                        Code.STATS_PLAN_MISMATCH,
                        printable(str(plan_file)),
                        f"this plan is not the one rank {stats.rank} of "
                        f"{printable(stats.engine, MAX_ENGINE_CHARS)} bound: {mismatch}.",
                        "point kvplan top at the engine's own KVPLAN_DUMP_DIR",
                    )
            if problem is not None:
                problems.append(problem)
        views.append(EngineView(path, stats, status.status, status.age_seconds, plan, problem))
    page = elastic_page(
        views, title=str(directory), now=now, drawn=MAX_ENGINES_DRAWN, groups=groups or []
    )
    read = [path for path, _, _ in rows] + [p for p in plans if os.path.lexists(p)]
    write_text_atomic(out, page, inputs=read)
    stderr_console().print(cell(f"wrote {out}"))
    return problems


def _load_plan(path: Path, stats: ElasticStats) -> BindingPlan | Diagnostic:
    from kvplan.schemas.loading import load_plan

    where = printable(str(path))
    if not os.path.lexists(path):  # a dangling link is there: refused by the read
        return warning(
            Code.STATS_PLAN_MISMATCH,
            where,
            f"no plan next to the stats of rank {stats.rank}: the page shows its figures but not "
            "which pages are mapped.",
            "the engine writes rank<N>.plan.json into KVPLAN_DUMP_DIR when it binds",
        )
    try:
        # regular files only, never through a link, this user's or root's
        return load_plan(path, within=path.parent, own=True)
    except KVPlanError as exc:
        first = exc.diagnostics[0]
        return warning(
            Code.STATS_PLAN_MISMATCH,
            where,
            f"the plan of rank {stats.rank} cannot be used: {first.code.value} "
            f"{first.message.rstrip('.')}.",
            first.hint or "let the engine rewrite it",
        )


MAX_ENGINES_DRAWN = 16
"""Ranks whose pools ``top --html`` draws; every rank is listed in its table."""
