"""The generated reference pages are complete and current: every ``KVPLAN_*`` setting the code
reads is in :data:`kvplan.settings.SETTINGS`, every diagnostic code has a meaning and a fix in
:data:`kvplan.schemas.code_docs.CODE_DOCS`, and ``docs/reference/`` is what
``tools/gen_reference.py`` writes from them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from kvplan.schemas.code_docs import CODE_DOCS, SECTIONS
from kvplan.schemas.errors import Code
from kvplan.settings import AREAS, SETTINGS

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"KVPLAN_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")  # not a prefix (``KVPLAN_DEBUG_*``)
QUOTED = re.compile(r"""["'](KVPLAN_[A-Z0-9_]*[A-Z0-9])["']""")


def names_in_source(src: str, quoted_only: bool = False) -> set[str]:
    """``KVPLAN_*`` names in ``src``: every one (kvplan's own code reads only settings under
    that prefix), or, in the suite's code, those written as strings (its Python constants
    such as ``KVPLAN_VARIANTS`` are not settings)."""
    if quoted_only:
        return set(QUOTED.findall(src))
    return set(NAME.findall(src))


def read_names() -> dict[str, set[str]]:
    """Where each name is read: ``{name: {file, ...}}`` over src/, harness/ and tests/."""
    found: dict[str, set[str]] = {}
    me = Path(__file__).resolve()
    for folder, quoted in (("src/kvplan", False), ("harness", True), ("tests", True)):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() == me or (path.name == "settings.py" and folder == "src/kvplan"):
                continue
            for name in names_in_source(path.read_text(encoding="utf-8"), quoted):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_setting_read_is_listed() -> None:
    listed = {s.name for s in SETTINGS}
    missing = {name: sorted(where) for name, where in read_names().items() if name not in listed}
    assert not missing, f"add these to src/kvplan/settings.py: {missing}"


def test_every_listed_setting_is_read_somewhere() -> None:
    read = read_names()
    unused = [s.name for s in SETTINGS if s.name not in read]
    assert not unused, f"settings listed but read nowhere: {unused}"


def test_settings_are_unique_and_in_a_known_area() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    assert {s.area for s in SETTINGS} <= set(AREAS)
    assert all(s.meaning and s.default for s in SETTINGS)


def test_the_scan_sees_a_setting_missing_from_the_list() -> None:
    code = 'ENV_NEW = "KVPLAN_' + 'SOMETHING_NEW"\nKVPLAN_VARIANTS = ()\n'
    assert names_in_source(code) == {"KVPLAN_" + "SOMETHING_NEW", "KVPLAN_VARIANTS"}
    assert names_in_source(code, quoted_only=True) == {"KVPLAN_" + "SOMETHING_NEW"}
    assert "KVPLAN_" + "SOMETHING_NEW" not in {s.name for s in SETTINGS}
    assert names_in_source("see ``KVPLAN_DEBUG_*``") == set()


def test_every_code_has_a_meaning_and_a_fix() -> None:
    assert set(CODE_DOCS) == set(Code)
    assert all(meaning and fix for meaning, fix in CODE_DOCS.values())
    prefixes = tuple(prefix for prefix, _ in SECTIONS)
    assert all(code.value.startswith(prefixes) for code in Code)


def test_reference_pages_are_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_reference_pages_name_every_setting_code_and_command(tmp_path: Path) -> None:
    from typer.main import get_command

    from kvplan.cli import app

    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_reference.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    settings = (tmp_path / "settings.md").read_text()
    codes = (tmp_path / "codes.md").read_text()
    commands = (tmp_path / "commands.md").read_text()
    assert all(f"| `{s.name}` |" in settings for s in SETTINGS)
    assert all(f"| `{c.value}` | `{c.name}` |" in codes for c in Code)
    assert all(fix.split("`")[0][:20] in codes for _, fix in CODE_DOCS.values())
    root = get_command(app)
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        subs = getattr(command, "commands", {name: command})
        for sub in subs:
            title = f"kvplan {name}" if sub == name else f"kvplan {name} {sub}"
            assert f"## `{title}`" in commands, title
