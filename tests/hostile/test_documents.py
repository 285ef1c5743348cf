"""The generated hostile-document suite: every mutation of every bundled document is decided
with one coded paragraph (or shown safely), in-process; a sample runs as child processes with
their time and memory measured."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.hostile import _generators as generators
from tests.hostile._harness import (
    Outcome,
    assert_bounded,
    assert_no_bug,
    assert_refused,
    digest,
    invoke,
    spawn,
)

CASES = generators.generate(per_source=2)
COMMANDS = ("validate", "plan", "show")


def _write(tmp_path: Path, case: generators.Case) -> Path:
    path = tmp_path / f"doc{case.suffix}"
    path.write_bytes(case.data)
    return path


def _check(case: generators.Case, outcome: Outcome, command: str) -> None:
    what = f"{command} {case.name}"
    assert_no_bug(outcome, what)
    if case.expect == "refused":
        assert_refused(outcome, case.code, what=what)
    elif case.expect == "decided":
        if outcome.exit_code != 0:
            assert_refused(outcome, what=what)
    else:  # shown: valid, and no raw escape or markup reaches any stream
        assert outcome.exit_code in (0, 2), f"{what}: {outcome.stderr}"
        if outcome.exit_code:
            assert_refused(outcome, what=what)
        for text in (outcome.stdout, outcome.stderr):
            assert "\x1b" not in text and "\u202e" not in text, f"{what}: raw escape"
            assert "Markup" not in text and "Traceback" not in text, f"{what}: {text[:300]}"


def test_the_generated_suite_covers_every_family() -> None:
    families = collections.Counter(case.family for case in CASES)
    assert len(families) == 15 and min(families.values()) >= 20, families
    assert len(CASES) >= 400


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.name for c in CASES])
def test_generated_document_is_decided_in_process(tmp_path: Path, index: int) -> None:
    case = CASES[index]
    path = _write(tmp_path, case)
    before = digest(path)
    command = COMMANDS[index % len(COMMANDS)]
    if case.expect == "shown" or (case.kind == "plan" and command == "plan"):
        command = "show"
    _check(case, invoke([command, str(path)], env={"NO_COLOR": "1", "COLUMNS": "200"}), command)
    assert digest(path) == before, "the input changed"


def _sample() -> list[generators.Case]:
    """One case of every family, from the largest bundled document (the worst case)."""
    seen: dict[str, generators.Case] = {}
    for case in sorted(CASES, key=lambda c: -len(c.data)):
        seen.setdefault(case.family, case)
    return list(seen.values())


SAMPLE = _sample()


@pytest.mark.parametrize("case", SAMPLE, ids=[c.family for c in SAMPLE])
def test_sample_in_a_child_process_is_bounded(tmp_path: Path, case: generators.Case) -> None:
    path = _write(tmp_path, case)
    command = "show" if case.kind == "plan" or case.expect == "shown" else "plan"
    outcome = spawn([command, str(path)])
    _check(case, outcome, command)
    assert_bounded(outcome, case.name)
