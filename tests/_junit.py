"""Running part of the suite in another venv's pytest (an engine venv, an earlier vLLM's venv)
and reading what each test did from its junit report."""

from __future__ import annotations

import shlex
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def without_xdist() -> str:
    """pyproject's pytest ``addopts`` without pytest-xdist's ``-n N`` (the other venv has
    pytest, not xdist), as an ``-o`` override."""
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    words = shlex.split(options["ini_options"]["addopts"])
    if "-n" in words:
        at = words.index("-n")
        del words[at : at + 2]
    return "addopts=" + shlex.join(words)


def outcomes(report: Path, *, with_module: bool = False) -> dict[str, tuple[str, str]]:
    """Every test case of a junit report: name -> (``passed``/``failed``/``skipped``, text).
    Names are the test functions' with their parameters (``test_c[x]``); ``with_module``:
    prefixed with the module, ``tests.a.test_b::test_c[x]`` (the same name in two files)."""
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root[0]
    out = {}
    for case in suite.iter("testcase"):
        status, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status, text = "failed", f"{child.get('message', '')}\n{child.text or ''}"
            elif child.tag == "skipped":
                status = "skipped"
        name = case.get("name", "")
        out[f"{case.get('classname', '')}::{name}" if with_module else name] = (status, text)
    return out
