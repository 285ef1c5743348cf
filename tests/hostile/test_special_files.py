"""Every reader × every file that is not a regular file: refused at once with one code, never
read, never blocking (a fifo with no writer, a socket, a device node, a link to one of them,
an endless device); and, where kvplan keeps its own files (golden trees, stats and limit
files), never through a symbolic link or out of the directory it was given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvplan.elastic.files import read_limit, read_stats_tree
from kvplan.schemas.errors import Diagnostic
from tests.hostile._attacks import READERS, SPECIAL_FILES, Area, Reader, node_kind
from tests.hostile._harness import assert_no_bug, deadline, invoke

ENV = {"NO_COLOR": "1", "COLUMNS": "200"}
SECONDS = 5.0
"""A refusal takes milliseconds; a reader that opens a fifo blocks until interrupted."""
CASES = [(reader, kind) for reader in READERS for kind in sorted(SPECIAL_FILES)]


def _prepare(tmp_path: Path, reader: Reader, kind: str) -> tuple[Area, Path]:
    area = Area(tmp_path)
    place = reader.place(area)
    if os.path.lexists(place):
        place.unlink()
    SPECIAL_FILES[kind](place)
    return area, place


@pytest.mark.parametrize(
    ("reader", "kind"), CASES, ids=[f"{reader.name}-{kind}" for reader, kind in CASES]
)
def test_a_file_that_is_not_regular_is_refused_without_blocking(
    tmp_path: Path, reader: Reader, kind: str
) -> None:
    area, place = _prepare(tmp_path, reader, kind)
    before = node_kind(place)
    outcome = invoke(reader.args(area), env=ENV, seconds=SECONDS)
    what = f"{reader.name} {kind}"
    assert_no_bug(outcome, what)
    assert outcome.exit_code == 2, f"{what}: exit {outcome.exit_code}: {outcome.stderr[:500]}"
    shown = outcome.stdout if reader.stream == "stdout" else outcome.stderr
    # below a golden tree a link is refused as a link (KVP023), before what it points at
    codes = (reader.code, "KVP023") if reader.name.startswith("golden") else (reader.code,)
    assert any(code in shown for code in codes), f"{what}: {shown[:600]}"
    assert "not a regular file" in shown or "symbolic link" in shown, f"{what}: {shown[:600]}"
    assert node_kind(place) == before, f"{what}: the file was replaced"


CONFINED = {
    "link-to-a-good-plan-outside": lambda area, place: place.symlink_to(area.plan),
    "link-to-proc": lambda area, place: place.symlink_to("/proc/self/status"),
    "link-to-victim": lambda area, place: place.symlink_to(area.victim),
}
"""Links planted among kvplan's own files, pointing at regular files outside."""
CONFINED_READERS = [r for r in READERS if r.name.startswith(("golden", "top"))]
CONFINED_CASES = [(r, k) for r in CONFINED_READERS for k in sorted(CONFINED)]


@pytest.mark.parametrize(
    ("reader", "kind"),
    CONFINED_CASES,
    ids=[f"{reader.name}-{kind}" for reader, kind in CONFINED_CASES],
)
def test_kvplans_own_files_are_never_read_through_a_link(
    tmp_path: Path, reader: Reader, kind: str
) -> None:
    area = Area(tmp_path)
    place = reader.place(area)
    if os.path.lexists(place):
        place.unlink()
    CONFINED[kind](area, place)
    outcome = invoke(reader.args(area), env=ENV, seconds=SECONDS)
    what = f"{reader.name} {kind}"
    assert_no_bug(outcome, what)
    assert outcome.exit_code == 2, f"{what}: exit {outcome.exit_code}: {outcome.stderr[:500]}"
    shown = outcome.stdout if reader.stream == "stdout" else outcome.stderr
    assert reader.code.replace("KVP022", "KVP023") in shown, f"{what}: {shown[:600]}"
    assert "symbolic link" in shown, f"{what}: {shown[:600]}"


def test_a_symlinked_golden_model_folder_is_refused(tmp_path: Path) -> None:
    area = Area(tmp_path)
    real = area.outside / "model"
    area.model.rename(real)
    area.model.symlink_to(real)
    for command in ("check", "update"):
        outcome = invoke(["golden", command, str(area.golden), "--input-only"], env=ENV)
        assert_no_bug(outcome, command)
        assert outcome.exit_code == 2, outcome.stdout + outcome.stderr
        assert "KVP023" in outcome.stdout + outcome.stderr


@pytest.mark.parametrize("kind", sorted(SPECIAL_FILES))
def test_the_engines_limit_reader_refuses_without_blocking(tmp_path: Path, kind: str) -> None:
    """The scheduler reads ``limit.json`` every few steps: never a blocking open there."""
    SPECIAL_FILES[kind](tmp_path / "limit.json")
    with deadline(10):
        got = read_limit(tmp_path)
    assert isinstance(got, Diagnostic) and got.code.value == "KVP417", got
    assert "not a regular file" in got.message or "symbolic link" in got.message


@pytest.mark.parametrize("kind", sorted(SPECIAL_FILES))
def test_the_stats_tree_reader_refuses_without_blocking(tmp_path: Path, kind: str) -> None:
    SPECIAL_FILES[kind](tmp_path / "rank3.stats.json")
    with deadline(10):
        ((_, got),) = read_stats_tree(tmp_path)
    assert isinstance(got, Diagnostic) and got.code.value == "KVP416", got
