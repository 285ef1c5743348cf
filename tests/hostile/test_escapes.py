"""Text that came from the file system or the environment (folder and file names, directory
arguments, ``KVPLAN_*`` values) × every command that prints it: never a raw control
character, escape sequence or bidirectional override on any stream, never rich markup
applied, never an extra row in a markdown table."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hostile._attacks import HOSTILE_TEXTS, INPUT, MODEL, PLAN, Area, raw_controls
from tests.hostile._harness import Outcome, assert_no_bug, invoke

ENV = {"NO_COLOR": "1", "COLUMNS": "200"}


def _golden_with(area: Area, text: str, drift: bool) -> list[str]:
    """A second model folder named with ``text`` (drifted when ``drift``)."""
    folder = area.golden / f"m{text}"
    shutil.copytree(area.model, folder)
    if drift:
        other = Area.__new__(Area)  # reuse drift() on the new folder
        other.model = folder
        Area.drift(other)
    return ["golden", "check", str(area.golden), "--input-only"]


def _named(area: Area, text: str, source: Path, suffix: str) -> Path:
    path = area.root / f"f{text}{suffix}"
    path.write_bytes(source.read_bytes())
    return path


def _dir(area: Area, text: str) -> Path:
    path = area.root / f"d{text}"
    path.mkdir()
    return path


SCENES: dict[str, Callable[[Area, str], list[str]]] = {
    "golden-check-identical": lambda a, t: _golden_with(a, t, drift=False),
    "golden-check-drift": lambda a, t: _golden_with(a, t, drift=True),
    "golden-update": lambda a, t: ["golden", "update", *_golden_with(a, t, False)[2:]],
    "validate-name": lambda a, t: ["validate", str(_named(a, t, INPUT, ".json"))],
    "show-name": lambda a, t: ["show", str(_named(a, t, PLAN, ".json"))],
    "diff-names": lambda a, t: [
        *("diff", str(_named(a, t, PLAN, ".json")), str(_named(a, t + "2", INPUT, ".json"))),
        *("-f", "markdown"),
    ],
    "plan-o-name": lambda a, t: ["plan", str(a.input), "-o", str(a.root / f"o{t}.json")],
    "show-html-name": lambda a, t: ["show", str(a.plan), "--html", str(a.root / f"o{t}.html")],
    "missing-file-name": lambda a, t: ["show", str(a.root / f"missing{t}.json")],
    "top-dir-empty": lambda a, t: ["top", str(_dir(a, t)), "--once"],
    "top-dir-missing": lambda a, t: ["top", str(a.root / f"none{t}"), "--once"],
    "limit-dir": lambda a, t: ["limit", str(_dir(a, t)), "1GiB"],
    "limit-dir-missing": lambda a, t: ["limit", str(a.root / f"none{t}"), "1GiB"],
    "golden-missing": lambda a, t: ["golden", "check", str(a.root / f"none{t}"), "--input-only"],
}
"""Commands with a hostile name in a path they print."""

CASES = [(scene, text) for scene in sorted(SCENES) for text in sorted(HOSTILE_TEXTS)]


def _check(outcome: Outcome, text: str, what: str) -> None:
    assert_no_bug(outcome, what)
    for stream, output in (("stdout", outcome.stdout), ("stderr", outcome.stderr)):
        raw = raw_controls(output)
        assert not raw, f"{what}: raw {raw} on {stream}: {output[:400]!r}"
        if "\n" in text:
            assert text not in output, f"{what}: a raw newline from a name on {stream}"


@pytest.mark.parametrize(("scene", "name"), CASES, ids=[f"{s}-{n}" for s, n in CASES])
def test_names_from_the_file_system_reach_no_terminal_raw(
    tmp_path: Path, scene: str, name: str
) -> None:
    area = Area(tmp_path)
    text = HOSTILE_TEXTS[name]
    outcome = invoke(SCENES[scene](area, text), env=ENV)
    _check(outcome, text, f"{scene} {name}")
    if scene.startswith("golden-check"):
        rows = [line for line in outcome.stdout.splitlines() if line.startswith("| `")]
        assert len(rows) == 2, f"{scene} {name}: rows {rows}"
    if name == "markup":  # applied, "[bold red]m[on blue]x" would print as "mx"
        assert "mx" not in outcome.stdout + outcome.stderr, f"{scene}: markup applied"


ENVIRONMENT = {
    "KVPLAN_DUMP_DIR": lambda base, t: f"{base}/d{t}",
    "KVPLAN_PLAN_DIR": lambda base, t: f"{base}/p{t}",
    "KVPLAN_BACKEND": lambda base, t: f"b{t}",
    "KVPLAN_MODE": lambda base, t: f"m{t}",
}
"""Plugin settings that ``kvplan doctor`` prints (paths below the test's own directory)."""


@pytest.mark.parametrize("name", sorted(HOSTILE_TEXTS))
@pytest.mark.parametrize("variable", sorted(ENVIRONMENT))
def test_environment_values_reach_no_terminal_raw(variable: str, name: str, tmp_path: Path) -> None:
    text = HOSTILE_TEXTS[name]
    value = ENVIRONMENT[variable](tmp_path, text)
    if "\x00" in value:  # pragma: no cover - no hostile text holds NUL
        return
    # the first doctor imports vLLM (tens of seconds on a loaded machine): not a hang
    outcome = invoke(["doctor"], env={**ENV, variable: value, "KVPLAN_ENABLE": "1"}, seconds=600)
    _check(outcome, text, f"doctor {variable}={name}")


def test_model_folder_names_do_not_break_the_drift_table(tmp_path: Path) -> None:
    area = Area(tmp_path)
    _golden_with(area, HOSTILE_TEXTS["newline-row"], drift=True)
    outcome = invoke(["golden", "check", str(area.golden), "--input-only"], env=ENV)
    assert outcome.exit_code == 1, outcome.stdout + outcome.stderr
    lines = outcome.stdout.splitlines()
    start = lines.index("| model | result |")
    table = lines[start : lines.index("", start)]
    assert len(table) == 4, table  # header, rule, two models
    assert sum(line.endswith("| identical |") for line in table) == 1
    assert MODEL in outcome.stdout
