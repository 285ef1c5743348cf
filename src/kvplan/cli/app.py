"""The typer application; each command family lives in its own module with ``register(app)``."""

from __future__ import annotations

import typer

from kvplan.cli import apply_cmd, doc_cmds, doctor_cmd, golden_cmd, inspect_cmd
from kvplan.cli._output import guarded

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


def _guard_all(application: typer.Typer) -> None:
    """Every command, nested groups included, runs inside the one error boundary."""
    for command in application.registered_commands:
        if command.callback is not None:
            command.callback = guarded(command.callback)
    for group in application.registered_groups:
        if group.typer_instance is not None:
            _guard_all(group.typer_instance)


_guard_all(app)


def main() -> None:
    app()
