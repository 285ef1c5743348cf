"""Generated attacks on what kvplan reads, writes and prints, beyond document contents.

Each family is data (names → makers), crossed with every entry point that reads or writes a
file, so a new command or a new kind of file is one more row, not one more test:

- :data:`SPECIAL_FILES`: things that are not regular files (fifo, socket, device node, a link
  to one, an endless device) handed to every reader (:data:`READERS`);
- :data:`TARGETS`: what may already stand where kvplan writes (a link to a victim, a dangling
  link, a fifo, a socket, a device node, the input itself by name, link or hard link, a
  directory) under every writer (:data:`WRITERS`);
- :data:`HOSTILE_TEXTS`: file-system and environment text (escapes, newlines, bidi overrides,
  markup, markdown table syntax) in every place a command prints it;
- :func:`foreign_digits`: every Unicode decimal digit that is not ASCII, for every size and
  number a command reads.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.hostile._generators import GOLDEN

MODEL = "google__gemma-3-1b-it"
INPUT = GOLDEN / MODEL / "input.json"
PLAN = GOLDEN / MODEL / "plan.json"
IS_ROOT = os.geteuid() == 0


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path) -> Path:
    """A unix socket node at ``path`` (bound at a short path, then moved: a socket's path is
    at most 107 bytes, pytest's temporary paths may be longer)."""
    short = Path(tempfile.mkdtemp(prefix="kvs", dir=tempfile.gettempdir())) / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(short))
    finally:
        sock.close()  # the node stays: opening it fails, it is never a file
    shutil.move(str(short), path)
    short.parent.rmdir()
    return path


def _device(path: Path) -> Path:
    """A character device node equal to /dev/null, made here so a buggy writer replaces a
    copy, never the machine's own /dev/null."""
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path


def _link(path: Path, target: Path | str) -> Path:
    path.symlink_to(target)
    return path


SPECIAL_FILES: dict[str, Callable[[Path], Path]] = {
    "fifo": _fifo,
    "socket": _socket,
    "link-to-fifo": lambda p: _link(p, _fifo(p.with_name(p.name + ".fifo"))),
    "link-to-socket": lambda p: _link(p, _socket(p.with_name(p.name + ".sock"))),
    "link-to-dev-zero": lambda p: _link(p, "/dev/zero"),
    "link-to-dev-tty-like": lambda p: _link(p, "/dev/ptmx"),
}
"""Non-regular files a reader must refuse without blocking (``KVP022``)."""
if IS_ROOT:
    SPECIAL_FILES["device-node"] = _device
    SPECIAL_FILES["link-to-device-node"] = lambda p: _link(p, _device(p.with_name(p.name + ".dev")))


def node_kind(path: Path) -> str:
    """What stands at ``path`` without following it: file, link, fifo, socket, char, dir."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    for kind, test in (
        ("link", stat.S_ISLNK),
        ("file", stat.S_ISREG),
        ("dir", stat.S_ISDIR),
        ("fifo", stat.S_ISFIFO),
        ("socket", stat.S_ISSOCK),
        ("char", stat.S_ISCHR),
    ):
        if test(mode):
            return kind
    return "other"


# -- a work area per case -----------------------------------------------------------------


@dataclass
class Area:
    """A temporary tree: an input, a plan, a golden directory of one model, a dump directory
    with one stats file, and ``outside/`` (a victim file that no command may touch)."""

    root: Path
    input: Path = field(init=False)
    plan: Path = field(init=False)
    golden: Path = field(init=False)
    model: Path = field(init=False)
    dump: Path = field(init=False)
    outside: Path = field(init=False)
    victim: Path = field(init=False)

    def __post_init__(self) -> None:
        self.input = self.root / "in.json"
        self.input.write_bytes(INPUT.read_bytes())
        self.plan = self.root / "plan.json"
        self.plan.write_bytes(PLAN.read_bytes())
        self.golden = self.root / "golden"
        self.model = self.golden / MODEL
        self.model.mkdir(parents=True)
        shutil.copy(INPUT, self.model / "input.json")
        shutil.copy(PLAN, self.model / "plan.json")
        self.dump = self.root / "dump"
        self.dump.mkdir()
        self.outside = self.root / "outside"
        self.outside.mkdir()
        self.victim = self.outside / "victim.txt"
        self.victim.write_text("precious\n")

    def drift(self) -> None:
        """Make the golden model's stored plan differ from its input (for ``check --html``)."""
        path = self.model / "plan.json"
        data = json.loads(path.read_text())
        data["views"][0]["offset_bytes"] += 256
        path.write_text(json.dumps(data))

    def snapshot(self) -> dict[str, tuple[str, bytes | None]]:
        """Every node below the area's root: its kind and, for files, its bytes."""
        out: dict[str, tuple[str, bytes | None]] = {}
        for folder, dirs, files in os.walk(self.root):
            for name in dirs + files:
                path = Path(folder) / name
                kind = node_kind(path)
                out[str(path.relative_to(self.root))] = (
                    kind,
                    path.read_bytes() if kind == "file" else None,
                )
        return out


# -- readers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reader:
    """A command that reads the file at ``place(area)``: exit 2 and ``code`` on ``stream``."""

    name: str
    place: Callable[[Area], Path]
    args: Callable[[Area], list[str]]
    code: str = "KVP022"
    stream: str = "stderr"  # where the code shows first: stderr, or stdout (golden's report)


def _stats_place(area: Area) -> Path:
    return area.dump / "rank0.stats.json"


READERS: list[Reader] = [
    Reader("plan", lambda a: a.root / "x.json", lambda a: ["plan", str(a.root / "x.json")]),
    Reader("validate", lambda a: a.root / "x.json", lambda a: ["validate", str(a.root / "x.json")]),
    Reader("show", lambda a: a.root / "x.json", lambda a: ["show", str(a.root / "x.json")]),
    Reader(
        "diff-a",
        lambda a: a.root / "x.json",
        lambda a: ["diff", str(a.root / "x.json"), str(a.plan)],
    ),
    Reader(
        "diff-b",
        lambda a: a.root / "x.json",
        lambda a: ["diff", str(a.plan), str(a.root / "x.json")],
    ),
    Reader(
        "apply",
        lambda a: a.root / "x.json",
        lambda a: ["apply", str(a.root / "x.json"), "--backend", "meta"],
    ),
    Reader(
        "golden-check-plan",
        lambda a: a.model / "plan.json",
        lambda a: ["golden", "check", str(a.golden), "--input-only"],
        stream="stdout",
    ),
    Reader(
        "golden-check-input",
        lambda a: a.model / "input.json",
        lambda a: ["golden", "check", str(a.golden), "--input-only"],
        stream="stdout",
    ),
    Reader(
        "golden-update-plan",
        lambda a: a.model / "plan.json",
        lambda a: ["golden", "update", str(a.golden), "--input-only"],
    ),
    Reader("top", _stats_place, lambda a: ["top", str(a.dump), "--once"], code="KVP416"),
    Reader("top-json", _stats_place, lambda a: ["top", str(a.dump), "--json"], code="KVP416"),
]
"""Every command that reads a file kvplan did not create in this run."""


# -- writers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Writer:
    """A command that writes the file at ``place(area)``.

    ``inputs``: the files it reads (a target equal to one of them is ``KVP017``).
    """

    name: str
    place: Callable[[Area], Path]
    args: Callable[[Area], list[str]]
    inputs: Callable[[Area], list[Path]] | None = None
    prepare: Callable[[Area], None] | None = None


def _an_engine_dumps(area: Area) -> None:
    """A stats file in the dump directory: ``kvplan limit`` writes only where an engine reads."""
    import time

    from harness._stats import make_stats
    from kvplan.elastic.files import write_stats

    write_stats(area.dump, make_stats(time=time.time()))


def _drifted_with_pages(area: Area) -> None:
    area.drift()
    (area.root / "pages").mkdir()


WRITERS: list[Writer] = [
    Writer(
        "plan-o",
        lambda a: a.root / "out.json",
        lambda a: ["plan", str(a.input), "-o", str(a.root / "out.json")],
        lambda a: [a.input],
    ),
    Writer(
        "show-html",
        lambda a: a.root / "out.html",
        lambda a: ["show", str(a.plan), "--html", str(a.root / "out.html")],
        lambda a: [a.plan],
    ),
    Writer(
        "diff-html",
        lambda a: a.root / "out.html",
        lambda a: ["diff", str(a.plan), str(a.input), "--html", str(a.root / "out.html")],
        lambda a: [a.plan, a.input],
    ),
    Writer(
        "golden-update-plan",
        lambda a: a.model / "plan.json",
        lambda a: ["golden", "update", str(a.golden), "--input-only"],
    ),
    Writer(
        "golden-update-input",
        lambda a: a.model / "input.json",
        lambda a: ["golden", "update", str(a.golden), "--input-only"],
    ),
    Writer(
        "golden-check-html",
        lambda a: a.root / "pages" / f"{MODEL}.html",
        lambda a: [
            *("golden", "check", str(a.golden), "--input-only"),
            *("--html", str(a.root / "pages")),
        ],
        prepare=lambda a: _drifted_with_pages(a),
    ),
    Writer(
        "limit",
        lambda a: a.dump / "limit.json",
        lambda a: ["limit", str(a.dump), "1GiB"],
        prepare=lambda a: _an_engine_dumps(a),
    ),
]
"""Every command that writes a file."""


def _hardlink(path: Path, target: Path) -> Path:
    os.link(target, path)
    return path


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


Target = Callable[[Area, Path, list[Path]], Path]

TARGETS: dict[str, Target] = {
    "link-to-victim": lambda a, p, i: _link(p, a.victim),
    "dangling-link": lambda a, p, i: _link(p, a.outside / "created-by-kvplan.txt"),
    "relative-link-out": lambda a, p, i: _link(p, os.path.relpath(a.victim, p.parent)),
    "fifo": lambda a, p, i: _fifo(p),
    "socket": lambda a, p, i: _socket(p),
    "directory": lambda a, p, i: _directory(p),
}
"""What may stand where a writer writes (``p``): refused with ``KVP016``/``KVP023``."""
if IS_ROOT:
    TARGETS["device-node"] = lambda a, p, i: _device(p)
    TARGETS["link-to-device-node"] = lambda a, p, i: _link(p, _device(a.outside / "null"))

INPUT_TARGETS: dict[str, Target] = {
    "the-input": lambda a, p, i: i[0],
    "the-last-input": lambda a, p, i: i[-1],
    "link-to-input": lambda a, p, i: _link(p, i[-1]),
    "hardlink-to-input": lambda a, p, i: _hardlink(p, i[-1]),
    "input-by-dot-path": lambda a, p, i: i[-1].parent / "." / i[-1].name,
}
"""Outputs that are one of the writer's inputs (``i``): refused with ``KVP017``. A maker that
returns another path than ``p`` makes the writer write there (see :func:`retarget`)."""


def retarget(args: list[str], old: Path, new: Path) -> list[str]:
    """``args`` with the output path ``old`` replaced by ``new`` (for the-input targets)."""
    return [str(new) if arg == str(old) else arg for arg in args]


# -- text from the file system and the environment ------------------------------------------

HOSTILE_TEXTS = {
    "csi": "\x1b[31mred\x1b[0m",
    "osc-title": "\x1b]0;pwned\x07",
    "newline-row": "x\n| `evil` | identical |",
    "carriage-return": "ok\roverwritten",
    "bidi": "\u202eevil\u202c",
    "c1-csi": "\x9b31m",
    "markup": "[bold red]m[on blue]x",
    "pipe-backtick": "a|b`c",
}
"""Names a directory entry or an environment variable may hold (anything but ``/`` and NUL)."""

RAW_FORBIDDEN = (
    [c for c in map(chr, range(0x20)) if c not in "\n"]
    + [chr(c) for c in range(0x7F, 0xA0)]
    + ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]
)
"""Characters that must never reach a terminal raw (newline only as kvplan's own)."""


def raw_controls(text: str) -> list[str]:
    """The forbidden characters present in ``text``, as escapes (for the failure message)."""
    return sorted({repr(c) for c in text if c in RAW_FORBIDDEN})


# -- digits ------------------------------------------------------------------------------------


def foreign_digits(value: int = 3) -> list[str]:
    """Every non-ASCII character that Python's ``int()`` and ``re``'s ``\\d`` read as ``value``
    (Arabic-Indic, Devanagari, full-width, mathematical bold, ...)."""
    out = []
    for code in range(0x80, sys.maxunicode + 1):
        char = chr(code)
        if unicodedata.category(char) == "Nd" and unicodedata.decimal(char, -1) == value:
            out.append(char)
    return out


UNICODE_SPACES = ["\u00a0", "\u2003", "\u3000", "\u2028", "\x85"]
"""Whitespace ``str.strip()`` and ``\\s`` accept but a size never holds."""
