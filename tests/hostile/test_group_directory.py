"""Generated hostile group directories (issue 28): owners, modes, symbolic links, removed
files, planted markers and numeric bounds, each crossed with every entry point that takes a
group (``kvplan limit --group`` and ``--member``, ``kvplan top``, ``GroupMember.join``,
``read_snapshot``, ``attach``, ``set_budget``).

Every case is refused with its stable code (one paragraph, exit 2, no traceback, bounded in
time), leaves a victim directory untouched and the group's files as they were — or, for the
bounds, is accepted and written back."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness._stats import make_stats
from kvplan.elastic.files import write_stats
from kvplan.elastic.group import (
    GroupMember,
    GroupPaths,
    attach,
    read_ledger,
    read_snapshot,
    set_budget,
)
from kvplan.schemas.errors import KVPlanError
from tests.hostile._attacks import IS_ROOT
from tests.hostile._harness import assert_no_bug, assert_refused, deadline, digest, invoke

MiB = 1 << 20
NOBODY = 65534


@dataclass
class Place:
    """A scratch area every user can enter: ``base`` (0755), a sticky ``shm`` (1777), a
    ``victim`` directory nothing may write into, and the ``live`` members to stop after."""

    base: Path
    live: list[GroupMember]

    @property
    def shm(self) -> Path:
        return self.base / "shm"

    @property
    def victim(self) -> Path:
        return self.base / "victim"

    def group(self) -> Path:
        gdir = self.base / "g"
        set_budget(gdir, 64 * MiB, create=True)
        return gdir

    def member(self, gdir: Path, name: str = "a") -> GroupMember:
        m = GroupMember.join(gdir, name, floor=MiB, ceiling=64 * MiB)
        assert m.request(4 * MiB)
        self.live.append(m)
        return m


def _chmod(bits: int) -> Callable[[Place], Path]:
    def make(p: Place) -> Path:
        gdir = p.group()
        gdir.chmod(bits)
        return gdir

    return make


def _chown(which: str) -> Callable[[Place], Path]:
    def make(p: Place) -> Path:
        gdir = p.group()
        target = {"dir": gdir, "lock": GroupPaths(gdir).lock, "members": GroupPaths(gdir).members}
        os.chown(target[which], NOBODY, NOBODY)
        return gdir

    return make


def _file_mode(which: str, bits: int) -> Callable[[Place], Path]:
    def make(p: Place) -> Path:
        gdir = p.group()
        paths = GroupPaths(gdir)
        {"lock": paths.lock, "members": paths.members}[which].chmod(bits)
        return gdir

    return make


def _link(kind: str) -> Callable[[Place], Path]:
    def make(p: Place) -> Path:
        gdir = p.shm / "g"
        if kind == "victim":
            gdir.symlink_to(p.victim)
        elif kind == "dangling":
            gdir.symlink_to(p.base / "missing")
        else:
            (p.shm / "h").symlink_to(gdir)
            gdir.symlink_to(p.shm / "h")
        return gdir

    return make


def _open_parent(p: Place) -> Path:
    parent = p.base / "open"
    parent.mkdir()
    parent.chmod(0o777)
    return parent / "g"


def _link_on_the_way(p: Place) -> Path:
    (p.shm / "via").symlink_to(p.victim)  # /shm/via -> victim (not ours to write)
    os.chown(p.victim, NOBODY, NOBODY)
    return p.shm / "via" / "g"


def _lock_link(p: Place) -> Path:
    gdir = p.base / "g"
    gdir.mkdir(mode=0o700)
    (gdir / "group.lock").symlink_to(p.victim / "x")
    return gdir


def _removed(which: str) -> Callable[[Place], Path]:
    def make(p: Place) -> Path:
        gdir = p.group()
        p.member(gdir)
        getattr(GroupPaths(gdir), which).unlink()
        return gdir

    return make


def _bom(p: Place) -> Path:
    gdir = p.group()
    ledger = GroupPaths(gdir).ledger
    ledger.write_bytes(b"\xef\xbb\xbf" + ledger.read_bytes())
    return gdir


@dataclass(frozen=True)
class Hostile:
    make: Callable[[Place], Path]
    code: str
    """The code ``kvplan limit --group DIR SIZE`` refuses with."""
    root_only: bool = False


HOSTILE_GROUP_DIRECTORIES: dict[str, Hostile] = {
    "directory 0777": Hostile(_chmod(0o777), "KVP540"),
    "directory 0770 (group-writable)": Hostile(_chmod(0o770), "KVP540"),
    "directory 1777 (sticky, world-writable)": Hostile(_chmod(0o1777), "KVP540"),
    "directory owned by nobody": Hostile(_chown("dir"), "KVP540", root_only=True),
    "lock owned by nobody": Hostile(_chown("lock"), "KVP540", root_only=True),
    "members owned by nobody": Hostile(_chown("members"), "KVP540", root_only=True),
    "lock 0644 (any user can flock it)": Hostile(_file_mode("lock", 0o644), "KVP540"),
    "lock 0666": Hostile(_file_mode("lock", 0o666), "KVP540"),
    "members 0777": Hostile(_file_mode("members", 0o777), "KVP540"),
    "members 0755": Hostile(_file_mode("members", 0o755), "KVP540"),
    "link to a victim in a sticky dir": Hostile(_link("victim"), "KVP540"),
    "dangling link": Hostile(_link("dangling"), "KVP540"),
    "link loop": Hostile(_link("loop"), "KVP540"),
    "parent writable by others": Hostile(_open_parent, "KVP540"),
    "link on the way to another user's dir": Hostile(_link_on_the_way, "KVP540", root_only=True),
    "group.lock a link": Hostile(_lock_link, "KVP540"),
    "ledger removed under a live member": Hostile(_removed("ledger"), "KVP541"),
    "lock removed under a live member": Hostile(_removed("lock"), "KVP541"),
    "ledger with a UTF-8 BOM": Hostile(_bom, "KVP541"),
}


@pytest.fixture
def place() -> Iterator[Place]:
    base = Path(tempfile.mkdtemp(prefix="kvplan-hostile-group-"))
    base.chmod(0o755)
    (base / "shm").mkdir()
    (base / "shm").chmod(0o1777)
    (base / "victim").mkdir()
    p = Place(base, [])
    try:
        yield p
    finally:
        for m in p.live:
            m.close_descriptors()
        shutil.rmtree(base, ignore_errors=True)


def _state(gdir: Path, victim: Path) -> dict[str, object]:
    """What must not change: the victim's entries, and each group file's bytes."""
    names = ("group.lock", "ledger.json")
    out: dict[str, object] = {"victim": sorted(os.listdir(victim))}
    for name in names:
        path = gdir / name
        out[name] = digest(path) if path.is_file() and not path.is_symlink() else None
    out["members"] = os.path.lexists(gdir / "members")
    return out


ENTRY_POINTS: dict[str, Callable[[Path], object]] = {
    "join": lambda g: GroupMember.join(g, "x", floor=0, ceiling=MiB, budget=64 * MiB),
    "read_snapshot": read_snapshot,
    "attach": lambda g: attach(g, "a"),
    "set_budget": lambda g: set_budget(g, 32 * MiB, create=True),
    "set_budget (existing)": lambda g: set_budget(g, 32 * MiB),
}


@pytest.mark.parametrize("case", list(HOSTILE_GROUP_DIRECTORIES))
def test_a_hostile_group_directory_is_refused_everywhere(place: Place, case: str) -> None:
    hostile = HOSTILE_GROUP_DIRECTORIES[case]
    if hostile.root_only:
        assert IS_ROOT, "CI runs as root: this case chowns to nobody"
    gdir = hostile.make(place)
    before = _state(gdir, place.victim)
    outcome = invoke(["limit", "--group", str(gdir), "1GiB"])
    assert_refused(outcome, hostile.code, what=case)
    assert_refused(invoke(["limit", "--group", str(gdir), "--member", "a", "2MiB"]), what=case)
    assert_no_bug(invoke(["top", str(gdir), "--once"]), what=case)
    for name, call in ENTRY_POINTS.items():
        with deadline(20), pytest.raises(KVPlanError) as caught:
            call(gdir)
        code = caught.value.diagnostics[0].code.value
        assert code in ("KVP540", "KVP541", "KVP545"), f"{case} / {name}: {caught.value}"
    assert _state(gdir, place.victim) == before, case
    assert os.listdir(place.victim) == []


def test_a_planted_marker_does_not_make_a_dump_directory_a_group(place: Place) -> None:
    for marker in ("group.lock", "ledger.json"):
        dump = place.base / f"dump-{marker}"
        dump.mkdir()
        (dump / marker).write_text("")
        write_stats(dump, make_stats(time=time.time()))  # an engine dumps there
        outcome = invoke(["limit", str(dump), "24GiB"])
        assert outcome.exit_code == 0 and "wrote" in outcome.stdout, outcome.stderr
        assert json.loads((dump / "limit.json").read_text())["limit_bytes"] == 24 << 30
        assert sorted(os.listdir(dump)) == sorted([marker, "limit.json", "rank0.stats.json"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("revision", 1 << 62), ("member_claim_seq", 1 << 62), ("member_lease_inode", (1 << 63) - 1),
     ("member_pid", 1 << 32), ("member_joined_at", 1e300)],
)  # fmt: skip
def test_every_bound_the_reader_accepts_is_written_back(
    place: Place, field: str, value: object
) -> None:
    gdir = place.group()
    member = place.member(gdir)
    path = GroupPaths(gdir).ledger
    data = json.loads(path.read_text())
    if field.startswith("member_"):
        data["members"][0][field.removeprefix("member_")] = value
        if field == "member_claim_seq":
            data["members"][0]["claim_bytes"] = 0
    else:
        data[field] = value
    path.write_text(json.dumps(data))
    assert read_ledger(GroupPaths(gdir)) is not None  # the reader accepts it
    if field in ("member_lease_inode",):
        member.close_descriptors()  # its lease is not the file recorded: as a stopped member
        place.live.remove(member)
        (GroupPaths(gdir).members / f"{member.lease_id}.lease").unlink()
    outcome = invoke(["limit", "--group", str(gdir), "48MiB"])
    assert_no_bug(outcome, field)
    assert outcome.exit_code == 0, outcome.stderr
    b = GroupMember.join(gdir, "b", floor=MiB, ceiling=8 * MiB)
    place.live.append(b)
    ledger = read_ledger(GroupPaths(gdir))
    assert ledger is not None and ledger.budget_bytes == 48 * MiB
