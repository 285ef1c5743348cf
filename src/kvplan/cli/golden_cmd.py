"""``kvplan golden check|update|add DIR``: golden plans of real models, for CI.

``DIR/<model>/input.json`` is what ``kvplan inspect`` captured (its ``metadata`` records the
model and the inspect options), ``DIR/<model>/plan.json`` the plan. ``check`` regenerates each
plan — through vLLM, or with ``--input-only`` by re-planning the stored input — and prints a
markdown drift report on stdout: exit 0 when every plan is identical, 1 on drift, 2 when a
model could not be regenerated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvplan.cli._inspect_flags import InspectFlags, with_inspect_flags
from kvplan.cli._output import (
    EXIT_DIFFERENT,
    EXIT_ERROR,
    print_data,
    safe_lines,
    stderr_console,
)
from kvplan.schemas.canonical import to_data
from kvplan.schemas.errors import Code, KVPlanError, error, printable
from kvplan.schemas.loading import check_output, dump, write_text_atomic

if TYPE_CHECKING:
    from kvplan.integrations.vllm.inspect import InspectOptions
    from kvplan.schemas.input import InputDocument
    from kvplan.schemas.plan import BindingPlan

INPUT_ONLY = typer.Option("--input-only", help="skip vLLM: re-plan the stored input documents")
INPUT_NAME = "input.json"
PLAN_NAME = "plan.json"


@dataclass
class Outcome:
    """One golden model: what was stored, what was regenerated, and how they differ."""

    name: str
    stored_plan: BindingPlan | None = None
    document: InputDocument | None = None
    plan: BindingPlan | None = None
    input_changed: bool = False
    markdown: str = ""
    same: bool = False
    error: str = ""


def golden_dirs(root: Path) -> list[Path]:
    """Every ``<model>`` entry of ``root`` with an ``input.json`` of any kind, sorted (a
    link, a fifo or a linked folder is listed, and refused when it is read); ``root``
    itself when it holds one. ``KVP002`` no such directory, ``KVP024`` no model in it."""
    if os.path.lexists(root / INPUT_NAME):
        return [root]
    if not root.is_dir():
        raise KVPlanError(error(Code.UNREADABLE, str(root), "no such golden directory."))
    found = sorted(child for child in root.iterdir() if os.path.lexists(child / INPUT_NAME))
    if not found:
        raise KVPlanError(
            error(
                Code.NOTHING_TO_CHECK,
                str(root),
                f"no golden model in this directory (no <model>/{INPUT_NAME}): nothing to check.",
                "pass the golden directory itself; add models with kvplan golden add",
            )
        )
    return found


def options_of(document: InputDocument) -> tuple[str, InspectOptions, int]:
    """The model, inspect options and TP rank recorded in a golden input's metadata."""
    from kvplan.integrations.vllm.inspect import InspectOptions

    meta = document.metadata
    inspect_meta = meta.get("inspect")
    if "model" not in meta or not isinstance(inspect_meta, dict):
        raise KVPlanError(
            error(
                Code.SCHEMA,
                "metadata",
                "the input document does not say how it was made (metadata.model and "
                "metadata.inspect.options are written by `kvplan inspect`).",
                "regenerate it with `kvplan golden add`, or use --input-only.",
            )
        )
    options = InspectOptions.from_metadata(inspect_meta.get("options", {}))
    return str(meta["model"]), options, int(meta.get("tp_rank", 0))


def regenerate(
    folder: Path, input_only: bool, require_plan: bool = True, *, root: Path | None = None
) -> Outcome:
    """Load the stored pair and regenerate the plan (through vLLM unless ``input_only``).

    A missing ``plan.json`` is an error (``KVP002``) unless ``require_plan`` is false (update).
    Both files are read below ``root`` (default: ``folder``) without following a link.
    """
    from kvplan.planner import diff_plans, plan
    from kvplan.schemas.loading import load_input, load_plan

    root = folder if root is None else root
    outcome = Outcome(name=folder.name)
    try:
        stored_input = load_input(folder / INPUT_NAME, within=root)
        plan_path = folder / PLAN_NAME
        if require_plan or os.path.lexists(plan_path):
            outcome.stored_plan = load_plan(plan_path, within=root)
        if input_only:
            outcome.document = stored_input
            outcome.plan = plan(stored_input)
        else:
            from kvplan.integrations.vllm.inspect import inspect_model

            model, options, rank = options_of(stored_input)
            result = inspect_model(model, options)
            outcome.document = result.documents[rank]
            outcome.plan = result.plans[rank]
            outcome.input_changed = to_data(outcome.document) != to_data(stored_input)
    except KVPlanError as exc:
        outcome.error = "; ".join(d.render() for d in exc.diagnostics)
        return outcome
    if outcome.stored_plan is None or outcome.plan is None:
        outcome.markdown = f"`{PLAN_NAME}` is new.\n"
        return outcome
    diff = diff_plans(outcome.stored_plan, outcome.plan)
    outcome.same = diff.same and not outcome.input_changed
    outcome.markdown = diff.to_markdown()
    if outcome.input_changed and diff.same:
        outcome.markdown = "The captured input document changed; the plan did not.\n"
    return outcome


def md_code(text: str) -> str:
    """``text`` (a folder name) as one markdown code span that cannot end the span, split a
    table cell (``|``) or start a row (newlines and escapes come out escaped)."""
    shown = printable(text).replace("|", "\\|")
    longest, run = 0, 0
    for char in shown:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def report(outcomes: list[Outcome], input_only: bool) -> str:
    """The markdown drift report (every line printable: names come from the file system)."""
    how = "re-planned from the stored inputs" if input_only else "regenerated through vLLM"
    drift = [o for o in outcomes if not o.same and not o.error]
    errors = [o for o in outcomes if o.error]
    lines = [
        "# kvplan golden check",
        "",
        f"{len(outcomes)} model(s) {how}: {len(outcomes) - len(drift) - len(errors)} identical, "
        f"{len(drift)} drifted, {len(errors)} failed.",
        "",
        "| model | result |",
        "|---|---|",
    ]
    for o in outcomes:
        status = "error" if o.error else ("identical" if o.same else "**drift**")
        lines.append(f"| {md_code(o.name)} | {status} |")
    for o in outcomes:
        if o.error:
            lines += ["", f"## {md_code(o.name)}: error", "", o.error]
        elif not o.same:
            lines += ["", f"## {md_code(o.name)}: drift", "", o.markdown.rstrip()]
    return safe_lines("\n".join(lines)) + "\n"


def write_pair(folder: Path, document: InputDocument, plan: BindingPlan, root: Path) -> None:
    """Write ``folder``'s input and plan below ``root``: both targets are checked before
    either is written, and nothing is written through a link or outside ``root``."""
    for name in (INPUT_NAME, PLAN_NAME):
        check_output(folder / name, within=root, make_dirs=True)
    dump(document, folder / INPUT_NAME, within=root, make_dirs=True)
    dump(plan, folder / PLAN_NAME, within=root, make_dirs=True)


def slug(model: str) -> str:
    """Folder name for a model id or path: ``org__name``."""
    return model.strip("/").replace("/", "__") if "/" in model else Path(model).name


def _narrate(message: str) -> None:
    stderr_console().print(printable(message), markup=False, highlight=False)


def _prepare(input_only: bool) -> None:
    if input_only:
        return
    from kvplan.integrations.vllm import prepare_environment, require_vllm

    require_vllm()
    prepare_environment(quiet=True)


def golden_folders(directory: Path, input_only: bool) -> list[Path]:
    """What ``check`` and ``update`` start with: vLLM ready (unless ``input_only``) and every
    golden model folder of ``directory`` (``KVP002`` if there is none such)."""
    _prepare(input_only)
    return golden_dirs(directory)


def register(app: typer.Typer) -> None:
    golden = typer.Typer(
        name="golden",
        help="Golden plans of real models for CI: check, update, add.",
        no_args_is_help=True,
    )
    app.add_typer(golden, name="golden")

    @golden.command("check")
    def check_cmd(
        directory: Annotated[Path, typer.Argument(metavar="DIR", help="golden directory")],
        input_only: Annotated[bool, INPUT_ONLY] = False,
        html: Annotated[
            Path | None,
            typer.Option("--html", metavar="DIR", help="write DIR/<model>.html per drifted model"),
        ] = None,
    ) -> None:
        """Regenerate every golden plan and diff it; markdown report on stdout."""
        folders = golden_folders(directory, input_only)
        outcomes = []
        for folder in folders:
            _narrate(f"checking {folder.name}")
            outcomes.append(regenerate(folder, input_only, root=directory))
        print_data(report(outcomes, input_only))
        if html is not None:
            from kvplan.render import drift_page

            html.mkdir(parents=True, exist_ok=True)
            for o in outcomes:
                if not o.same and not o.error and o.plan is not None:
                    page = html / f"{o.name}.html"
                    write_text_atomic(
                        page,
                        drift_page(o.name, o.stored_plan, o.plan, o.input_changed),
                        within=html,
                    )
                    _narrate(f"wrote {page}")
        if any(o.error for o in outcomes):
            raise typer.Exit(EXIT_ERROR)
        if not all(o.same for o in outcomes):
            raise typer.Exit(EXIT_DIFFERENT)

    @golden.command("update")
    def update_cmd(
        directory: Annotated[Path, typer.Argument(metavar="DIR", help="golden directory")],
        input_only: Annotated[bool, INPUT_ONLY] = False,
    ) -> None:
        """Regenerate and rewrite every golden input and plan."""
        folders = golden_folders(directory, input_only)
        failed = False
        for folder in folders:
            outcome = regenerate(folder, input_only, require_plan=False, root=directory)
            if outcome.error or outcome.document is None or outcome.plan is None:
                _narrate(f"{folder.name}: {outcome.error}")
                failed = True
                continue
            try:
                write_pair(folder, outcome.document, outcome.plan, directory)
            except KVPlanError as exc:
                _narrate(f"{folder.name}: {exc.diagnostics[0].render()}")
                failed = True
                continue
            _narrate(f"{folder.name}: {'unchanged' if outcome.same else 'updated'}")
        if failed:
            raise typer.Exit(EXIT_ERROR)

    @golden.command("add")
    @with_inspect_flags
    def add_cmd(
        directory: Annotated[Path, typer.Argument(metavar="DIR", help="golden directory")],
        model: Annotated[str, typer.Argument(metavar="MODEL", help="as for kvplan inspect")],
        name: Annotated[
            str | None, typer.Option("--name", help="folder name (default: org__name)")
        ] = None,
        *,
        flags: InspectFlags,
    ) -> None:
        """Inspect MODEL and store its input and plan as DIR/<name>/{input,plan}.json."""
        from kvplan.integrations.vllm.inspect import inspect_model

        options = flags.options()
        _prepare(False)
        result = inspect_model(model, options)
        folder = directory / (name or slug(result.model.name))
        directory.mkdir(parents=True, exist_ok=True)
        write_pair(folder, result.document, result.plan, directory)
        _narrate(f"wrote {folder / INPUT_NAME} and {folder / PLAN_NAME}")
