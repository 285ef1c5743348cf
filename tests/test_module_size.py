"""No module in ``src/`` is over 700 lines: a module that grows past it is split (as
``kvplan.schemas.loading`` was, into its private ``_reading``, ``_writing`` and
``_validation`` modules)."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
MAX_LINES = 700
PENDING: dict[str, str] = {}
"""Modules known to be over the bound, with why they are not split here; an entry is removed
once its module is split (``test_pending_modules_are_still_over_the_bound`` says when)."""


def test_no_module_is_over_700_lines() -> None:
    over = {}
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES and name not in PENDING:
            over[name] = lines
    assert over == {}, f"split these modules (at most {MAX_LINES} lines each): {over}"


def test_pending_modules_are_still_over_the_bound() -> None:
    for name in PENDING:
        path = SRC / name
        assert path.is_file() and len(path.read_text(encoding="utf-8").splitlines()) > MAX_LINES, (
            f"{name} was split: remove it from PENDING"
        )


def test_the_public_names_of_loading_are_still_importable_from_it() -> None:
    from kvplan.schemas import loading

    for name in (
        "read_bytes",
        "read_data",
        "decode_text",
        "parse_text",
        "write_text_atomic",
        "dump",
        "dumps",
        "diagnostics_from_validation",
        "refuse_output_over_input",
        "same_file",
        "OutputError",
        "MAX_DOCUMENT_BYTES",
        "MAX_DEPTH",
        "MAX_VALUES",
        "INT64_MIN",
        "INT64_MAX",
        "YAML_SUFFIXES",
        "load_any",
        "load_input",
        "load_plan",
        "parse_input",
        "parse_plan",
    ):
        assert hasattr(loading, name), name
