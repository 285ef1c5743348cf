"""The typer application; each command family lives in its own module with ``register(app)``."""

from __future__ import annotations

import typer

from kvplan.cli import apply_cmd, doc_cmds, doctor_cmd, golden_cmd, inspect_cmd

app = typer.Typer(
    name="kvplan",
    help="Declarative, inspectable, testable KV-cache binding plans for vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

for module in (doc_cmds, inspect_cmd, apply_cmd, golden_cmd, doctor_cmd):
    module.register(app)


def main() -> None:
    app()
