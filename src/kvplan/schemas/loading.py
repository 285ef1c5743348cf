"""Reading and writing documents (JSON or YAML by suffix), with KVP errors instead of tracebacks."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from kvplan.schemas.canonical import Document, to_json, to_yaml
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error, printable, show_value
from kvplan.schemas.input import INPUT_FORMAT, InputDocument
from kvplan.schemas.legacy import LegacyInputDocument
from kvplan.schemas.plan import PLAN_FORMAT, BindingPlan
from kvplan.schemas.specs import SPEC_KINDS

_M = TypeVar("_M", bound=BaseModel)
YAML_SUFFIXES = (".yaml", ".yml")


MAX_DOCUMENT_BYTES = 16 << 20
"""Largest document read (16 MiB): kvplan's largest real plans are a few hundred KiB."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists a document may have."""
MAX_VALUES = 1_000_000
"""Most values (scalars, mappings, lists) a document may hold, YAML aliases counted expanded."""
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
"""Every integer in a document lies in the signed 64-bit range."""

_BOMS = (
    (b"\xef\xbb\xbf", "UTF-8 BOM"),
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _position(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


def _fail(code: Code, name: str, message: str, hint: str) -> NoReturn:
    raise KVPlanError(error(code, name, message, hint))


def read_bytes(path: str | Path) -> bytes:
    """The bytes of a file (``-``: stdin), at most :data:`MAX_DOCUMENT_BYTES`; KVP002/KVP014."""
    name = str(path)
    try:
        if name == "-":
            data = sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        hint = {
            errno.ENOENT: "check the path",
            errno.EISDIR: "pass a document file, not a directory",
            errno.EACCES: "make the file readable (chmod u+r) or run as its owner",
        }.get(exc.errno or 0, "check the path and the file")
        _fail(Code.UNREADABLE, name, f"cannot read the file: {reason}.", hint)
    if len(data) > MAX_DOCUMENT_BYTES:
        _fail(
            Code.TOO_LARGE,
            name,
            f"the document is larger than {MAX_DOCUMENT_BYTES >> 20} MiB.",
            "kvplan documents are far smaller; pass the right file",
        )
    return data


def decode_text(data: bytes, name: str) -> str:
    """UTF-8 text of a document; a UTF-8 BOM is dropped (JSON and YAML alike); KVP013/KVP015."""
    for bom, what in _BOMS:
        if data.startswith(bom):
            if what != "UTF-8 BOM":
                _fail(Code.BAD_ENCODING, name, f"the file is {what}.", "save it as UTF-8")
            data = data[len(bom) :]
            break
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        prefix = data[: exc.start].decode("utf-8", errors="replace")
        _fail(
            Code.BAD_ENCODING,
            name,
            f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
            f"{_position(prefix, len(prefix))}).",
            "save it as UTF-8",
        )
    bad = _CONTROL.search(text)
    if bad:
        _fail(
            Code.BAD_ENCODING,
            name,
            f"control character {printable(bad.group())} at {_position(text, bad.start())}.",
            "remove it; write it as an escape (\\u001b) inside a quoted string if it is data",
        )
    if not text.strip():
        _fail(Code.EMPTY_DOCUMENT, name, "the document is empty.", "pass a kvplan document")
    return text


def read_data(path: str | Path) -> Any:
    """Parse a JSON or YAML file (``-`` reads stdin) within the reading limits.

    KVP002 unreadable, KVP001 malformed, KVP009-KVP015 over a limit (see docs/formats.md).
    """
    name = str(path)
    return parse_text(decode_text(read_bytes(path), name), name)


def parse_text(text: str, name: str = "<text>") -> Any:
    """Parse JSON when ``name`` ends in .json or the text starts with ``{``/``[``, else YAML.

    Both refuse duplicate keys, nesting deeper than :data:`MAX_DEPTH`, more than
    :data:`MAX_VALUES` values, integers outside 64 bits and non-finite numbers, with position.
    """
    if not text.strip():
        _fail(Code.EMPTY_DOCUMENT, name, "the document is empty.", "pass a kvplan document")
    if name.endswith(".json") or (
        not name.endswith(YAML_SUFFIXES) and text.lstrip()[:1] in ("{", "[")
    ):
        return _parse_json(text, name)
    return _parse_yaml(text, name)


_JSON_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|[{}\[\],:]|-?(?:\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|NaN|-?Infinity'
)


def _check_number(token: str, text: str, offset: int, name: str) -> None:
    if token in ("NaN", "Infinity", "-Infinity"):
        _fail(
            Code.NUMBER_OUT_OF_RANGE,
            name,
            f"{token} at {_position(text, offset)} is not a number JSON allows.",
            "write a finite number",
        )
    if "." in token or "e" in token or "E" in token:
        if math.isinf(float(token)):
            _fail(
                Code.NUMBER_OUT_OF_RANGE,
                name,
                f"the number at {_position(text, offset)} is too large for a float.",
                "write a finite number",
            )
        return
    if len(token.lstrip("-")) > 19 or not INT64_MIN <= int(token) <= INT64_MAX:
        _out_of_range(name, f"{_position(text, offset)}", len(token.lstrip("-")))


def _out_of_range(name: str, where: str, digits: int) -> NoReturn:
    _fail(
        Code.NUMBER_OUT_OF_RANGE,
        name,
        f"the integer at {where} ({digits} digits) is outside the signed 64-bit range.",
        "kvplan's sizes and counts fit in 64 bits; fix the number",
    )


def _scan_json(text: str, name: str) -> None:
    """Refuse depth, size, duplicate keys and numbers out of range before ``json.loads``.

    A flat pass over the tokens (no recursion); it stops quietly at the first token it cannot
    place, leaving the syntax error to :func:`json.loads`, which reports its position.
    """
    stack: list[set[str] | None] = []  # a set of keys per open object, None per open list
    expect_key = False
    values = 0
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        if first in "{[":
            values += 1
            if len(stack) >= MAX_DEPTH:
                _fail(
                    Code.TOO_DEEP,
                    name,
                    f"nesting deeper than {MAX_DEPTH} levels at {_position(text, match.start())}.",
                    "kvplan documents are a few levels deep; flatten the data",
                )
            stack.append(set() if first == "{" else None)
            expect_key = first == "{"
        elif first in "}]":
            if not stack:
                return
            stack.pop()
            expect_key = False
        elif first == ",":
            expect_key = bool(stack) and stack[-1] is not None
        elif first == ":":
            expect_key = False
        elif first == '"' and expect_key and stack and stack[-1] is not None:
            keys = stack[-1]
            try:
                key = json.loads(token)
            except ValueError:
                return
            if key in keys:
                _fail(
                    Code.DUPLICATE_KEY,
                    name,
                    f"duplicate key {show_value(key)} at {_position(text, match.start())}.",
                    "keep one of the two entries",
                )
            keys.add(key)
            expect_key = False
        else:
            values += 1
            if first != '"':
                _check_number(token, text, match.start(), name)
        if values > MAX_VALUES:
            _too_many(name)


def _too_many(name: str) -> NoReturn:
    _fail(
        Code.TOO_LARGE,
        name,
        f"the document holds more than {MAX_VALUES:,} values.",
        "kvplan documents are far smaller; pass the right file",
    )


def _parse_json(text: str, name: str) -> Any:
    _scan_json(text, name)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(
            Code.MALFORMED,
            name,
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            "fix the syntax",
        )
    except (ValueError, RecursionError) as exc:  # pragma: no cover - the scan refuses these
        _fail(Code.MALFORMED, name, f"not valid JSON: {exc}", "fix the syntax")


def _mark(node_or_event: Any) -> str:
    mark = getattr(node_or_event, "start_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "an unknown position"


class _Constructor(yaml.constructor.SafeConstructor):
    """SafeConstructor that refuses duplicate keys and numbers out of range, with position."""

    name = "<yaml>"

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: the base class refuses it
                continue
            if duplicate:
                _fail(
                    Code.DUPLICATE_KEY,
                    self.name,
                    f"duplicate key {show_value(key)} at {_mark(key_node)}.",
                    "keep one of the two entries",
                )
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        try:
            value = int(super().construct_yaml_int(node))
        except ValueError:
            _out_of_range(self.name, _mark(node), len(str(node.value)))
        if not INT64_MIN <= value <= INT64_MAX:
            _out_of_range(self.name, _mark(node), len(str(node.value)))
        return value

    def construct_yaml_float(self, node: Any) -> float:
        value = float(super().construct_yaml_float(node))
        if not math.isfinite(value):
            _fail(
                Code.NUMBER_OUT_OF_RANGE,
                self.name,
                f"the number at {_mark(node)} is not finite.",
                "write a finite number",
            )
        return value


_Constructor.add_constructor(  # type: ignore[type-var]
    "tag:yaml.org,2002:int", _Constructor.construct_yaml_int
)
_Constructor.add_constructor(  # type: ignore[type-var]
    "tag:yaml.org,2002:float", _Constructor.construct_yaml_float
)

_EventLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _compose_yaml(text: str, name: str) -> Any:
    """The node graph of a one-document YAML stream, composed without recursion.

    Refuses nesting deeper than :data:`MAX_DEPTH`, more than :data:`MAX_VALUES` values with
    aliases expanded (alias bombs), an alias that refers to a node that contains it, and a
    second document.
    """
    resolver = yaml.resolver.Resolver()
    anchors: dict[str, Any] = {}
    sizes: dict[int, int] = {}  # id(anchored node) -> values it stands for, aliases expanded
    open_anchors: set[str] = set()
    stack: list[tuple[Any, str | None, int]] = []  # node, anchor, values counted before it
    root: Any = None
    total = 0  # values so far, aliases expanded
    documents = 0

    def count(size: int, at: Any) -> None:
        nonlocal total
        total += size
        if total > MAX_VALUES:
            _fail(
                Code.ALIAS_EXPANSION if size > 1 else Code.TOO_LARGE,
                name,
                f"the document expands to more than {MAX_VALUES:,} values (at {_mark(at)}).",
                "write the values out, or use fewer nested aliases",
            )

    def attach(node: Any) -> None:
        nonlocal root
        if not stack:
            root = node
            return
        parent = stack[-1][0]
        if isinstance(parent, yaml.MappingNode):
            pending = parent.value
            if pending and pending[-1][1] is None:
                pending[-1] = (pending[-1][0], node)
            else:
                pending.append((node, None))
        else:
            parent.value.append(node)

    for event in yaml.parse(text, Loader=_EventLoader):
        start: Any = event.start_mark  # libyaml's marks serve as well as PyYAML's
        end: Any = event.end_mark
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                _fail(
                    Code.MALFORMED,
                    name,
                    f"a second YAML document starts at {_mark(event)}.",
                    "keep one document per file",
                )
        elif isinstance(event, yaml.AliasEvent):
            anchor = str(event.anchor)
            if anchor in open_anchors:
                _fail(
                    Code.ALIAS_EXPANSION,
                    name,
                    f"alias *{printable(anchor, 40)} at {_mark(event)} refers to a node that "
                    "contains it.",
                    "a document is a tree: remove the self-reference",
                )
            if anchor not in anchors:
                _fail(
                    Code.MALFORMED,
                    name,
                    f"alias *{printable(anchor, 40)} at {_mark(event)} has no anchor.",
                    "define the anchor (&name) before using it",
                )
            node = anchors[anchor]
            count(sizes[id(node)], event)
            attach(node)
        elif isinstance(event, yaml.ScalarEvent):
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
            node = yaml.ScalarNode(tag, event.value, start, end, style=event.style)
            count(1, event)
            if event.anchor is not None:
                anchors[event.anchor] = node
                sizes[id(node)] = 1
            attach(node)
        elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            if len(stack) >= MAX_DEPTH:
                _fail(
                    Code.TOO_DEEP,
                    name,
                    f"nesting deeper than {MAX_DEPTH} levels at {_mark(event)}.",
                    "kvplan documents are a few levels deep; flatten the data",
                )
            is_map = isinstance(event, yaml.MappingStartEvent)
            kind = yaml.MappingNode if is_map else yaml.SequenceNode
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolver.resolve(kind, None, event.implicit)
            node = kind(tag, [], start, None, flow_style=event.flow_style)
            before = total
            count(1, event)
            if event.anchor is not None:
                anchors[event.anchor] = node
                open_anchors.add(event.anchor)
            attach(node)
            stack.append((node, event.anchor, before))
        elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            node, closed, before = stack.pop()
            node.end_mark = end
            if closed is not None:
                open_anchors.discard(closed)
                sizes[id(node)] = total - before
    return root


def _parse_yaml(text: str, name: str) -> Any:
    try:
        node = _compose_yaml(text, name)
        if node is None:
            _fail(Code.EMPTY_DOCUMENT, name, "the document is empty.", "pass a kvplan document")
        constructor = _Constructor()
        constructor.name = name
        return constructor.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        if "nesting depth" in problem:  # libyaml's own limit, met while scanning ahead
            _fail(
                Code.TOO_DEEP,
                name,
                f"nesting too deep{where}.",
                "kvplan documents are a few levels deep; flatten the data",
            )
        _fail(Code.MALFORMED, name, f"not valid YAML: {problem}{where}", "fix the syntax")


def _loc(parts: tuple[int | str, ...]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _document_loc(data: Any, loc: tuple[int | str, ...], kind: str) -> tuple[int | str, ...]:
    """The part of pydantic's ``loc`` that names places in the document itself.

    pydantic inserts union members (``constrained-int``, ``MultipleOf``, a spec kind) into
    ``loc``; they are dropped by walking ``data``. A missing field keeps its name.
    """
    out: list[int | str] = []
    current = data
    for index, part in enumerate(loc):
        inside = isinstance(current, dict) and part in current
        if inside or (
            isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current)
        ):
            out.append(part)
            current = current[part]
        elif index == len(loc) - 1 and kind == "missing" and isinstance(current, dict):
            out.append(part)
    return tuple(out)


def diagnostics_from_validation(
    exc: ValidationError, source: str, data: Any = None
) -> list[Diagnostic]:
    """Turn pydantic's errors into KVP diagnostics with the offending field as location.

    With ``data`` (the document as parsed), locations name only document fields, and a field
    gets one diagnostic even when several union members refused it.
    """
    out: list[Diagnostic] = []
    seen: set[tuple[int | str, ...]] = set()
    for item in exc.errors(include_url=False):
        loc = tuple(p for p in item["loc"])
        kind = item["type"]
        if isinstance(data, dict):
            clean = _document_loc(data, loc, kind)
            if clean in seen:
                continue
            seen.add(clean)
        else:
            # discriminated unions insert the tag value into loc; drop it for readability
            clean = tuple(p for p in loc if not (isinstance(p, str) and p in SPEC_KINDS))
        where = _loc(clean) or source
        msg = item["msg"]
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            tag = (item.get("ctx") or {}).get("tag", "")
            if kind == "union_tag_not_found":
                out.append(
                    error(
                        Code.SCHEMA,
                        where,
                        "spec has no 'kind'",
                        "add kind: the vLLM spec class name, e.g. FullAttentionSpec",
                    )
                )
            else:
                out.append(
                    error(
                        Code.UNKNOWN_SPEC_KIND,
                        where,
                        f"unknown spec kind {show_value(tag)}; kvplan knows: "
                        + ", ".join(SPEC_KINDS),
                        "use a vLLM 0.33 KVCacheSpec class name",
                    )
                )
            continue
        last = clean[-1] if clean else ""
        parent = clean[-2] if len(clean) > 1 else ""
        if kind == "literal_error" and (last == "dtype" or parent == "dtypes"):
            out.append(
                error(
                    Code.UNKNOWN_DTYPE,
                    where,
                    f"unknown dtype {show_value(item.get('input'))}",
                    "write a torch dtype without 'torch.', e.g. bfloat16, float8_e4m3fn, uint8",
                )
            )
        elif last == "kv_cache_layout":
            out.append(
                error(
                    Code.UNKNOWN_LAYOUT,
                    where,
                    msg.removeprefix("Value error, "),
                    "use LBNHC, LBHNC, LHBNC, BLHNC, BLNHC, BHLNC (or NHD/HND)",
                )
            )
        elif last == "format" and kind == "literal_error":
            out.append(
                error(
                    Code.WRONG_FORMAT,
                    where,
                    f"format is {show_value(item.get('input'))}, "
                    f"expected {item['ctx']['expected']}",
                    "pass the right kind of document",
                )
            )
        elif kind == "value_error" and "unknown" in msg and "expected one of" in msg:
            out.append(
                error(
                    Code.UNKNOWN_ENUM,
                    where,
                    msg.removeprefix("Value error, "),
                    "write enum members by name",
                )
            )
        else:
            text = msg.removeprefix("Value error, ")
            if kind in ("missing", "extra_forbidden"):
                text = {"missing": "required field is missing", "extra_forbidden": "unknown field"}[
                    kind
                ]
            else:
                got = show_value(item.get("input"))
                if "input" in item and got not in text:
                    text = f"{text} (got {got})"
            out.append(error(Code.SCHEMA, where, text, "see docs/formats.md"))
    return out


def _parse(model: type[_M], data: Any, source: str, fmt: str) -> _M:
    if isinstance(data, dict) and data.get("format") not in (None, fmt):
        raise KVPlanError(
            error(
                Code.WRONG_FORMAT,
                f"{source}: format",
                f"format is {show_value(data.get('format'))}, expected {fmt!r}",
                "pass an input document to plan, a plan to show/apply",
            )
        )
    if not isinstance(data, dict):
        raise KVPlanError(
            error(
                Code.SCHEMA,
                source,
                f"expected a {fmt} document (a mapping), got {show_value(data)}",
                "see docs/formats.md",
            )
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise KVPlanError(diagnostics_from_validation(exc, source, data)) from None


def parse_input(data: Any, source: str = "<input>") -> InputDocument:
    return _parse(InputDocument, data, source, INPUT_FORMAT)


def parse_plan(data: Any, source: str = "<plan>") -> BindingPlan:
    return _parse(BindingPlan, data, source, PLAN_FORMAT)


def load_input(path: str | Path) -> InputDocument:
    """Read a ``kvplan.input/1`` document from JSON or YAML."""
    return parse_input(read_data(path), str(path))


def load_plan(path: str | Path) -> BindingPlan:
    """Read a ``kvplan.plan/1`` document from JSON or YAML."""
    return parse_plan(read_data(path), str(path))


def load_any(path: str | Path) -> InputDocument | LegacyInputDocument | BindingPlan:
    """Read any document kind, chosen by its ``format`` field (input, legacy input, plan)."""
    from kvplan.schemas.legacy import LEGACY_INPUT_FORMAT, parse_legacy

    data = read_data(path)
    if isinstance(data, dict) and data.get("format") == PLAN_FORMAT:
        return parse_plan(data, str(path))
    if isinstance(data, dict) and data.get("format") == LEGACY_INPUT_FORMAT:
        return parse_legacy(data, str(path))
    return parse_input(data, str(path))


def dumps(obj: Document, *, yaml_format: bool = False) -> str:
    return to_yaml(obj) if yaml_format else to_json(obj)


class OutputError(KVPlanError, OSError):
    """``KVP016``: a file could not be written. Also an ``OSError``, so callers that wrap
    write failures in their own diagnostic (the vLLM plugin's dump directory) still do."""

    def __init__(self, diagnostic: Diagnostic, code: int | None, reason: str) -> None:
        super().__init__(diagnostic)
        self.errno = code
        self.strerror = reason

    def __str__(self) -> str:
        return self._summary()


def _output_error(
    name: str, message: str, hint: str, code: int | None = None, reason: str = ""
) -> OutputError:
    diagnostic = error(Code.OUTPUT_FAILED, name, message, hint)
    return OutputError(diagnostic, code, reason or message.rstrip("."))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` all at once: readers see the old file or the new one.

    The text goes to a temporary file in the same directory, is fsynced, then renamed over
    ``path`` (through a symbolic link, to the file it points at). On any failure (missing
    directory, a directory or read-only file in the way, a full disk) the previous file is
    left intact, the temporary file removed, and ``KVP016`` raised.
    """
    name = str(path)
    target = Path(os.path.realpath(path))
    parent = target.parent
    if target.is_dir():
        raise _output_error(name, "is a directory.", "name a file to write")
    if not parent.is_dir():
        raise _output_error(
            name, f"the directory {printable(str(parent))} does not exist.", "create it first"
        )
    if target.exists() and (
        not target.stat().st_mode & 0o222 or not os.access(target, os.W_OK)
    ):  # read-only by its mode bits: refused even for root, who could write it
        raise _output_error(
            name, "the file is read-only.", "make it writable (chmod u+w) or write elsewhere"
        )
    data = text.encode("utf-8")
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        mode = 0o666 & ~_umask()
        if target.exists():
            mode = target.stat().st_mode & 0o7777
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        tmp = ""
        _fsync_directory(parent)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        hint = (
            "free some space and run again"
            if exc.errno in (errno.ENOSPC, errno.EDQUOT)
            else "check the path and its permissions"
        )
        raise _output_error(
            name, f"cannot write the file: {reason}.", hint, exc.errno, reason
        ) from None
    finally:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_directory(folder: Path) -> None:
    """Make the rename durable; some filesystems cannot fsync a directory (then it is done)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one file (same inode, or the same real path)."""
    if str(a) == "-" or str(b) == "-":
        return False
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def refuse_output_over_input(output: str | Path, inputs: list[str | Path]) -> None:
    """``KVP017`` when ``output`` is one of ``inputs`` (directly or through a link)."""
    for source in inputs:
        if same_file(output, source):
            raise KVPlanError(
                error(
                    Code.OUTPUT_IS_INPUT,
                    str(output),
                    f"the output is the input file {printable(str(source))}; writing it would "
                    "destroy the input.",
                    "write the output to another file",
                )
            )


def dump(obj: Document, path: str | Path) -> None:
    """Write ``obj`` canonically (YAML for .yaml/.yml, JSON otherwise), atomically.

    See :func:`write_text_atomic`; failures raise ``KVP016``.
    """
    write_text_atomic(path, dumps(obj, yaml_format=str(path).endswith(YAML_SUFFIXES)))
