"""Hostile dump directories (issue 52): the dump directory (``KVPLAN_DUMP_DIR``, and
``KVPLAN_PLAN_DIR`` by the same rule) is a control channel -- its ``limit.json`` sets an
engine's physical memory. Owners, modes, symbolic links, planted files, huge and many files,
non-UTF-8 names, each against the entry points that take a dump directory: the engine's
start-up check (``prepare_dump_dir``, the plugin's ``preflight``), ``kvplan limit``,
``kvplan top``, ``kvplan doctor``, the limit reader, the one writer.

Every refusal is one coded paragraph naming what to change (and whose file it is), exit 2,
no traceback; nothing is written. Another uid is a real one (``nobody``, through
``setpriv``) when the tests run as root, as CI does."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvplan.elastic.files import LimitRequest, read_limit, write_limit, write_stats
from kvplan.integrations.vllm.pipeline.settings import check_plan_dir, prepare_dump_dir
from kvplan.integrations.vllm.plugin._preflight import preflight
from kvplan.schemas.errors import Diagnostic
from kvplan.schemas.loading import write_text_atomic
from tests.hostile._attacks import IS_ROOT
from tests.hostile._harness import SRC, assert_no_bug, assert_refused, invoke, spawn
from tests.integrations.vllm.metrics._helpers import stats

NOBODY = 65534
MiB = 1 << 20


@pytest.fixture
def base() -> Iterator[Path]:
    """A scratch area every user can enter (0755), with a sticky, world-writable ``shm``."""
    root = Path(tempfile.mkdtemp(prefix="kvplan-hostile-dump-"))
    root.chmod(0o755)
    (root / "shm").mkdir()
    (root / "shm").chmod(0o1777)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _mode(bits: int) -> Callable[[Path], Path]:
    def make(b: Path) -> Path:
        d = b / "dump"
        d.mkdir()
        d.chmod(bits)
        return d

    return make


def _owned_by_nobody(b: Path) -> Path:
    d = b / "dump"
    d.mkdir(mode=0o755)
    os.chown(d, NOBODY, NOBODY)
    return d


def _link_to_own(b: Path) -> Path:
    real = b / "real"
    real.mkdir(mode=0o700)
    (b / "shm" / "dump").symlink_to(real)
    return b / "shm" / "dump"


def _dangling(b: Path) -> Path:
    (b / "shm" / "dump").symlink_to(b / "missing")
    return b / "shm" / "dump"


def _open_parent(b: Path) -> Path:
    parent = b / "open"
    parent.mkdir()
    parent.chmod(0o777)
    (parent / "dump").mkdir(mode=0o700)
    return parent / "dump"


@dataclass(frozen=True)
class Hostile:
    make: Callable[[Path], Path]
    names: str
    """What the refusal must say."""
    root_only: bool = False


HOSTILE_DUMP_DIRECTORIES: dict[str, Hostile] = {
    "directory 0777": Hostile(_mode(0o777), "mode 0777"),
    "directory 0770 (group-writable)": Hostile(_mode(0o770), "mode 0770"),
    "directory owned by nobody": Hostile(_owned_by_nobody, "uid 65534", root_only=True),
    "symbolic link in a sticky directory": Hostile(_link_to_own, "symbolic link"),
    "dangling link": Hostile(_dangling, "symbolic link"),
    "parent writable by others": Hostile(_open_parent, "above the dump directory"),
}


@pytest.mark.parametrize("case", list(HOSTILE_DUMP_DIRECTORIES))
def test_a_hostile_dump_directory_is_refused_everywhere(base: Path, case: str) -> None:
    hostile = HOSTILE_DUMP_DIRECTORIES[case]
    if hostile.root_only:
        assert IS_ROOT, "CI runs as root: this case chowns to nobody"
    d = hostile.make(base)
    before = sorted(os.listdir(d)) if d.is_dir() else None
    for args in (["limit", str(d), "1PiB"], ["top", str(d), "--once"], ["top", str(d), "--json"]):
        outcome = invoke(args)
        assert_refused(outcome, "KVP428" if d.exists() else None, what=f"{case} {args[0]}")
        if d.exists():
            assert hostile.names in outcome.stderr, outcome.stderr
    found = prepare_dump_dir(d)  # the engine's start-up check
    assert found is not None and found.code.value == "KVP428", (case, found)
    assert hostile.names in found.message, found.message
    assert check_plan_dir(d) is not None  # KVPLAN_PLAN_DIR: the same rule
    env = {"KVPLAN_ENABLE": "1", "KVPLAN_BACKEND": "torch", "KVPLAN_DUMP_DIR": str(d)}
    assert any(p.code.value == "KVP428" for p in preflight(env).problems), case
    assert (sorted(os.listdir(d)) if d.is_dir() else None) == before


def test_doctor_does_not_call_a_world_writable_dump_directory_ready(base: Path) -> None:
    d = _mode(0o777)(base)
    outcome = spawn(
        ["doctor", "--json"],
        env={"KVPLAN_ENABLE": "1", "KVPLAN_BACKEND": "torch", "KVPLAN_DUMP_DIR": str(d)},
        seconds=180,
    )
    assert_no_bug(outcome, "doctor")
    report = json.loads(outcome.stdout)
    codes = [p["code"] for p in report["problems"]]
    assert "KVP428" in codes, report["problems"]


def test_kvplan_creates_the_dump_directory_private_whatever_the_umask(base: Path) -> None:
    target = base / "made" / "deeper" / "dump"
    old = os.umask(0)
    try:
        assert prepare_dump_dir(target) is None
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    for parent in (base / "made", base / "made" / "deeper"):
        assert not stat.S_IMODE(parent.stat().st_mode) & 0o022, oct(parent.stat().st_mode)


def test_a_sticky_shared_directory_is_usable_but_its_foreign_files_are_not(base: Path) -> None:
    """``/tmp``-style (1777): kvplan's own files there are used; another user's are named."""
    d = base / "shm"
    write_stats(d, stats(rank=0))  # an engine dumps there: `kvplan limit` writes for it
    assert invoke(["limit", str(d), "8GiB"]).exit_code == 0
    assert isinstance(read_limit(d), LimitRequest)
    if not IS_ROOT:
        pytest.skip("chowning to another user needs root (CI runs as root)")
    os.chown(d / "limit.json", NOBODY, NOBODY)
    found = read_limit(d)
    assert isinstance(found, Diagnostic) and found.code.value == "KVP417"
    assert "KVP428" in found.message and "uid 65534" in found.message, found.message
    outcome = invoke(["limit", str(d), "4GiB"])  # the operator: told whose file is in the way
    assert_refused(outcome, "KVP428", what="planted limit.json")
    assert "uid 65534" in outcome.stderr
    assert os.stat(d / "limit.json").st_uid == NOBODY  # named, not obeyed nor overwritten


@pytest.mark.parametrize("planted", [0o666, 0o6777, 0o777])
def test_the_writer_sets_the_mode_it_means_not_the_replaced_files(base: Path, planted: int) -> None:
    d = base / "dump"
    d.mkdir(mode=0o700)
    for name, write in (
        ("limit.json", lambda: write_limit(d, 8 << 30)),
        ("rank0.stats.json", lambda: write_stats(d, stats(rank=0))),
        ("out.json", lambda: write_text_atomic(d / "out.json", "{}\n")),
    ):
        (d / name).write_text("{}")
        os.chmod(d / name, planted)
        write()
        mode = stat.S_IMODE(os.stat(d / name).st_mode)
        assert mode & ~0o644 == 0, (name, oct(mode))  # no set-id, exec or other-write bit
    old = os.umask(0)
    try:
        write_limit(d, 4 << 30)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(d / "limit.json").st_mode) == 0o644


def test_a_read_only_planted_file_names_its_owner(base: Path) -> None:
    d = base / "dump"
    d.mkdir(mode=0o700)
    write_stats(d, stats(rank=0))
    (d / "limit.json").write_text("{}")
    os.chmod(d / "limit.json", 0o444)
    outcome = invoke(["limit", str(d), "8GiB"])
    assert_refused(outcome, "KVP016", what="read-only limit.json")
    assert "read-only (owned by uid" in outcome.stderr, outcome.stderr


def test_a_planted_input_dump_of_another_user_is_named_not_kept(base: Path) -> None:
    if not IS_ROOT:
        pytest.skip("chowning to another user needs root (CI runs as root)")
    from kvplan.schemas.loading import OutputError

    d = base / "shm"
    (d / "rank0.input.json").write_text("{}")
    os.chmod(d / "rank0.input.json", 0o444)
    os.chown(d / "rank0.input.json", NOBODY, NOBODY)
    with pytest.raises(OutputError) as caught:
        write_text_atomic(d / "rank0.input.json", "{}\n", within=d, own=True)
    assert caught.value.diagnostics[0].code.value == "KVP428"
    assert "uid 65534" in caught.value.diagnostics[0].message


_AS_NOBODY = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
shared, private = sys.argv[2], sys.argv[3]
doc = json.dumps({"kind": "kvplan-elastic-limit", "version": 1,
                  "limit_bytes": 1 << 50, "written_at": 1.0})
for folder in (shared, private):
    try:
        with open(os.path.join(folder, ".t"), "w") as f:
            f.write(doc)
        os.replace(os.path.join(folder, ".t"), os.path.join(folder, "limit.json"))
        print("WROTE", folder)
    except OSError as exc:
        print("REFUSED", folder, exc.errno)
from typer.testing import CliRunner
from kvplan.cli.app import app
out = CliRunner().invoke(app, ["limit", private, "1PiB"])
print("LIMIT", out.exit_code)
"""


def test_another_uid_cannot_set_the_limit_through_the_dump_directory(base: Path) -> None:
    """As ``nobody`` (a real second uid): a limit document moved into a sticky shared dump
    directory is refused by the reader, naming nobody; an engine's own 0700 directory takes
    nothing; nobody's ``kvplan limit`` writes nothing there."""
    assert IS_ROOT, "run as root (CI does): the test switches to uid nobody"
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run a command as another uid"
    shared, private = base / "shm", base / "dump"
    private.mkdir(mode=0o755)  # others may enter and read, not write
    out = subprocess.run(
        [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c",
         _AS_NOBODY, str(SRC), str(shared), str(private)],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"WROTE {shared}" in out.stdout and f"REFUSED {private}" in out.stdout, out.stdout
    assert "LIMIT 2" in out.stdout, out.stdout
    assert not (private / "limit.json").exists()
    found = read_limit(shared)
    assert isinstance(found, Diagnostic), found
    assert "uid 65534 (nobody)" in found.message, found.message
    write_stats(shared, stats(rank=0))  # the operator's engine dumps there
    outcome = invoke(["limit", str(shared), "8GiB"])
    assert_refused(outcome, "KVP428", what="nobody's limit.json")
    assert "uid 65534 (nobody)" in outcome.stderr


# -- non-UTF-8 names, huge files ----------------------------------------------------------


def _odd_directory(base: Path) -> Path:
    """A dump directory whose name is not UTF-8 (and holds an ESC), with rank 0's stats."""
    odd = Path(os.fsdecode(os.fsencode(str(base)) + b"/eng\xff\x1b[2J"))
    odd.mkdir(mode=0o700)
    write_stats(odd, stats(rank=0))
    return odd


@pytest.mark.parametrize("args", [["--json"], ["--once"], ["--html", "PAGE"]])
def test_a_non_utf8_directory_name_never_raises(base: Path, args: list[str]) -> None:
    odd = _odd_directory(base)
    page = base / "page.html"
    out = base / "out.txt"
    argv = ["top", str(odd), *[str(page) if a == "PAGE" else a for a in args]]
    outcome = spawn(argv, stdout_path=str(out))
    assert_no_bug(outcome, str(args))
    assert outcome.exit_code == 0, outcome.stderr
    for produced in (out, page):
        if produced.exists():
            text = produced.read_bytes().decode("utf-8")  # valid UTF-8, or this raises
            assert "\x1b" not in text
    if args == ["--json"]:
        rows = json.loads(out.read_bytes())
        assert rows[0]["rank"] == 0 and "\udcff" in rows[0]["path"]
        assert b"\\udcff" in out.read_bytes()  # written as an escape: ASCII
    outcome = spawn(["limit", str(odd), "8GiB"], stdout_path=str(out))
    assert outcome.exit_code == 0, outcome.stderr
    assert "\x1b" not in out.read_bytes().decode("utf-8")


def test_validate_of_a_16_mib_string_stays_within_ten_times_its_size(base: Path) -> None:
    """The JSON reader once kept ~120 bytes of backtracking state per character of a string:
    2 GB for this file. Now its peak is the process plus a few copies of the text."""
    big = base / "big.json"
    size = 16 * MiB
    big.write_text('{"x": "' + "a" * (size - 10) + '"}')
    outcome = spawn(["validate", str(big)])
    assert_refused(outcome, what="16 MiB string")
    assert outcome.peak_rss_bytes < 10 * size, outcome.peak_rss_bytes
