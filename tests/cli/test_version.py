"""``kvplan --version`` answers as vLLM, pip and every typer app people use do."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

import kvplan
from kvplan.cli import app


def test_version_prints_the_version_and_exits_0() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"kvplan {kvplan.__version__}\n"


def test_version_from_the_console() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvplan", "--version"], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"kvplan {kvplan.__version__}\n", "")


def test_version_is_in_the_help() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0 and "--version" in result.stdout


def test_doctor_names_kvplans_version() -> None:
    result = CliRunner().invoke(app, ["doctor"], env={"NO_COLOR": "1", "KVPLAN_ENABLE": ""})
    lines = result.stdout.splitlines()
    assert lines[0] == "kvplan doctor", result.output
    assert lines[1].split() == ["kvplan", kvplan.__version__], lines[:3]
