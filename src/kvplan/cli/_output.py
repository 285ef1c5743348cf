"""Shared CLI output: data on stdout, narration on stderr, ``NO_COLOR`` honoured, exit codes.

Exit codes follow ``diff``: 0 success/same, 1 different (or drift), 2 error.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import IO, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from kvplan.schemas.canonical import escape_json_text
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error, printable

_F = TypeVar("_F", bound=Callable[..., Any])

EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_ERROR = 2


def _no_color() -> bool:
    return "NO_COLOR" in os.environ and os.environ["NO_COLOR"] != ""


PIPE_WIDTH = 200
"""Table width when stdout is not a terminal and ``COLUMNS`` is unset (files, pipes, CI logs)."""


EXIT_PIPE = 128 + 13
"""The reader of stdout went away (``kvplan top | head``): the process ends as ``git log |
head`` does, killed by ``SIGPIPE`` (the shell's status 141), nothing on stderr."""


class PipeClosed(KVPlanError):
    """Standard output is a pipe whose reader closed it (``EPIPE``): normal use, not an error
    to report (:func:`guarded` ends the command quietly)."""


def _command_options() -> set[str]:
    """Every option name of the command running now (none outside a command)."""
    import importlib

    # typer's own click (vendored since typer 0.24) or click: the package typer.Context is from
    package = typer.Context.__mro__[1].__module__.rsplit(".", 1)[0]
    ctx = importlib.import_module(f"{package}.globals").get_current_context(silent=True)
    if ctx is None:
        return set()
    return {
        name
        for param in ctx.command.params
        if param.param_type_name == "option"
        for name in (*param.opts, *param.secondary_opts)
    }


def stdout_hint() -> str:
    """The fix for a stdout that cannot be written: ``-o`` only for a command that has it."""
    if "-o" in _command_options():
        return "write to a file with -o, or keep the reading end of the pipe open"
    return "redirect the output to a file with space left, or keep the reading end of the pipe open"


def _stdout_failed(exc: OSError) -> KVPlanError:
    reason = exc.strerror or type(exc).__name__
    kind = PipeClosed if exc.errno == errno.EPIPE else KVPlanError
    return kind(
        error(
            Code.STDOUT_FAILED,
            "stdout",
            f"cannot write to standard output: {reason}.",
            stdout_hint(),
        )
    )


def _closed(which: str) -> OSError:
    return OSError(errno.EBADF, f"standard {which} is closed")


def _isatty(stream: IO[str] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):
        return False


class _Stream:
    """A wrapped standard stream: attributes other than ``write``/``flush`` are the
    stream's own (none once it is gone)."""

    def __init__(self, stream: IO[str] | None) -> None:
        self._stream = stream

    def isatty(self) -> bool:
        return _isatty(self._stream)

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            raise AttributeError(name)
        return getattr(self._stream, name)


class _GuardedStdout(_Stream):
    """``sys.stdout`` whose write failures (full disk, closed pipe, a closed descriptor:
    ``sys.stdout`` is None then) raise ``KVP018``."""

    def write(self, text: str) -> int:
        if self._stream is None:
            raise _stdout_failed(_closed("output"))
        try:
            return self._stream.write(text)
        except (OSError, ValueError) as exc:
            raise _stdout_failed(exc if isinstance(exc, OSError) else _closed("output")) from None

    def flush(self) -> None:
        if self._stream is None:
            raise _stdout_failed(_closed("output"))
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            raise _stdout_failed(exc if isinstance(exc, OSError) else _closed("output")) from None


class _QuietStderr(_Stream):
    """``sys.stderr`` for narration and diagnostics: when it cannot be written (closed, a
    full disk) the text is dropped. There is nowhere left to report it; the exit status
    still says what happened, and Python's own flush at exit must not fail again."""

    def write(self, text: str) -> int:
        if self._stream is not None:
            try:
                self._stream.write(text)
                self._stream.flush()
            except (OSError, ValueError):
                self._drop()
        return len(text)

    def flush(self) -> None:
        if self._stream is not None:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._drop()

    def _drop(self) -> None:
        self._stream = None
        _silence(sys.stderr)


def stdout_console() -> Console:
    """Console for data (tables, documents); wide when piped, so tables do not wrap."""
    width = None if _isatty(sys.stdout) or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(
        file=_GuardedStdout(sys.stdout),  # type: ignore[arg-type]
        no_color=_no_color(),
        highlight=False,
        soft_wrap=True,
        width=width,
    )


def cell(value: object) -> Text:
    """Document text for a table cell or a line: never markup, control characters escaped."""
    return Text(printable(str(value)))


def safe_lines(text: str) -> str:
    """Multi-line text made from a document (a diff), each line through :func:`printable`."""
    return "\n".join(printable(line) for line in text.split("\n"))


def stderr_console() -> Console:
    """Console for narration, progress and errors (dropped when stderr cannot be written)."""
    return Console(
        file=_QuietStderr(sys.stderr),  # type: ignore[arg-type]
        no_color=_no_color(),
        highlight=False,
        soft_wrap=True,
    )


def print_data(text: str) -> None:
    """Write a document (JSON/YAML) to stdout verbatim, no markup; ``KVP018`` if it fails."""
    out = _GuardedStdout(sys.stdout)
    out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


def print_json(data: Any) -> None:
    print_data(escape_json_text(json.dumps(data, indent=2, ensure_ascii=False)))


MAX_REPORTED = 50
"""Most diagnostics printed as text; the rest are counted (``validate --json`` lists all)."""


def report(diagnostics: Iterable[Diagnostic]) -> None:
    """Print each diagnostic as one paragraph on stderr (errors first, at most 50)."""
    console = stderr_console()
    ordered = sorted(diagnostics, key=lambda d: not d.is_error)
    for diag in ordered[:MAX_REPORTED]:
        style = "red" if diag.is_error else "yellow"
        console.print(diag.render(), style=style, markup=False)
    if len(ordered) > MAX_REPORTED:
        console.print(
            f"… and {len(ordered) - MAX_REPORTED} more diagnostics "
            "(`kvplan validate --json` lists them all)",
            markup=False,
        )


def fail(exc: KVPlanError | list[Diagnostic]) -> NoReturn:
    """Report and exit 2 (no traceback)."""
    diagnostics = exc.diagnostics if isinstance(exc, KVPlanError) else exc
    report(diagnostics)
    raise typer.Exit(EXIT_ERROR)


def _silence(stream: IO[str] | None) -> None:
    """After a write to ``stream`` failed, point its descriptor at /dev/null, so that
    Python's flush at exit does not fail again (exit status 120)."""
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    with contextlib.suppress(OSError, ValueError):
        stream.flush()


def _silence_stdout() -> None:
    _silence(sys.stdout)


TRACEBACK_ENV = "KVPLAN_TRACEBACK"
"""Set to 1 to let an unexpected exception (a kvplan bug) raise with its traceback."""


def guarded(command: _F) -> _F:
    """The CLI's one boundary: what a command raises becomes one coded paragraph and exit 2.

    ``KVPlanError`` is reported as is; an ``OSError`` (a file or stream that failed) as
    ``KVP002``/``KVP018``; anything else is a kvplan bug, reported as ``KVP019`` with its type
    and (bounded) message, unless ``KVPLAN_TRACEBACK=1``.
    """

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except PipeClosed:
            _silence_stdout()
            raise typer.Exit(EXIT_PIPE) from None
        except KVPlanError as exc:
            if exc.code is Code.STDOUT_FAILED:
                _silence_stdout()
            fail(exc)
        except OSError as exc:
            if exc.filename is None:
                _silence_stdout()
                if exc.errno == errno.EPIPE:
                    raise typer.Exit(EXIT_PIPE) from None
                fail(_stdout_failed(exc))
            reason = exc.strerror or type(exc).__name__
            fail([error(Code.UNREADABLE, str(exc.filename), f"{reason}.", "check the path")])
        except (typer.Exit, typer.Abort, typer.TyperException, SystemExit, KeyboardInterrupt):
            raise  # exits, and usage errors (typer.BadParameter) that main() reports
        except Exception as exc:  # a bug: still one paragraph, never a traceback
            if os.environ.get(TRACEBACK_ENV) == "1":
                raise
            fail(
                [
                    error(
                        Code.INTERNAL,
                        command.__name__,
                        f"internal error: {type(exc).__name__}: {exc}",
                        f"please report it with the input; {TRACEBACK_ENV}=1 shows the traceback",
                    )
                ]
            )

    return run  # type: ignore[return-value]
