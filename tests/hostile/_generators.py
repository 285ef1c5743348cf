"""Seeded generators of hostile documents, mutations of the bundled example inputs and plans.

Each :class:`Case` is a file to hand to a command and what must happen:

- ``expect="refused"``: exit 2 with ``code`` (when known) on the first stderr line;
- ``expect="decided"``: exit 0 (the mutation happened to stay valid) or exit 2 with a code —
  used for mutations whose validity the generator cannot know (a deleted key may be optional);
- ``expect="shown"``: a valid document whose names are hostile text (markup, escapes): exit 0,
  and no raw escape or markup error on any stream.

Every case must also be bounded and leave no traceback (see ``harness.assert_refused``).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "examples" / "golden"
SEED = 20261130


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    suffix: str
    data: bytes
    expect: str  # refused | decided | shown
    code: str | None = None
    kind: str = "input"  # input | plan


def sources() -> list[tuple[str, str, dict[str, Any]]]:
    """(model, kind, document) for every bundled golden input and plan."""
    out = []
    for folder in sorted(GOLDEN.iterdir()):
        if folder.is_dir():
            for kind in ("input", "plan"):
                out.append((folder.name, kind, json.loads((folder / f"{kind}.json").read_text())))
    return out


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) below ``doc``, not descending into ``metadata`` (free-form there)."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "metadata":
                continue
            yield (*prefix, key), value
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc[:4]):
            yield (*prefix, index), value
            yield from _paths(value, (*prefix, index))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc[part]
    doc[path[-1]] = value


def _delete(doc: Any, path: tuple[Any, ...]) -> None:
    for part in path[:-1]:
        doc = doc[part]
    del doc[path[-1]]


def _json(doc: Any) -> bytes:
    return json.dumps(doc, indent=1).encode()


def _deep(depth: int) -> Any:
    value: Any = 0
    for level in range(depth):
        value = [value] if level % 2 else {"d": value}
    return value


def generate(per_source: int = 3, seed: int = SEED) -> list[Case]:
    """``per_source`` cases of every family for every bundled document (deterministic)."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for model, kind, doc in sources():
        ints = [(p, v) for p, v in _paths(doc) if type(v) is int]
        strings = [(p, v) for p, v in _paths(doc) if isinstance(v, str)]
        containers = [(p, v) for p, v in _paths(doc) if isinstance(v, dict | list)]
        keys = [(p, v) for p, v in _paths(doc) if isinstance(p[-1], str)]
        text = json.dumps(doc, indent=1)
        for n in range(per_source):
            tag = f"{model}-{kind}-{n}"

            def add(
                family: str,
                data: bytes,
                expect: str,
                code: str | None = None,
                suffix: str = ".json",
                tag: str = tag,
                kind: str = kind,
            ) -> None:
                cases.append(Case(family, f"{family}-{tag}", suffix, data, expect, code, kind))

            # deletions: a key may be optional, so the outcome is only "decided"
            path, _ = rng.choice(keys)
            mutated = copy.deepcopy(doc)
            _delete(mutated, path)
            add("delete", _json(mutated), "decided")
            # type swaps: a string where a number is, a mapping where a list/str is
            path, _ = rng.choice(ints)
            mutated = copy.deepcopy(doc)
            _set(mutated, path, rng.choice(["abc", "1e3x", "", "[/]"]))
            add("type-swap-int", _json(mutated), "refused", "KVP00")
            path, _ = rng.choice(containers + strings)
            mutated = copy.deepcopy(doc)
            _set(mutated, path, {"unexpected": [1, 2]} if rng.random() < 0.5 else 12.5)
            add("type-swap-container", _json(mutated), "decided")
            # huge and negative numbers: outside 64 bits is refused at load, with position
            path, _ = rng.choice(ints)
            mutated = copy.deepcopy(doc)
            digits = rng.choice([20, 400, 4299, 4301, 20000])
            _set(mutated, path, rng.choice([1, -1]) * 10**digits if digits < 4300 else 0)
            raw = _json(mutated)
            if digits >= 4300:  # json.dumps cannot write it: splice the literal in
                raw = raw.replace(b'": 0', b'": 1' + b"0" * digits, 1)
                if b'": 0' not in _json(mutated):
                    raw = _json(mutated)[:-1] + b', "n": 1' + b"0" * digits + b"}"
            add("huge-number", raw, "refused", "KVP010")
            path, _ = rng.choice(ints)
            mutated = copy.deepcopy(doc)
            _set(mutated, path, -rng.choice([1, 7, 4096, 2**40]))
            add("negative-number", _json(mutated), "decided")
            # deep nesting: in a field or in metadata
            mutated = copy.deepcopy(doc)
            depth = rng.choice([65, 200, 1000, 5000])
            if kind == "input" and rng.random() < 0.5:
                mutated["metadata"] = {"deep": _deep(depth)}
            else:
                path, _ = rng.choice(containers)
                _set(mutated, path, _deep(depth))
            raw = (
                json.dumps(mutated).encode()
                if depth < 900
                else _json(doc)[:-2] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
            )
            add("deep-nesting", raw, "refused", "KVP009")
            # duplicate keys: repeat one key of one object in the text
            path, value = rng.choice(keys)
            key = json.dumps(path[-1])
            at = text.find(f"{key}:")
            dup = text[:at] + f"{key}: {json.dumps(value)},\n" + text[at:]
            add("duplicate-key-json", dup.encode(), "refused", "KVP011")
            add(
                "duplicate-key-yaml",
                ("format: " + json.dumps(doc["format"]) + "\n" + "format: x\nrest: 1\n").encode(),
                "refused",
                "KVP011",
                ".yaml",
            )
            # YAML aliases: self-reference and an exponential bomb in metadata
            add(
                "alias-self",
                f"format: {doc['format']}\nmetadata: &m {{self: *m, n: {n}}}\n".encode(),
                "refused",
                "KVP012",
                ".yaml",
            )
            bomb = [f"  a0: &a0 [{', '.join(['x'] * 9)}]"]
            for level in range(1, 8 + n):
                refs = ", ".join([f"*a{level - 1}"] * 9)
                bomb.append(f"  a{level}: &a{level} [{refs}]")
            add(
                "alias-bomb",
                (f"format: {doc['format']}\nmetadata:\n" + "\n".join(bomb) + "\n").encode(),
                "refused",
                "KVP012",
                ".yaml",
            )
            # encodings and control characters
            body = text.encode()
            add("utf16", text.encode("utf-16"), "refused", "KVP013")
            cut = rng.randrange(1, len(body) - 1)
            add("latin1-byte", body[:cut] + b"\xe9\xff" + body[cut:], "refused", "KVP013")
            control = rng.choice([b"\x00", b"\x1b", b"\x07", b"\x7f", b"\x0c"])
            add(
                "control-char",
                body[:cut] + control + body[cut:],
                "refused",
                "KVP013",
                rng.choice([".json", ".yaml"]),
            )
            add("truncated", body[: rng.randrange(1, len(body) - 2)], "refused", "KVP001")
            # names are data: markup and terminal escapes in names reach every output escaped
            hostile = rng.choice(["[/]", "[bold red]x[/]", "\x1b[31mred\x1b[0m", "\u202eevil", "]"])
            mutated = copy.deepcopy(doc)
            if kind == "plan":
                old = mutated["pools"][0]["name"]
                new = hostile + old
                mutated["pools"][0]["name"] = new
                for view in mutated["views"]:
                    if view["pool"] == old:
                        view["pool"] = new
                mutated["source"]["vllm_version"] = hostile
                mutated["fingerprint"] = "sha256:" + hostile
            else:
                mutated["vllm_version"] = hostile
            add("hostile-names", _json(mutated), "shown")
    return cases
