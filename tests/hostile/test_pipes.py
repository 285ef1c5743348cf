"""A closed pipe after ``| head`` is normal use: every command that prints data ends quietly
(killed by ``SIGPIPE``, as ``git log | head``; nothing on stderr). And no message of any
command names an option that command does not have: the hints of a full stdout, of bad usage,
and every ``kvplan CMD ... --option`` written in kvplan's sources."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import typer

from harness._stats import make_stats
from kvplan.cli import app
from kvplan.elastic.files import write_stats
from tests.hostile._attacks import Area
from tests.hostile._harness import SRC, assert_no_bug, spawn
from tests.hostile.test_streams import COMMANDS

DATA = sorted(name for name in COMMANDS if not name.endswith("-bad"))
"""The commands that print data on stdout (the ``-bad`` ones print only a refusal)."""

_OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def _commands() -> dict[str, Any]:
    """Every command by its path after ``kvplan`` (``golden check``...), as click sees it."""
    root = typer.main.get_command(app)
    out: dict[str, Any] = {}

    def walk(command: Any, path: str) -> None:
        out[path] = command
        if hasattr(command, "commands"):  # a group (typer's own click or click)
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}".strip())

    walk(root, "")
    return out


def _options(command: Any) -> set[str]:
    return {
        name
        for param in command.params
        if param.param_type_name == "option"
        for name in (*param.opts, *param.secondary_opts)
    } | {"--help"}


def _command_of(args: list[str]) -> str:
    commands = _commands()
    path = args[0]
    if len(args) > 1 and f"{path} {args[1]}" in commands:
        path = f"{path} {args[1]}"
    return path


def _area(root: Path) -> Area:
    """The hostile area with one engine's stats in its dump directory (``top`` shows it)."""
    area = Area(root)
    write_stats(area.dump, make_stats(time=time.time()))
    return area


@pytest.mark.parametrize("command", DATA)
def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path: Path, command: str) -> None:
    args = COMMANDS[command](_area(tmp_path))
    normal = spawn(args)
    assert normal.stdout, f"{command} prints no data to test a closed pipe with"
    read, write = os.pipe()
    os.close(read)
    try:
        outcome = spawn(args, stdout_path=f"/dev/fd/{write}")
    finally:
        os.close(write)
    # nothing about the pipe: at most the narration the command prints anyway
    assert "KVP018" not in outcome.stderr and "Broken pipe" not in outcome.stderr, outcome.stderr
    assert set(outcome.stderr.splitlines()) <= set(normal.stderr.splitlines()), outcome.stderr
    assert outcome.exit_code in (0, -signal.SIGPIPE, 128 + signal.SIGPIPE), outcome


def test_top_once_into_head_exits_quietly(tmp_path: Path) -> None:
    area = _area(tmp_path)
    shell = (
        f"set -o pipefail; {sys.executable} -m kvplan top {area.dump} --once | head -1 > /dev/null"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "100"}
    done = subprocess.run(
        ["bash", "-c", shell], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.stderr == ""
    assert done.returncode in (0, 128 + signal.SIGPIPE), done.returncode


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_full_stdout_names_only_the_commands_own_options(tmp_path: Path, command: str) -> None:
    args = COMMANDS[command](_area(tmp_path))
    path = _command_of(args)
    outcome = spawn(args, stdout_path="/dev/full")
    assert_no_bug(outcome, command)
    named = set(_OPTION.findall(outcome.stderr))
    assert named <= _options(_commands()[path]), (command, named, outcome.stderr)


@pytest.mark.parametrize("path", sorted(p for p in _commands() if p))
def test_usage_errors_name_only_the_commands_own_options(path: str) -> None:
    from typer.testing import CliRunner

    done = CliRunner().invoke(app, [*path.split(), "--no-such-option"])
    assert done.exit_code == 2
    text = done.stderr if done.stderr_bytes is not None else done.output
    named = set(_OPTION.findall(text)) - {"--no-such-option"}
    assert named <= _options(_commands()[path]), (path, named, text)


_MENTION = re.compile(r"kvplan ((?:[a-z]+)(?: (?:check|update|add))?)((?:[^\"'`\n)]*))")


def test_every_command_written_in_a_message_has_the_options_it_names() -> None:
    """``kvplan CMD ... --opt`` in any of kvplan's strings (hints, help, docstrings): CMD has
    ``--opt`` (what follows a bare ``--`` is passed on: ``kvplan doctor -- VLLM_ARGS``)."""
    commands = _commands()
    wrong: list[str] = []
    seen = 0
    for source in sorted((SRC / "kvplan").rglob("*.py")):
        for match in _MENTION.finditer(source.read_text()):
            path, rest = match.group(1), match.group(2)
            if path not in commands:
                path = path.split()[0]
            if path not in commands or not path:
                continue
            rest = rest.split(", kvplan")[0].split("; ")[0]
            rest = rest.split(" -- ")[0]  # after a bare --: arguments for another program
            for option in _OPTION.findall(rest):
                seen += 1
                if option not in _options(commands[path]):
                    wrong.append(f"{source.relative_to(SRC)}: kvplan {path} ... {option}")
    assert seen >= 10  # the walk found the sources' mentions
    assert not wrong, "\n".join(wrong)
