"""Hostile files and output targets: missing, directory, unreadable, empty, binary, fifo,
device; ``-o`` into a missing directory, onto a directory, a read-only file, the input (or a
link to it), a link, a full disk, ``/dev/full``; concurrent writers. Inputs and previous
outputs stay intact. (``test_special_files`` and ``test_output_targets`` cross every reader
and writer with every kind of file.)"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvplan.schemas import loading
from tests.hostile._generators import GOLDEN
from tests.hostile._harness import SRC, assert_bounded, assert_refused, digest, invoke, spawn

INPUT = GOLDEN / "google__gemma-3-1b-it" / "input.json"
PLAN = GOLDEN / "google__gemma-3-1b-it" / "plan.json"


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    path = tmp_path / "in.json"
    path.write_bytes(INPUT.read_bytes())
    return path


@pytest.fixture
def previous(tmp_path: Path) -> Path:
    """An earlier output that a failed write must leave as it was."""
    path = tmp_path / "out.json"
    path.write_bytes(PLAN.read_bytes())
    return path


FILES = {
    "missing": ("KVP002", lambda d: d / "nope.json"),
    "directory": ("KVP002", lambda d: d),
    "empty": ("KVP015", lambda d: _write(d / "e.json", b"")),
    "blank-yaml": ("KVP015", lambda d: _write(d / "e.yaml", b"  \n# only a comment\n")),
    "binary": ("KVP013", lambda d: _write(d / "b.json", bytes(range(256)) * 4)),
    "png": ("KVP013", lambda d: _write(d / "b.yaml", b"\x89PNG\r\n\x1a\n\x00\x00")),
    "too-large": (
        "KVP014",
        lambda d: _write(d / "l.json", b" " * (loading.MAX_DOCUMENT_BYTES + 2)),
    ),
    "endless-device": ("KVP022", lambda d: Path(os.devnull).with_name("zero")),
    "scalar": ("KVP004", lambda d: _write(d / "s.json", b"42")),
    "list": ("KVP004", lambda d: _write(d / "s.yaml", b"- 1\n- 2\n")),
    "two-yaml-docs": ("KVP001", lambda d: _write(d / "t.yaml", b"a: 1\n---\nb: 2\n")),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize("command", ["validate", "plan", "show", "diff"])
def test_hostile_file_is_refused(tmp_path: Path, doc: Path, name: str, command: str) -> None:
    code, make = FILES[name]
    path = make(tmp_path)
    args = [command, str(path)] + ([str(doc)] if command == "diff" else [])
    assert_refused(invoke(args), code, what=f"{command} {name}")


def test_unreadable_file_is_kvp002(monkeypatch: pytest.MonkeyPatch, doc: Path) -> None:
    # the suite may run as root, who reads any file: refuse at the open call instead
    real_open = os.open

    def denied(path: object, *args: object, **kwargs: object) -> int:
        if str(path) == str(doc):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", denied)
    outcome = invoke(["plan", str(doc)])
    assert_refused(outcome, "KVP002")
    assert "Permission denied" in outcome.stderr


def test_a_fifo_is_refused_even_with_a_writer_and_stdin_is_the_pipe(tmp_path: Path) -> None:
    """A fifo (``<(...)``) is refused without being opened for reading, so it never blocks;
    a pipe is read as ``-`` (standard input)."""
    fifo = tmp_path / "doc.json"
    os.mkfifo(fifo)
    outcome = spawn(["plan", str(fifo)], seconds=20)
    assert_refused(outcome, "KVP022")
    assert "pass - to read standard input" in outcome.stderr
    read, write = os.pipe()
    os.write(write, INPUT.read_bytes())
    os.close(write)
    try:
        piped = spawn(["plan", "-"], stdin=read)
    finally:
        os.close(read)
    assert piped.exit_code == 0 and json.loads(piped.stdout)["format"] == "kvplan.plan/1"


def test_stdin_is_read(doc: Path) -> None:
    with open(doc, "rb") as handle:
        outcome = spawn(["plan", "-"], stdin=handle.fileno())
    assert outcome.exit_code == 0 and json.loads(outcome.stdout)["format"] == "kvplan.plan/1"


TARGETS = {
    "missing-dir": ("KVP016", lambda d, i, p: d / "no" / "such" / "plan.json"),
    "directory": ("KVP016", lambda d, i, p: d),
    "same-as-input": ("KVP017", lambda d, i, p: i),
    "input-by-another-path": ("KVP017", lambda d, i, p: d / "." / i.name),
    "symlink-to-input": ("KVP017", lambda d, i, p: _link(d / "link.json", i)),
    "read-only": ("KVP016", lambda d, i, p: _read_only(p)),
}


def _link(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


def _read_only(path: Path) -> Path:
    path.chmod(0o444)
    return path


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_hostile_output_target(tmp_path: Path, doc: Path, previous: Path, name: str) -> None:
    code, make = TARGETS[name]
    target = make(tmp_path, doc, previous)
    before = {path: digest(path) for path in (doc, previous)}
    assert_refused(invoke(["plan", str(doc), "-o", str(target)]), code, what=name)
    assert {path: digest(path) for path in (doc, previous)} == before
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers


def test_output_through_a_symlink_is_refused(tmp_path: Path, doc: Path, previous: Path) -> None:
    """A link where the output goes could point anywhere (a planted ``plan.json`` in a
    shared directory -> ``~/.bashrc``): kvplan never writes through one, and names the file
    to write instead."""
    link = _link(tmp_path / "link.json", previous)
    before = digest(previous)
    outcome = invoke(["plan", str(doc), "-o", str(link)])
    assert_refused(outcome, "KVP023")
    assert "symbolic link" in outcome.stderr
    assert link.is_symlink() and digest(previous) == before


@pytest.mark.parametrize("target", ["/dev/stdout", "/dev/fd/1", "-"])
def test_standard_output_is_not_an_output_file(tmp_path: Path, doc: Path, target: str) -> None:
    """``-o /dev/stdout`` (a link to the terminal, a pipe or a file) and ``-o -`` are refused:
    ``-o`` writes regular files; without it the document is printed."""
    outcome = invoke(["plan", str(doc), "-o", target])
    assert_refused(outcome, "KVP023")
    assert "leave out the option to print" in outcome.stderr


def test_full_disk_keeps_the_previous_output(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, doc: Path, previous: Path
) -> None:
    # ENOSPC at the write's fsync (no tiny tmpfs can be mounted in CI)
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    before = digest(previous)
    monkeypatch.setattr(os, "fsync", full)
    outcome = invoke(["plan", str(doc), "-o", str(previous)])
    assert_refused(outcome, "KVP016")
    assert "No space left on device" in outcome.stderr
    assert digest(previous) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.json", "out.json"]


@pytest.mark.parametrize("command", ["plan", "show", "validate --json", "schema"])
def test_full_stdout_is_kvp018(tmp_path: Path, doc: Path, command: str) -> None:
    args = command.split() + ([] if command == "schema" else [str(doc)])
    if command == "schema":
        args.append("plan")
    outcome = spawn(args, stdout_path="/dev/full")
    assert_refused(outcome, "KVP018", what=command)
    assert outcome.stderr.count("\n") == 1, outcome.stderr  # nothing more at exit


def test_a_closed_pipe_ends_quietly(doc: Path) -> None:
    """``kvplan show | head``: the reader went away; the command ends as ``git log | head``
    does (``SIGPIPE``), nothing on stderr (tests/hostile/test_pipes.py: every command)."""
    read, write = os.pipe()
    os.close(read)
    try:
        outcome = spawn(["show", str(doc)], stdout_path=f"/dev/fd/{write}")
    finally:
        os.close(write)
    assert outcome.exit_code == -signal.SIGPIPE, outcome
    assert outcome.stderr == "" and outcome.stdout == ""


def test_concurrent_writers_never_expose_a_partial_plan(tmp_path: Path, doc: Path) -> None:
    target = tmp_path / "plan.json"
    stop = threading.Event()
    seen: list[str] = []
    torn: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                text = target.read_text()
            except FileNotFoundError:
                continue
            try:
                assert json.loads(text)["format"] == "kvplan.plan/1"
                seen.append("ok")
            except (ValueError, KeyError, AssertionError):
                torn.append(text[:80])

    thread = threading.Thread(target=reader)
    thread.start()
    env = dict(os.environ, PYTHONPATH=str(SRC))
    writers = [
        subprocess.Popen(
            [sys.executable, "-m", "kvplan", "plan", str(doc), "-o", str(target)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(6)
    ]
    codes = [w.wait(timeout=120) for w in writers]
    stop.set()
    thread.join()
    assert codes == [0] * 6
    assert not torn, torn[:3]
    assert seen, "the reader never saw the file"
    assert [p.name for p in tmp_path.iterdir() if p.name != "in.json"] == ["plan.json"]


def test_block_range_is_checked_without_materialising(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(PLAN.read_bytes())
    outcome = spawn(
        ["apply", str(plan), "--backend", "meta", "--mode", "elastic", "--blocks", "0-999999999"]
    )
    assert_refused(outcome, "KVP404")
    assert_bounded(outcome, "--blocks 0-999999999")
