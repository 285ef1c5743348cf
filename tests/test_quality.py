"""The tree stays ruff- and mypy-clean (CI runs these with the test suite)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert path, f"{name} is missing: install the test extra (pip install -e '.[test]')"
    return path


def test_ruff_lint_and_format() -> None:
    lint = _run(_tool("ruff"), "check", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _run(_tool("ruff"), "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_mypy() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_committed_results_name_no_machines_paths() -> None:
    """Benchmark results are committed: a path of the machine that ran them (its temporary
    folders, its checkout) says nothing to a reader and leaks where it ran."""
    import re

    machine_path = re.compile(r"(?<![\w.])/(?:tmp|work|home|root|check)/")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "benchmarks" / "results").rglob("*"))
        if path.is_file()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if machine_path.search(line)
    ]
    assert found == [], found
