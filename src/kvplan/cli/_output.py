"""Shared CLI output: data on stdout, narration on stderr, ``NO_COLOR`` honoured, exit codes.

Exit codes follow ``diff``: 0 success/same, 1 different (or drift), 2 error.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

import typer
from rich.console import Console

from kvplan.schemas.errors import Diagnostic, KVPlanError

EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_ERROR = 2


def _no_color() -> bool:
    return "NO_COLOR" in os.environ and os.environ["NO_COLOR"] != ""


PIPE_WIDTH = 200
"""Table width when stdout is not a terminal and ``COLUMNS`` is unset (files, pipes, CI logs)."""


def stdout_console() -> Console:
    """Console for data (tables, documents); wide when piped, so tables do not wrap."""
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(no_color=_no_color(), highlight=False, soft_wrap=True, width=width)


def stderr_console() -> Console:
    """Console for narration, progress and errors."""
    return Console(stderr=True, no_color=_no_color(), highlight=False, soft_wrap=True)


def print_data(text: str) -> None:
    """Write a document (JSON/YAML) to stdout verbatim, no markup."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def print_json(data: Any) -> None:
    print_data(json.dumps(data, indent=2, ensure_ascii=False))


def report(diagnostics: Iterable[Diagnostic]) -> None:
    """Print each diagnostic as one paragraph on stderr."""
    console = stderr_console()
    for diag in sorted(diagnostics, key=lambda d: not d.is_error):
        style = "red" if diag.is_error else "yellow"
        console.print(diag.render(), style=style, markup=False)


def fail(exc: KVPlanError | list[Diagnostic]) -> NoReturn:
    """Report and exit 2 (no traceback)."""
    diagnostics = exc.diagnostics if isinstance(exc, KVPlanError) else exc
    report(diagnostics)
    raise typer.Exit(EXIT_ERROR)
