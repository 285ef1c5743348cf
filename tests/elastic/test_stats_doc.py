"""docs/elastic.md's stats-format table is the writer's model: every field of ``ElasticStats``
has a row and every row a field, required fields come up to ``steps`` (``rollbacks``, between,
says it is 0 when absent), a field is documented as nullable exactly when the model allows
``None``, and unknown fields are refused as the doc says."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness._stats import make_stats
from kvplan.elastic.files import ElasticStats

DOC = Path(__file__).resolve().parents[2] / "docs" / "elastic.md"


def _rows() -> list[tuple[list[str], str]]:
    """(field names, type column) of each row of the stats-format table, in order."""
    text = DOC.read_text()
    section = text[text.index("## Stats file format") :]
    section = section[: section.index("\n## ", 3)]
    table = section[section.index("| field | type | meaning |") :]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((re.findall(r"`([a-z_]+)`", cells[0]), cells[1]))
    return rows


def _nullable(name: str) -> bool:
    annotation = ElasticStats.model_fields[name].annotation
    return type(None) in typing.get_args(annotation) or (
        isinstance(annotation, types.UnionType) and type(None) in annotation.__args__
    )


def test_every_field_of_the_writer_has_a_row_and_every_row_a_field() -> None:
    documented = [name for names, _ in _rows() for name in names]
    assert len(documented) == len(set(documented)), documented
    assert set(documented) == set(ElasticStats.model_fields)


def test_required_fields_come_up_to_steps_and_nullables_say_null() -> None:
    order = [(name, kind) for names, kind in _rows() for name in names]
    steps = [name for name, _ in order].index("steps")
    for index, (name, kind) in enumerate(order):
        field = ElasticStats.model_fields[name]
        constant = typing.get_origin(field.annotation) is typing.Literal  # kind, version
        required = field.is_required() or constant
        if index <= steps:
            assert required or "when absent" in kind, (name, kind)
        else:
            assert not required, name
        assert ("null" in kind) == _nullable(name), (name, kind)


def test_unknown_fields_are_refused_as_documented() -> None:
    data = make_stats().model_dump(mode="json")
    with pytest.raises(ValidationError):
        ElasticStats.model_validate({**data, "surprise": 1})
