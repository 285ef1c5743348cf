"""Offline document commands: plan, validate, show, diff, schema. No torch, no vLLM."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvplan.cli._documents import LegacyOptions, as_plan, load_document_as_plan
from kvplan.cli._output import (
    EXIT_DIFFERENT,
    EXIT_ERROR,
    cell,
    print_data,
    print_json,
    report,
    safe_lines,
    stderr_console,
    stdout_console,
)
from kvplan.cli._tables import pools_table, shown_rows, views_table
from kvplan.planner import diff_plans, validate
from kvplan.planner.names import LayerNames
from kvplan.schemas.canonical import escape_json_text, to_data
from kvplan.schemas.errors import KVPlanError
from kvplan.schemas.loading import check_output, dump, dumps, load_any, write_text_atomic
from kvplan.schemas.plan import BindingPlan
from kvplan.units import human_bytes, parse_int


class DiffFormat(StrEnum):
    text = "text"
    json = "json"
    markdown = "markdown"


def render_plan(plan: BindingPlan) -> None:
    """Rich tables: pools, views by group, aliases, memory summary (stdout). Views print
    as ``kvplan inspect`` prints them: one line each, layer names short under one legend.

    Every text from the document goes through :func:`cell`: never markup, never raw escapes.
    Each table prints at most ``MAX_TABLE_ROWS`` rows and counts the rest (``--json``: all).
    """
    console = stdout_console()
    src = plan.source
    console.print(
        cell(
            f"plan {plan.fingerprint[:19]}…  vLLM {src.vllm_version or '?'}  "
            f"layout {src.layout or '-'}  blocks {src.num_blocks}"
        )
    )
    console.print(pools_table(plan))
    names = LayerNames(plan.layers)
    console.print(views_table(plan.views, names, kinds=True))
    if plan.aliases:
        shown, more = shown_rows(plan.aliases)
        aliases = Table(title=cell(f"aliases (KV sharing){names.legend}"), caption=more)
        aliases.add_column("layer", no_wrap=True)
        aliases.add_column("reads the cache of", no_wrap=True)
        for a in shown:
            aliases.add_row(cell(names.short(a.layer)), cell(names.short(a.target)))
        console.print(aliases)
    s = plan.summary
    console.print(  # two lines: each fits 100 columns
        cell(
            f"{s.tensor_backed_layers} tensor-backed layers, {s.aliased_layers} aliased; "
            f"{human_bytes(s.bytes_per_block)} per block; pools {human_bytes(s.pool_bytes)}"
        )
    )
    console.print(cell(f"KV sharing saves {human_bytes(s.alias_saved_bytes)}"))


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
        strategy: Annotated[
            str | None,
            typer.Option(
                "--strategy",
                help="legacy (vLLM 0.22-0.28) documents: vanilla | kvcached "
                "(default: the document's binding.strategy)",
            ),
        ] = None,
        pool_layout: Annotated[
            str | None,
            typer.Option(
                "--pool-layout",
                help="kvcached pool layout: noncontiguous | contiguous | per-layer",
            ),
        ] = None,
        virtual_capacity: Annotated[
            str | None,
            typer.Option(
                "--virtual-capacity",
                metavar="BYTES",
                help="kvcached: address space each pool reserves",
            ),
        ] = None,
    ) -> None:
        """Plan an input document: print (or write) the canonical BindingPlan."""
        capacity = (
            None if virtual_capacity is None else parse_int(virtual_capacity, "--virtual-capacity")
        )
        legacy = LegacyOptions(strategy, pool_layout, capacity)
        legacy.check()
        if output is not None:
            check_output(output, inputs=[input_path])
        plan = as_plan(load_any(input_path), legacy, source=str(input_path))
        if output is not None:
            dump(plan, output, inputs=[input_path])
            stderr_console().print(cell(f"wrote {output}"))
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
            problems = validate(load_any(path))
        except KVPlanError as exc:
            problems = exc.diagnostics
        bad = problems.as_errors() if strict else problems.errors
        if as_json:
            print_json(
                {"valid": not bad, "diagnostics": [d.model_dump(mode="json") for d in problems]}
            )
        else:
            report(problems)
            if not bad:
                stderr_console().print(cell(f"{path}: valid"))
        if bad:
            raise typer.Exit(EXIT_ERROR)

    @app.command("show")
    def show_cmd(
        path: Annotated[Path, typer.Argument(metavar="PLAN", help="plan (or input document)")],
        as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
        html: Annotated[
            Path | None, typer.Option("--html", metavar="OUT", help="also draw the plan as HTML")
        ] = None,
    ) -> None:
        """Show a plan as tables: pools, views by group, aliases, memory summary."""
        if html is not None:
            check_output(html, inputs=[path])
        plan = load_document_as_plan(path)
        if html is not None:
            from kvplan.render import plan_page

            write_text_atomic(html, plan_page(plan, title=path.name), inputs=[path])
            stderr_console().print(cell(f"wrote {html}"))
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
        html: Annotated[
            Path | None,
            typer.Option("--html", metavar="OUT", help="also draw both plans side by side as HTML"),
        ] = None,
    ) -> None:
        """Semantic diff keyed by pool and layer; exit 0 same, 1 different, 2 error."""
        if html is not None:
            check_output(html, inputs=[a, b])
        plan_a, plan_b = load_document_as_plan(a), load_document_as_plan(b)
        result = diff_plans(plan_a, plan_b)
        if html is not None:
            from kvplan.render import diff_page

            page = diff_page(plan_a, plan_b, (str(a), str(b)))
            write_text_atomic(html, page, inputs=[a, b])
            stderr_console().print(cell(f"wrote {html}"))
        text = {
            DiffFormat.text: result.to_text,
            DiffFormat.json: result.to_json,
            DiffFormat.markdown: result.to_markdown,
        }[fmt]()
        print_data(escape_json_text(text) if fmt is DiffFormat.json else safe_lines(text))
        if not result.same:
            raise typer.Exit(EXIT_DIFFERENT)

    @app.command("schema")
    def schema_cmd(
        which: Annotated[str, typer.Argument(metavar="NAME", help="input, legacy or plan")],
    ) -> None:
        """Print the JSON schema of a document: input, legacy (input) or plan."""
        from kvplan.schemas.json_schema import schema_of

        print_data(json.dumps(schema_of(which), indent=2) + "\n")
