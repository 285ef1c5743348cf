"""The one reader: every file kvplan reads, and the JSON/YAML scanners, within bounded limits.

Private to :mod:`kvplan.schemas`; :mod:`kvplan.schemas.loading` re-exports the public names
(``read_bytes``, ``read_data``, ``decode_text``, ``parse_text``, the limits). Documents,
golden trees, stats and limit files all come through :func:`read_bytes`: it opens nothing
that is not a regular file (checked before the open, opened non-blocking, checked again on
the open descriptor), reads at most a bound, and, below a directory kvplan keeps its own
files in (``within``), follows no symbolic link (see docs/formats.md, "Reading and writing
rules").
"""

from __future__ import annotations

import contextlib
import errno
import json
import json.decoder
import math
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import yaml

from kvplan.schemas.errors import Code, KVPlanError, error, owner_text, printable, show_value

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


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""A read never waits for a writer (fifo) or becomes a controlling terminal (tty)."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_READ_CHUNK = 1 << 20

_KINDS = (
    (stat.S_ISFIFO, "a fifo (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
)


def file_kind(mode: int) -> str:
    """What a non-regular file is, for a message: ``a fifo (named pipe)``, ``a socket``, ..."""
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit >> 10} KiB"


def _unreadable(name: str, exc: OSError) -> NoReturn:
    reason = exc.strerror or type(exc).__name__
    hint = {
        errno.ENOENT: "check the path",
        errno.EISDIR: "pass a document file, not a directory",
        errno.EACCES: "make the file readable (chmod u+r) or run as its owner",
    }.get(exc.errno or 0, "check the path and the file")
    _fail(Code.UNREADABLE, name, f"cannot read the file: {reason}.", hint)


def is_trusted_owner(uid: int) -> bool:
    """Whether a file of ``uid`` may steer this process: its own user's, or root's."""
    return uid in (os.geteuid(), 0)


def refuse_untrusted(name: str, uid: int, what: str = "file") -> NoReturn:
    """``KVP428``: ``name`` belongs to another user (named), whose file is not obeyed."""
    _fail(
        Code.UNTRUSTED,
        name,
        f"the {what} is owned by {owner_text(uid)}, not by this user ({owner_text(os.geteuid())}) "
        "or root; kvplan does not act on another user's file here.",
        f"remove it (another user planted it), or run kvplan as {owner_text(uid)}",
    )


def _require_regular(mode: int, name: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        _fail(
            Code.UNREADABLE,
            name,
            "is a directory, not a regular file.",
            "pass a document file, not a directory",
        )
    if stat.S_ISLNK(mode):
        _fail(
            Code.UNSAFE_OUTPUT,
            name,
            "is a symbolic link; kvplan keeps regular files here and does not follow links.",
            "remove the link (kvplan writes a regular file in its place)",
        )
    _fail(
        Code.NOT_REGULAR_FILE,
        name,
        f"is {file_kind(mode)}, not a regular file; kvplan reads regular files only.",
        "save the document to a file and pass that; pass - to read standard input",
    )


def open_below(root: str | Path, path: str | Path, *, create: bool = False) -> tuple[int, str]:
    """A descriptor of ``path``'s directory and ``path``'s last component, reached from
    ``root`` one component at a time without following a symbolic link below ``root``.

    ``path`` must lie lexically below ``root`` (``root / ...``), without ``..``; ``root``
    itself is the caller's directory and may be a link. ``create``: make missing
    directories on the way. ``KVP023`` for a link or a path outside, ``KVP002`` for a
    missing or unreadable directory. The caller closes the descriptor.
    """
    name = str(path)
    try:
        parts = Path(path).relative_to(Path(root)).parts
    except ValueError:
        parts = ("..",)
    if not parts or any(part in ("..", ".", "") for part in parts):
        _fail(
            Code.UNSAFE_OUTPUT,
            name,
            f"is not below the directory {printable(str(root))}.",
            "name a file inside the directory given",
        )
    try:
        folder = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        _unreadable(str(root), exc)
    try:
        for part in parts[:-1]:
            folder = _step(folder, part, create, name)
    except BaseException:
        os.close(folder)
        raise
    return folder, parts[-1]


def _step(folder: int, part: str, create: bool, name: str) -> int:
    """The subdirectory ``part`` of ``folder`` (closed on success), never through a link."""
    for _ in range(2):
        try:
            inner = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=folder)
        except FileNotFoundError:
            if not create:
                raise KVPlanError(
                    error(Code.UNREADABLE, name, f"the folder {printable(part)} does not exist.")
                ) from None
            # made by someone else meanwhile: open it (a link is refused there)
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=folder)
            continue
        except OSError as exc:
            try:
                mode = os.stat(part, dir_fd=folder, follow_symlinks=False).st_mode
            except OSError:
                _unreadable(name, exc)
            _fail(
                Code.UNSAFE_OUTPUT,
                name,
                f"the folder {printable(part)} on the way is {file_kind(mode)}; kvplan does not "
                "follow links below the directory it was given.",
                "make it a real directory (or remove it)",
            )
        os.close(folder)
        return inner
    _unreadable(name, OSError(errno.ENOENT, "the folder keeps disappearing"))


def read_bytes(
    path: str | Path,
    *,
    limit: int = MAX_DOCUMENT_BYTES,
    within: str | Path | None = None,
    own: bool = False,
) -> bytes:
    """The bytes of a regular file (``-``: standard input), at most ``limit``: the one reader.

    Nothing that is not a regular file is opened: the file is checked first (``os.stat``,
    ``KVP022`` for a fifo, socket or device, ``KVP002`` for a directory), opened with
    ``O_NONBLOCK`` (so nothing can make the open wait) and checked again on the descriptor
    alone (a file renamed over the path in between is the new file, read whole: no error); a
    read that would wait is ``KVP022`` too. ``within``: a directory kvplan keeps its own
    files in (a golden tree, a dump directory); then ``path`` must lie below it and no
    symbolic link below it is followed, the file's own name included (``KVP023``).
    ``own``: the file steers this process (a dump directory's ``limit.json``, stats, plans):
    it must belong to this user or root, checked on the open descriptor (``KVP428`` naming
    its owner otherwise). ``KVP002`` unreadable, ``KVP014`` larger than ``limit``.
    """
    name = str(path)
    if name == "-" and within is None:
        data = _read_stdin(limit)
    else:
        fd = _open_regular(path, within)
        try:
            # the descriptor alone decides: an atomic rename-over between the check of the
            # path and the open hands over the new file, which is as whole as the old one
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                _fail(
                    Code.NOT_REGULAR_FILE,
                    name,
                    f"was replaced by {file_kind(opened.st_mode)} while it was opened; kvplan "
                    "reads regular files only.",
                    "run again once nothing else writes it",
                )
            if own and not is_trusted_owner(opened.st_uid):
                refuse_untrusted(name, opened.st_uid)
            data = _read_fd(fd, limit, name)
        finally:
            os.close(fd)
    if len(data) > limit:
        _fail(
            Code.TOO_LARGE,
            name,
            f"the document is larger than {_size(limit)}.",
            "kvplan documents are far smaller; pass the right file",
        )
    return data


def _open_regular(path: str | Path, within: str | Path | None) -> int:
    name = str(path)
    if within is None:
        try:
            info = os.stat(path)
        except OSError as exc:
            _unreadable(name, exc)
        _require_regular(info.st_mode, name)
        try:
            return os.open(path, _OPEN_FLAGS)
        except OSError as exc:
            _unreadable(name, exc)
    folder, leaf = open_below(within, path)
    try:
        try:
            info = os.stat(leaf, dir_fd=folder, follow_symlinks=False)
        except OSError as exc:
            _unreadable(name, exc)
        _require_regular(info.st_mode, name)
        try:
            fd = os.open(leaf, _OPEN_FLAGS | os.O_NOFOLLOW, dir_fd=folder)
        except OSError as exc:
            _unreadable(name, exc)
        return fd
    finally:
        os.close(folder)


def _read_fd(fd: int, limit: int, name: str) -> bytes:
    parts: list[bytes] = []
    total = 0
    while total <= limit:
        try:
            chunk = os.read(fd, min(_READ_CHUNK, limit + 1 - total))
        except BlockingIOError:
            _fail(
                Code.NOT_REGULAR_FILE,
                name,
                "cannot be read without waiting (a special file that looks regular).",
                "pass a document saved to a regular file",
            )
        except OSError as exc:
            _unreadable(name, exc)
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


def _read_stdin(limit: int) -> bytes:
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        _fail(
            Code.UNREADABLE,
            "-",
            "standard input is closed.",
            "pipe the document in (kvplan plan - < doc.json) or pass its path",
        )
    try:
        data: bytes = stream.read(limit + 1)
    except OSError as exc:
        _unreadable("-", exc)
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


def read_data(path: str | Path, *, within: str | Path | None = None, own: bool = False) -> Any:
    """Parse a JSON or YAML file (``-`` reads stdin) within the reading limits.

    KVP002 unreadable, KVP001 malformed, KVP009-KVP015 over a limit, KVP022 not a regular
    file, KVP023 a link below ``within`` (see :func:`read_bytes` and docs/formats.md).
    """
    name = str(path)
    return parse_text(decode_text(read_bytes(path, within=within, own=own), name), name)


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


_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
"""The standard library's JSON string scanner (C): ``(decoded, index after the closing quote)``
from the index after the opening quote."""

_JSON_TOKEN = re.compile(
    r'"|[{}\[\],:]|-?(?:[0-9]+)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|NaN|-?Infinity'
)
"""A string's opening quote, punctuation, a number: what :func:`_scan_json` looks at. A
string's body is left to :func:`json.decoder.scanstring` (C): a regular expression that
matched the body (``"(?:[^"\\]|\\.)*"``) kept backtracking state for every character, about
120 bytes each, so one long string cost a hundred times its size."""


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
    pos = 0
    while (match := _JSON_TOKEN.search(text, pos)) is not None:
        token = match.group()
        first = token[0]
        pos = match.end()
        if first == '"':
            try:  # the string's body, decoded in C: memory is the string itself
                key, pos = _scanstring(text, pos, True)
            except ValueError:
                return
            values += 1
            if expect_key and stack and stack[-1] is not None:
                keys = stack[-1]
                if key in keys:
                    _fail(
                        Code.DUPLICATE_KEY,
                        name,
                        f"duplicate key {show_value(key)} at {_position(text, match.start())}.",
                        "keep one of the two entries",
                    )
                keys.add(key)
                values -= 1  # a key is not a value
                expect_key = False
            del key
        elif first in "{[":
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
        else:
            values += 1
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
