"""The typer application; each command family lives in its own module with ``register(app)``."""

from __future__ import annotations

from typing import Annotated

import typer

import kvplan.cli.apply_cmd as apply_cmd
import kvplan.cli.doc_cmds as doc_cmds
import kvplan.cli.doctor_cmd as doctor_cmd
import kvplan.cli.elastic_cmd as elastic_cmd
import kvplan.cli.golden_cmd as golden_cmd
import kvplan.cli.inspect_cmd as inspect_cmd
from kvplan.cli._output import EXIT_ERROR, EXIT_PIPE, guarded, report
from kvplan.schemas.errors import Code, error

app = typer.Typer(
    name="kvplan",
    help="Declarative, inspectable, testable KV-cache binding plans for vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from kvplan import __version__

        typer.echo(f"kvplan {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="print kvplan's version and exit",
        ),
    ] = False,
) -> None:
    """Declarative, inspectable, testable KV-cache binding plans for vLLM."""


for module in (doc_cmds, inspect_cmd, apply_cmd, golden_cmd, doctor_cmd, elastic_cmd):
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
    """Console entry point: usage errors, too, become one coded paragraph (``KVP406``)."""
    import os
    import sys

    try:
        code = app(standalone_mode=False)
    except typer.BadParameter as exc:
        hint = f"run `{exc.ctx.command_path} --help`" if exc.ctx is not None else ""
        param = exc.param
        where = ""
        if param is not None:
            opts = getattr(param, "opts", [])
            metavar = getattr(param, "metavar", None) or param.name or ""
            where = "/".join(opts) if param.param_type_name == "option" else str(metavar)
        report([error(Code.USAGE, where.replace("'", ""), exc.format_message(), hint)])
        sys.exit(EXIT_ERROR)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as exc:  # click's UsageError (unknown command, missing value)
        if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: the help, as click does
            getattr(exc, "show", lambda: None)()
            sys.exit(EXIT_ERROR)
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "kvplan"
        format_message = getattr(exc, "format_message", None)
        message = format_message() if callable(format_message) else str(exc)
        report([error(Code.USAGE, where, message, f"run `{where} --help`")])
        sys.exit(EXIT_ERROR)
    if code == EXIT_PIPE:  # stdout's reader went away: end as a pipeline's writer does
        import signal

        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
    sys.exit(code if isinstance(code, int) else 0)
