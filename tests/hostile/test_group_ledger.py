"""Generated hostile group ledgers: every field deleted, retyped, made huge or negative; the
document truncated at every length, nested deep, padded past its bound. Reading one is a
valid ledger or ``KVP541`` — never another exception — and the members' and readers'
entry points agree."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvplan.elastic.group import (
    MAX_LEDGER_BYTES,
    GroupLedger,
    GroupMember,
    GroupPaths,
    read_ledger,
    read_snapshot,
    set_budget,
)
from kvplan.schemas.errors import KVPlanError

SEED = 20261201
SWAPS: list[Any] = ["x", "", True, False, None, 1.5, -1, 0, 1 << 62, 1 << 64, [], {}, [1], {"a": 1}]


def valid_ledger(directory: Path) -> dict[str, Any]:
    set_budget(directory, 64 << 20, create=True)
    a = GroupMember.join(directory, "a", floor=1 << 20, guarantee=4 << 20, ceiling=64 << 20)
    b = GroupMember.join(directory, "b", floor=1 << 20, factor=2, ceiling=64 << 20)
    a.request(40 << 20)
    b.request(12 << 20)
    data: dict[str, Any] = json.loads(GroupPaths(directory).ledger.read_text())
    a.close_descriptors()
    b.close_descriptors()
    return data


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield (*prefix, i)
            yield from _paths(value, (*prefix, i))


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def mutations(doc: dict[str, Any]) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(SEED)
    text = json.dumps(doc, indent=1)
    for path in _paths(doc):
        where = ".".join(map(str, path))
        parent = _at(doc, path)
        if isinstance(parent, dict):
            gone = copy.deepcopy(doc)
            del _at(gone, path)[path[-1]]
            yield f"delete {where}", json.dumps(gone).encode()
        for value in rng.sample(SWAPS, 5):
            swapped = copy.deepcopy(doc)
            _at(swapped, path)[path[-1]] = value
            yield f"{where}={value!r}", json.dumps(swapped).encode()
    for cut in range(0, len(text), max(1, len(text) // 60)):
        yield f"truncated at {cut}", text[:cut].encode()
    yield "deep", ("[" * 100_000 + "]" * 100_000).encode()
    yield "wide", json.dumps(dict(doc, members=[doc["members"][0]] * 10_000)).encode()
    yield "padded", (text + " " * MAX_LEDGER_BYTES).encode()
    yield "duplicate key", text.replace('"revision"', '"revision": 1, "revision"', 1).encode()
    yield "nul byte", text.replace('"a"', '"a\\u0000"', 1).encode()
    yield "raw escape", text.replace('"a"', '"a\x1b]0;x\x07"', 1).encode()
    yield "not utf-8", b"\xff\xfe" + text.encode("utf-16-le")
    yield "integer digits", text.replace('"revision": ', '"revision": 9' + "9" * 5000, 1).encode()


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, bytes]]:
    return list(mutations(valid_ledger(tmp_path_factory.mktemp("valid"))))


def test_there_are_many_generated_ledgers(cases: list[tuple[str, bytes]]) -> None:
    assert len(cases) > 200


def test_every_generated_ledger_is_valid_or_kvp541(
    cases: list[tuple[str, bytes]], tmp_path: Path
) -> None:
    set_budget(tmp_path, 64 << 20, create=True)
    paths = GroupPaths(tmp_path)
    outcomes: dict[str, int] = {"valid": 0, "KVP541": 0}
    for name, data in cases:
        paths.ledger.write_bytes(data)
        try:
            ledger = read_ledger(paths)
        except KVPlanError as exc:
            assert exc.code.value == "KVP541", (name, str(exc))
            text = str(exc)
            assert "\x1b" not in text and "\x00" not in text and len(text) < 2000, name
            with pytest.raises(KVPlanError) as also:
                read_snapshot(tmp_path)
            assert also.value.code.value == "KVP541", name
            outcomes["KVP541"] += 1
            continue
        assert isinstance(ledger, GroupLedger), name
        read_snapshot(tmp_path)  # a valid ledger is shown
        outcomes["valid"] += 1
    assert outcomes["KVP541"] > 200
