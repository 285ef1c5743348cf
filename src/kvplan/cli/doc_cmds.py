"""Offline document commands: plan, validate, show, diff, schema. No torch, no vLLM."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvplan.cli._output import (
    EXIT_DIFFERENT,
    EXIT_ERROR,
    fail,
    print_data,
    print_json,
    report,
    stderr_console,
    stdout_console,
)
from kvplan.planner import build_plan, diff_plans, validate
from kvplan.schemas.canonical import to_data
from kvplan.schemas.errors import KVPlanError
from kvplan.schemas.input import InputDocument
from kvplan.schemas.loading import dump, dumps, load_any
from kvplan.schemas.plan import BindingPlan


class DiffFormat(StrEnum):
    text = "text"
    json = "json"
    markdown = "markdown"


class SchemaName(StrEnum):
    input = "input"
    plan = "plan"


def as_plan(obj: InputDocument | BindingPlan) -> BindingPlan:
    """A plan as it is, or the plan of an input document (errors raise, warnings print)."""
    if isinstance(obj, BindingPlan):
        return obj
    result, problems = build_plan(obj)
    errors = [d for d in problems if d.is_error]
    if errors or result is None:
        raise KVPlanError(errors)
    report(problems)
    return result


def _load_plan(path: Path) -> BindingPlan:
    return as_plan(load_any(path))


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"


def render_plan(plan: BindingPlan) -> None:
    """Rich tables: pools, views by group, aliases, memory summary (stdout)."""
    console = stdout_console()
    src = plan.source
    console.print(
        f"plan {plan.fingerprint[:19]}…  vLLM {src.vllm_version or '?'}  "
        f"layout {src.layout or '-'}  blocks {src.num_blocks}"
    )
    pools = Table(title="pools")
    for col in ("name", "size", "bytes", "alignment", "blocks"):
        pools.add_column(col, justify="left" if col == "name" else "right")
    for p in plan.pools:
        pools.add_row(
            p.name,
            human_bytes(p.size_bytes),
            str(p.size_bytes),
            str(p.alignment_bytes),
            str(p.num_blocks),
        )
    console.print(pools)
    views = Table(title="views")
    for col in ("group", "layer", "kind", "dtype", "shape", "stride", "offset"):
        views.add_column(col, justify="right" if col in ("group", "offset") else "left")
    for v in sorted(plan.views, key=lambda v: v.group):
        views.add_row(
            str(v.group), v.layer, v.kind, v.dtype, str(v.shape), str(v.stride), str(v.offset_bytes)
        )
    console.print(views)
    if plan.aliases:
        aliases = Table(title="aliases (KV sharing)")
        aliases.add_column("layer")
        aliases.add_column("reads the cache of")
        for a in plan.aliases:
            aliases.add_row(a.layer, a.target)
        console.print(aliases)
    s = plan.summary
    console.print(
        f"{s.tensor_backed_layers} tensor-backed layers, {s.aliased_layers} aliased; "
        f"{human_bytes(s.bytes_per_block)} per block; pools {human_bytes(s.pool_bytes)}; "
        f"KV sharing saves {human_bytes(s.alias_saved_bytes)}"
    )


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        input_path: Annotated[
            Path, typer.Argument(metavar="IN", help="input document (JSON/YAML, - for stdin)")
        ],
        output: Annotated[
            Path | None, typer.Option("-o", "--output", help="write the plan here (YAML if .yaml)")
        ] = None,
        yaml: Annotated[bool, typer.Option("--yaml", help="print YAML instead of JSON")] = False,
    ) -> None:
        """Plan an input document: print (or write) the canonical BindingPlan."""
        try:
            plan = _load_plan(input_path)
        except KVPlanError as exc:
            fail(exc)
        if output is not None:
            dump(plan, output)
            stderr_console().print(f"wrote {output}", markup=False)
        else:
            print_data(dumps(plan, yaml_format=yaml))

    @app.command("validate")
    def validate_cmd(
        path: Annotated[Path, typer.Argument(metavar="FILE", help="input document or plan")],
        as_json: Annotated[bool, typer.Option("--json", help="print diagnostics as JSON")] = False,
        strict: Annotated[bool, typer.Option("--strict", help="warnings fail too")] = False,
    ) -> None:
        """Check a document; exit 2 if it has errors (or warnings, with --strict)."""
        try:
            obj = load_any(path)
            problems = validate(obj)
        except KVPlanError as exc:
            problems = exc.diagnostics
        bad = [d for d in problems if d.is_error or strict]
        if as_json:
            print_json(
                {"valid": not bad, "diagnostics": [d.model_dump(mode="json") for d in problems]}
            )
        else:
            report(problems)
            if not bad:
                stderr_console().print(f"{path}: valid", markup=False)
        if bad:
            raise typer.Exit(EXIT_ERROR)

    @app.command("show")
    def show_cmd(
        path: Annotated[Path, typer.Argument(metavar="PLAN", help="plan (or input document)")],
        as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    ) -> None:
        """Show a plan as tables: pools, views by group, aliases, memory summary."""
        try:
            plan = _load_plan(path)
        except KVPlanError as exc:
            fail(exc)
        if as_json:
            print_json(to_data(plan))
        else:
            render_plan(plan)

    @app.command("diff")
    def diff_cmd(
        a: Annotated[Path, typer.Argument(metavar="A", help="plan or input document")],
        b: Annotated[Path, typer.Argument(metavar="B", help="plan or input document")],
        fmt: Annotated[
            DiffFormat, typer.Option("--format", "-f", help="output format")
        ] = DiffFormat.text,
    ) -> None:
        """Semantic diff keyed by pool and layer; exit 0 same, 1 different, 2 error."""
        try:
            result = diff_plans(_load_plan(a), _load_plan(b))
        except KVPlanError as exc:
            fail(exc)
        text = {
            DiffFormat.text: result.to_text,
            DiffFormat.json: result.to_json,
            DiffFormat.markdown: result.to_markdown,
        }[fmt]()
        print_data(text)
        if not result.same:
            raise typer.Exit(EXIT_DIFFERENT)

    @app.command("schema")
    def schema_cmd(
        which: Annotated[SchemaName, typer.Argument(help="input or plan")],
    ) -> None:
        """Print the JSON schema of the input document or of the plan."""
        from kvplan.schemas.json_schema import schema_of

        print_data(json.dumps(schema_of(which.value), indent=2) + "\n")
