"""A group directory nobody else can stop, hijack or silently reset (issue 28).

Ownership and modes (created ``0700``/``0600``; another uid can neither lock nor lease,
tested as ``nobody`` through ``setpriv``), a group that knows it exists (a removed ledger,
lock or lease is refused or recovered, never a silent reset), ``limit DIR`` against
``limit --group DIR``, numeric bounds written back, no raw validation error."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness._stats import make_stats
from kvplan.cli.app import app
from kvplan.elastic.files import write_stats
from kvplan.elastic.group import (
    MAX_BYTES,
    GroupMember,
    GroupPaths,
    attach,
    read_ledger,
    read_snapshot,
    set_budget,
)
from kvplan.schemas.errors import KVPlanError

MiB = 1 << 20
SRC = Path(__file__).resolve().parents[2] / "src"
runner = CliRunner()


def code_of(caught: pytest.ExceptionInfo[KVPlanError]) -> str:
    return caught.value.diagnostics[0].code.value


def limit(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, ["limit", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res.exit_code, res.stdout, res.stderr


def refused(args: list[str], code: str) -> str:
    exit_code, out, err = limit(*args)
    assert exit_code == 2, (exit_code, out, err)
    assert err.startswith(code), err
    assert "KVP019" not in err
    return err


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can enter (0755, under a sticky /tmp): another uid reaches a
    group inside it, so only the group's own modes stand in its way."""
    base = Path(tempfile.mkdtemp(prefix="kvplan-g28-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- ownership and modes ----------------------------------------------------------------


def test_kvplan_creates_the_group_private(shared: Path) -> None:
    gdir = shared / "made" / "g"
    exit_code, _, err = limit("--group", str(gdir), "64MiB")
    assert exit_code == 0, err
    a = GroupMember.join(gdir, "a", floor=MiB, ceiling=64 * MiB)
    try:
        paths = GroupPaths(gdir)
        assert mode(gdir) == 0o700
        assert mode(paths.members) == 0o700
        assert mode(paths.lock) == 0o600
        assert mode(paths.ledger) == 0o600
        assert mode(a.lease_path) == 0o600
    finally:
        a.leave()


@pytest.mark.parametrize("bits", [0o777, 0o770, 0o722, 0o1777])
def test_a_directory_writable_by_others_is_refused_with_the_chmod_to_run(
    shared: Path, bits: int
) -> None:
    gdir = shared / "g"
    gdir.mkdir()
    gdir.chmod(bits)
    err = refused(["--group", str(gdir), "64MiB"], "KVP540")
    assert "chmod" in err and "writable by other users" in err
    with pytest.raises(KVPlanError) as caught:
        GroupMember.join(gdir, "a", floor=0, ceiling=1, budget=MiB)
    assert code_of(caught) == "KVP540"
    assert os.listdir(gdir) == []


def test_a_directory_of_another_user_is_refused(shared: Path) -> None:
    assert os.geteuid() == 0, "CI runs as root: this test chowns to nobody"
    gdir = shared / "g"
    gdir.mkdir()
    os.chown(gdir, 65534, 65534)
    err = refused(["--group", str(gdir), "64MiB"], "KVP540")
    assert "owned by uid 65534" in err
    assert os.listdir(gdir) == []


def test_a_parent_writable_by_others_is_refused_unless_sticky(shared: Path) -> None:
    open_dir = shared / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    err = refused(["--group", str(open_dir / "g"), "64MiB"], "KVP540")
    assert "above the group directory" in err and not (open_dir / "g").exists()
    open_dir.chmod(0o1777)  # sticky: nobody can rename another user's entry there
    exit_code, _, err = limit("--group", str(open_dir / "g"), "64MiB")
    assert exit_code == 0, err


@pytest.mark.parametrize("kind", ["link to a victim", "dangling link", "link loop"])
def test_a_group_path_that_is_a_symlink_is_never_followed(shared: Path, kind: str) -> None:
    sticky = shared / "shm"
    sticky.mkdir()
    sticky.chmod(0o1777)
    victim = shared / "victim"
    victim.mkdir()
    gdir = sticky / "g"
    if kind == "link to a victim":
        gdir.symlink_to(victim)
    elif kind == "dangling link":
        gdir.symlink_to(shared / "missing")
    else:
        (sticky / "h").symlink_to(gdir)
        gdir.symlink_to(sticky / "h")
    err = refused(["--group", str(gdir), "1GiB"], "KVP540")
    assert "symbolic link" in err and "File exists" not in err
    for call in (
        lambda: GroupMember.join(gdir, "a", floor=0, ceiling=1, budget=MiB),
        lambda: read_snapshot(gdir),
        lambda: attach(gdir, "a"),
    ):
        with pytest.raises(KVPlanError) as caught:
            call()
        assert code_of(caught) == "KVP540"
    assert os.listdir(victim) == [] and not (shared / "missing").exists()


def test_a_lock_or_members_open_to_others_is_refused(shared: Path) -> None:
    gdir = shared / "g"
    set_budget(gdir, 64 * MiB, create=True)
    paths = GroupPaths(gdir)
    paths.lock.chmod(0o644)  # as kvplan before 0.x made it: any user could flock it
    err = refused(["--group", str(gdir), "32MiB"], "KVP540")
    assert "chmod 0600" in err
    paths.lock.chmod(0o600)
    paths.members.chmod(0o755)
    with pytest.raises(KVPlanError) as caught:
        GroupMember.join(gdir, "a", floor=0, ceiling=1)
    assert code_of(caught) == "KVP540" and "members directory" in str(caught.value)


_AS_NOBODY = r"""
import fcntl, os, sys
sys.path.insert(0, sys.argv[1])
lock, lease = sys.argv[2], sys.argv[3]
took = []
for path, how in ((lock, fcntl.LOCK_EX), (lease, fcntl.LOCK_SH)):
    try:
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        took.append(path)
    except OSError:
        pass
from kvplan.elastic.group import GroupMember, set_budget
from kvplan.schemas.errors import KVPlanError
for call in (lambda: set_budget(sys.argv[4], 1 << 20),
             lambda: GroupMember.join(sys.argv[4], "evil", floor=0, ceiling=1)):
    try:
        call()
        took.append("an operation")
    except KVPlanError as exc:
        print(exc.diagnostics[0].code.value)
print("TOOK", took)
"""


def test_another_uid_can_neither_lock_nor_lease_nor_skew_the_group(shared: Path) -> None:
    """As ``nobody`` (a real second uid): no flock on group.lock or a lease, no budget, no
    join; the members go on. Needs root (CI runs the suite as root)."""
    assert os.geteuid() == 0, "run as root (CI does): the test switches to uid nobody"
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run a command as another uid"
    gdir = shared / "g"
    set_budget(gdir, 64 * MiB, create=True)
    gdir.chmod(0o755)  # others may enter: only the files' own modes stop them
    a = GroupMember.join(gdir, "a", floor=MiB, ceiling=64 * MiB)
    try:
        assert a.request(8 * MiB)
        out = subprocess.run(
            [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups",
             sys.executable, "-c", _AS_NOBODY, str(SRC), str(GroupPaths(gdir).lock),
             str(a.lease_path), str(gdir)],
            capture_output=True, text=True, timeout=60, cwd="/",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "TOOK []" in out.stdout, out.stdout
        assert out.stdout.split()[:2] == ["KVP540", "KVP540"], out.stdout
        a.tick(force=True)
        assert a.request(16 * MiB)  # nothing stopped the group
        assert read_snapshot(gdir).budget_bytes == 64 * MiB
    finally:
        a.leave()


# -- a group knows it exists ----------------------------------------------------------


def test_a_removed_ledger_under_a_live_member_is_never_reset(tmp_path: Path) -> None:
    gdir = tmp_path / "g"
    set_budget(gdir, 64 * MiB, create=True)
    a = GroupMember.join(gdir, "a", floor=MiB, ceiling=64 * MiB)
    assert a.request(8 * MiB)
    GroupPaths(gdir).ledger.unlink()
    err = refused(["--group", str(gdir), "1GiB"], "KVP541")
    assert "forget live members" in err
    with pytest.raises(KVPlanError) as caught:
        GroupMember.join(gdir, "b", floor=0, ceiling=1, budget=MiB)
    assert code_of(caught) == "KVP541"
    assert not GroupPaths(gdir).ledger.exists()  # nothing was re-created
    with pytest.raises(KVPlanError) as caught:
        a.request(32 * MiB)  # the member itself: refused, not reset
    assert code_of(caught) == "KVP541"
    a.close_descriptors()  # the member stops: its lease is free
    exit_code, _, err = limit("--group", str(gdir), "1GiB")
    assert exit_code == 0, err  # now nothing is forgotten: the group is made again
    assert read_snapshot(gdir).members == []


def test_a_removed_lock_file_is_detected_by_its_members_and_not_recreated(
    tmp_path: Path,
) -> None:
    gdir = tmp_path / "g"
    set_budget(gdir, 64 * MiB, create=True)
    a = GroupMember.join(gdir, "a", floor=MiB, ceiling=64 * MiB)
    GroupPaths(gdir).lock.unlink()
    refused(["--group", str(gdir), "1GiB"], "KVP541")  # a live lease: no new lock inode
    assert not GroupPaths(gdir).lock.exists()
    with pytest.raises(KVPlanError) as caught:
        a.request(32 * MiB)  # it holds the old inode: it says so instead of going on alone
    assert code_of(caught) == "KVP540" and "removed or replaced" in str(caught.value)
    a.close_descriptors()
    exit_code, _, err = limit("--group", str(gdir), "1GiB")
    assert exit_code == 0, err


def test_a_replaced_lock_file_is_detected(tmp_path: Path) -> None:
    gdir = tmp_path / "g"
    set_budget(gdir, 64 * MiB, create=True)
    a = GroupMember.join(gdir, "a", floor=MiB, ceiling=64 * MiB)
    try:
        lock = GroupPaths(gdir).lock
        fresh = gdir / "other.lock"
        fresh.write_text("")
        fresh.chmod(0o600)
        fresh.replace(lock)
        with pytest.raises(KVPlanError) as caught:
            a.request(32 * MiB)
        assert code_of(caught) == "KVP540"
    finally:
        a.close_descriptors()


def test_a_lease_removed_under_a_live_member_is_not_reaped(tmp_path: Path) -> None:
    gdir = tmp_path / "g"
    set_budget(gdir, 64 * MiB, create=True)
    a = GroupMember.join(gdir, "a", floor=MiB, ceiling=64 * MiB)
    b = GroupMember.join(gdir, "b", floor=MiB, ceiling=64 * MiB)
    try:
        assert a.request(40 * MiB)
        a.lease_path.unlink()
        assert not b.request(64 * MiB)  # b's reaping keeps a: its process runs
        assert {m.name: m.granted_bytes for m in read_snapshot(gdir).members}["a"] >= 40 * MiB
        assert {m.name: m.liveness for m in read_snapshot(gdir).members}["a"] == "alive"
        a.tick(force=True)  # a makes a new lease file and records it
        assert a.lease_path.is_file()
        assert a.request(48 * MiB) or a.granted >= 40 * MiB  # no KVP545
        attach(gdir, "a").close()  # a worker attaches to the new lease
    finally:
        a.leave()
        b.leave()


def test_a_dead_member_whose_lease_was_removed_is_reaped(tmp_path: Path) -> None:
    gdir = tmp_path / "g"
    set_budget(gdir, 64 * MiB, create=True)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from kvplan.elastic.group import GroupMember\n"
        "m = GroupMember.join(sys.argv[2], 'dead', floor=1 << 20, ceiling=64 << 20)\n"
        "assert m.request(40 << 20)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(SRC), str(gdir)], check=True, timeout=60)
    for lease in GroupPaths(gdir).members.iterdir():
        lease.unlink()
    b = GroupMember.join(gdir, "b", floor=MiB, ceiling=64 * MiB)
    try:
        assert b.request(64 * MiB)  # the dead member's pid runs no more: reaped
        assert [m.name for m in read_snapshot(gdir).members] == ["b"]
    finally:
        b.leave()


# -- limit DIR against limit --group DIR ----------------------------------------------


@pytest.mark.parametrize("marker", ["group.lock", "ledger.json", "both"])
def test_a_marker_file_does_not_make_a_dump_directory_a_group(tmp_path: Path, marker: str) -> None:
    for name in ("group.lock", "ledger.json") if marker == "both" else (marker,):
        (tmp_path / name).write_text("")
    write_stats(tmp_path, make_stats(time=time.time()))  # an engine dumps there
    exit_code, out, err = limit(str(tmp_path), "24GiB")
    assert exit_code == 0, err
    assert "wrote" in out and "group" not in out
    assert json.loads((tmp_path / "limit.json").read_text())["limit_bytes"] == 24 << 30
    assert not (tmp_path / "members").exists()


def test_a_real_group_is_still_a_group_without_the_flag(tmp_path: Path) -> None:
    gdir = tmp_path / "g"
    set_budget(gdir, 64 * MiB, create=True)
    exit_code, out, err = limit(str(gdir), "32MiB")
    assert exit_code == 0 and "budget now 32.00 MiB" in out, err
    assert not (gdir / "limit.json").exists()


def test_an_empty_directory_argument_is_refused(tmp_path: Path) -> None:
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        for args in (["--group", "", "1GiB"], ["", "1GiB"], ["  ", "1GiB"]):
            refused(args, "KVP419")
        assert os.listdir(tmp_path) == []
    finally:
        os.chdir(here)
    with pytest.raises(KVPlanError) as caught:
        set_budget("", MiB, create=True)
    assert code_of(caught) == "KVP540"


# -- bounds ---------------------------------------------------------------------------


def _edit_ledger(gdir: Path, **fields: object) -> None:
    path = GroupPaths(gdir).ledger
    data = json.loads(path.read_text())
    for key, value in fields.items():
        if key.startswith("member_"):
            data["members"][0][key.removeprefix("member_")] = value
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def test_a_ledger_at_the_largest_revision_wraps_for_every_writer(tmp_path: Path) -> None:
    gdir = tmp_path / "g"
    set_budget(gdir, 64 * MiB, create=True)
    _edit_ledger(gdir, revision=1 << 62)
    exit_code, _, err = limit("--group", str(gdir), "32MiB")
    assert exit_code == 0, err
    ledger = read_ledger(GroupPaths(gdir))
    assert ledger is not None and ledger.revision == 0
    _edit_ledger(gdir, revision=1 << 62)
    a = GroupMember.join(gdir, "a", floor=MiB, ceiling=64 * MiB, guarantee=2 * MiB)
    b = GroupMember.join(gdir, "b", floor=MiB, ceiling=64 * MiB, guarantee=16 * MiB)
    try:
        assert a.request(31 * MiB)
        _edit_ledger(gdir, revision=1 << 62)
        assert not b.request(16 * MiB)  # a claim at the wrapped revision (claim_seq bound)
        a.tick(force=True)
        a.release(0)
        b.tick(force=True)
        assert b.request(16 * MiB)
    finally:
        a.leave()
        b.leave()


def test_no_public_call_raises_a_raw_validation_error(tmp_path: Path) -> None:
    gdir = tmp_path / "g"
    set_budget(gdir, 64 * MiB, create=True)
    for call in (
        lambda: GroupMember.join(gdir, "a", floor=1.5, ceiling=MiB),  # type: ignore[arg-type]
        lambda: GroupMember.join(gdir, "a", floor=0, ceiling=True),
        lambda: GroupMember.join(gdir, "a", floor=0, ceiling=MAX_BYTES + 1),
        lambda: GroupMember.join(gdir, "a", floor=0, ceiling=1, factor=2.0),  # type: ignore[arg-type]
        lambda: set_budget(gdir, 1.5),  # type: ignore[arg-type]
        lambda: set_budget(gdir, -1),
    ):
        with pytest.raises(KVPlanError) as caught:
            call()
        assert code_of(caught) == "KVP547"
    assert read_snapshot(gdir).members == []


# -- minor ----------------------------------------------------------------------------


def test_a_ledger_with_a_bom_is_refused(tmp_path: Path) -> None:
    gdir = tmp_path / "g"
    set_budget(gdir, 64 * MiB, create=True)
    path = GroupPaths(gdir).ledger
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    before = path.read_bytes()
    err = refused(["--group", str(gdir), "32MiB"], "KVP541")
    assert "BOM" in err and path.read_bytes() == before


def test_a_refused_group_leaves_no_members_directory(tmp_path: Path) -> None:
    gdir = tmp_path / "g"
    gdir.mkdir()
    (gdir / "group.lock").symlink_to(tmp_path / "x")
    refused(["--group", str(gdir), "1GiB"], "KVP540")
    with pytest.raises(KVPlanError):
        GroupMember.join(gdir, "a", floor=0, ceiling=1, budget=MiB)
    assert sorted(os.listdir(gdir)) == ["group.lock"] and not (tmp_path / "x").exists()
