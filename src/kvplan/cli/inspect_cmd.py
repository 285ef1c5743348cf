"""``kvplan inspect MODEL``: how the installed vLLM would lay out a model's KV cache."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from kvplan.cli._inspect_flags import InspectFlags, with_inspect_flags
from kvplan.cli._output import (
    EXIT_DIFFERENT,
    cell,
    print_data,
    stderr_console,
    stdout_console,
)
from kvplan.cli._tables import pools_table, views_table
from kvplan.planner.names import LayerNames, short_kind
from kvplan.schemas.canonical import to_data
from kvplan.schemas.errors import printable
from kvplan.schemas.loading import check_output, dump, dumps, write_text_atomic
from kvplan.units import human_bytes

if TYPE_CHECKING:
    from kvplan.integrations.vllm.inspect import InspectOptions, InspectResult
    from kvplan.schemas.input import InputDocument
    from kvplan.schemas.plan import BindingPlan


def bundle(document: InputDocument, plan: BindingPlan) -> dict[str, Any]:
    """What ``--json``/``--yaml``/``-o`` write: the input document and its plan."""
    return {"input": to_data(document), "plan": to_data(plan)}


def model_files(model: str) -> list[Path]:
    """The files ``inspect`` reads for a local MODEL (a directory or its config.json): an
    output may not be one of them."""
    path = Path(model)
    return [p for p in (path, path / "config.json") if p.is_file()]


def list_catalog() -> None:
    from kvplan.catalog import entries

    table = Table(title="bundled models (kvplan inspect ORG/NAME)")
    table.add_column("model")
    table.add_column("directory")
    for entry in entries():
        table.add_row(entry.model_id, entry.slug)
    stdout_console().print(table)


def run_inspect(model: str, options: InspectOptions, *, quiet: bool) -> InspectResult:
    """:func:`inspect_model` with a rich status line on stderr."""
    from kvplan.integrations.vllm import prepare_environment, require_vllm

    require_vllm()
    prepare_environment(quiet=quiet)
    from kvplan.integrations.vllm.inspect import inspect_model

    console = stderr_console()
    with console.status(cell(f"loading vLLM to inspect {model}…")) as status:

        def progress(message: str) -> None:
            status.update(cell(f"{message}…"))

        return inspect_model(model, options, progress)


def _short(layer: str) -> str:
    """``13`` for ``….layers.13.self_attn.attn``; the name itself otherwise."""
    match = re.search(r"layers\.([0-9]+)\.", layer)
    return match.group(1) if match else layer


def _per_token(spec: Any, layers: int) -> float:
    return float(spec.page_size_bytes) * layers / spec.block_size


def render(result: InspectResult) -> None:
    """Human output (rich tables on stdout)."""
    from kvplan.schemas.specs import UniformTypeKVCacheSpecs, layer_spec, spec_kind

    console = stdout_console()
    doc, plan = result.document, result.plan
    config = doc.kv_cache_config
    s = plan.summary
    tp = f"  TP={result.options.tp} (rank 0 shown)" if result.options.tp > 1 else ""
    console.print(
        Text.assemble(
            (printable(result.model.name), "bold"),
            f"  ({printable(result.model.source)}, {printable(result.architecture)})",
        )
    )
    console.print(
        cell(
            f"vLLM {doc.vllm_version}  layout {result.layout}  "
            f"max_model_len {result.max_model_len:,}  "
            f"KV memory {human_bytes(result.kv_memory_bytes)}  weights as built "
            f"{human_bytes(result.weight_bytes)}{tp}"
        )
    )
    if result.extensible_kv_cache is not None:
        state = "on (its padded segments shown)" if result.extensible_kv_cache else "off"
        console.print(cell(f"vLLM's extensible KV cache {state}; kvplan's plugin turns it off"))
    console.print(
        f"[bold]{result.attention_layers} layers[/bold]: {s.tensor_backed_layers} tensor-backed, "
        f"{s.aliased_layers} aliases (KV sharing)"
    )
    group_of = {view.layer: view.group for view in plan.views}
    sharers: dict[str, list[str]] = defaultdict(list)
    for alias in plan.aliases:
        sharers[alias.target].append(alias.layer)
    kbs = doc.kernel_block_sizes or []
    groups = Table(title="groups")
    for column in ("#", "kind", "block", "kernel", "page", "layers", "aliases", "B/token"):
        groups.add_column(column, justify="left" if column in ("kind", "layers") else "right")
    stored = 0.0
    for gid, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        kind = short_kind(spec.kind)
        uniform = isinstance(spec, UniformTypeKVCacheSpecs)
        per_token = _per_token(spec, 1 if uniform else len(group.layer_names))
        leaf = spec.first_spec if isinstance(spec, UniformTypeKVCacheSpecs) else spec
        if uniform:
            kind += f"[{short_kind(leaf.kind)}]"
        mamba = spec_kind(leaf).is_mamba
        stored += 0.0 if mamba else per_token
        groups.add_row(
            *map(
                cell,
                (
                    gid,
                    kind,
                    spec.block_size,
                    kbs[gid] if gid < len(kbs) else "-",
                    human_bytes(spec.page_size_bytes),
                    ",".join(_short(name) for name in group.layer_names),
                    sum(len(sharers.get(name, [])) for name in group.layer_names),
                    "-" if mamba else f"{per_token:,.0f}",
                ),
            )
        )
    console.print(groups)
    console.print(  # two lines: each fits 100 columns
        f"KV bytes per token: {stored:,.0f} (tensor-backed attention layers); "
        f"{config.num_blocks:,} blocks\ntokens that fit: {result.capacity_tokens:,} "
        f"(max concurrency {result.max_concurrency:.2f}x at {result.max_model_len:,} tokens)"
    )
    console.print(pools_table(plan))
    layer_names = LayerNames(plan.layers)
    short = layer_names.short
    console.print(views_table(plan.views, layer_names, kinds=False))
    if not plan.aliases:
        return
    aliases = Table(title="aliases (KV sharing: bound to the target's tensor)")
    for column in ("target", "group", "sharers"):
        aliases.add_column(column, justify="right" if column == "group" else "left")
    saved = 0.0
    for target, names in sharers.items():
        aliases.add_row(
            cell(short(target)),
            cell(group_of.get(target, "-")),
            cell(",".join(_short(name) for name in names)),
        )
        target_group = group_of.get(target)
        if target_group is not None:
            target_spec = layer_spec(config.kv_cache_groups[target_group].kv_cache_spec, target)
            if target_spec is not None:
                saved += _per_token(target_spec, len(names))
    console.print(aliases)
    share = f" ({saved / (saved + stored):.0%} of {saved + stored:,.0f})" if stored else ""
    console.print(  # two lines: each fits 100 columns
        f"KV sharing saves {saved:,.0f} B/token{share}\n"
        f"  = {human_bytes(s.alias_saved_bytes)} ({s.alias_saved_bytes:,} bytes) at "
        f"{config.num_blocks:,} blocks"
    )


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    @with_inspect_flags
    def inspect_cmd(
        model: Annotated[
            str | None,
            typer.Argument(
                metavar="MODEL",
                help="local directory or config.json, bundled catalog name, or Hugging Face id",
            ),
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="print the input document and plan as JSON")
        ] = False,
        as_yaml: Annotated[bool, typer.Option("--yaml", help="print them as YAML")] = False,
        output: Annotated[
            Path | None,
            typer.Option("-o", "--output", help="write the input document and plan here"),
        ] = None,
        html: Annotated[
            Path | None, typer.Option("--html", metavar="OUT", help="also draw the plan as HTML")
        ] = None,
        verify: Annotated[
            bool,
            typer.Option(
                "--verify", help="check the plan against vLLM's allocate_kv_cache (meta device)"
            ),
        ] = False,
        list_models: Annotated[bool, typer.Option("--list", help="list the catalog")] = False,
        verbose: Annotated[bool, typer.Option("--verbose", "-v", help="show vLLM's logs")] = False,
        *,
        flags: InspectFlags,
    ) -> None:
        """Ask the installed vLLM how it lays out MODEL's KV cache; capture and plan it."""
        if list_models:
            list_catalog()
            return
        if model is None:
            raise typer.BadParameter("MODEL is required (or pass --list)")
        options = flags.options()
        inputs = model_files(model)
        for target in (output, html):
            if target is not None:
                check_output(target, inputs=inputs)
        result = run_inspect(model, options, quiet=not verbose)
        data = bundle(result.document, result.plan)
        if output is not None:
            dump(data, output, inputs=inputs)
            stderr_console().print(cell(f"wrote {output}"))
        if html is not None:
            from kvplan.render import plan_page

            page = plan_page(result.plan, title=result.model.name)
            write_text_atomic(html, page, inputs=inputs)
            stderr_console().print(cell(f"wrote {html}"))
        if as_json or as_yaml:
            print_data(dumps(data, yaml_format=as_yaml))
        else:
            render(result)
        for note in result.notes:
            stderr_console().print(cell(f"note: {note}"))
        stderr_console().print(f"inspected in {result.seconds:.1f} s", markup=False)
        if verify:
            problems = verify_result(result)
            if problems:
                for line in problems:
                    stderr_console().print(line, markup=False)
                raise typer.Exit(EXIT_DIFFERENT)
            stderr_console().print(
                "verified: every view and alias equals vLLM's allocate_kv_cache", markup=False
            )


def verify_result(result: InspectResult) -> list[str]:
    """Differences between each rank's plan and vLLM's tensors (meta device)."""
    from kvplan.integrations.vllm import to_vllm
    from kvplan.integrations.vllm.inspect.fidelity import compare, vllm_kv_caches

    problems: list[str] = []
    for rank, (doc, plan) in enumerate(zip(result.documents, result.plans, strict=True)):
        caches = vllm_kv_caches(
            to_vllm(doc, with_sharers=True),
            result.layout,
            doc.kernel_block_sizes,
            doc.shared_kv_cache_layers,
        )
        problems += [f"rank {rank}: {line}" for line in compare(plan, caches)]
    return problems
