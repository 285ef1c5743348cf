"""A group directory: joining, grants, claims and give-back between members, live budget and
guarantee changes, the snapshot for ``kvplan top``, and every way the group can be
unreachable or hostile (coded, bounded, never a traceback)."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path

import pytest

from kvplan.elastic import group
from kvplan.elastic.group import (
    GroupMember,
    GroupPaths,
    read_ledger,
    read_snapshot,
    set_budget,
    set_guarantee,
)
from kvplan.schemas.errors import KVPlanError

MiB = 1 << 20
BUDGET = 64 * MiB


def code_of(excinfo: pytest.ExceptionInfo[KVPlanError]) -> str:
    return excinfo.value.code.value


def join(directory: Path, name: str, **kw: int) -> GroupMember:
    kw.setdefault("floor", MiB)
    kw.setdefault("ceiling", BUDGET)
    member = GroupMember.join(directory, name, **kw)  # type: ignore[arg-type]
    member.hold_seconds = 0.0
    return member


@pytest.fixture
def gdir(tmp_path: Path) -> Path:
    set_budget(tmp_path, BUDGET, create=True)
    return tmp_path


def test_a_grant_grows_by_a_quantum_and_requests_within_it_do_no_io(gdir: Path) -> None:
    a = join(gdir, "a")
    assert a.quantum == BUDGET // 64
    assert a.request(10)
    assert a.granted == BUDGET // 64 and a.effective_limit == a.granted
    ops = a.group_ops
    for need in range(0, a.granted + 1, 4096):
        assert a.request(need)
    assert a.group_ops == ops  # within the grant: no lock, no file
    assert a.request(a.granted + 1)
    assert a.granted == 2 * BUDGET // 64 and a.group_ops == ops + 1
    a.leave()


def test_release_keeps_a_quantum_of_slack_and_gives_back_past_two(gdir: Path) -> None:
    a = join(gdir, "a")
    assert a.request(20 * MiB)
    ops = a.group_ops
    assert a.release(19 * MiB) == 0 and a.group_ops == ops  # within 2 quanta: no I/O
    freed = a.release(2 * MiB)
    assert freed == 20 * MiB - (2 * MiB + a.quantum)
    assert a.granted == 2 * MiB + a.quantum
    a.hold_seconds = 3600.0
    assert a.request(30 * MiB)
    assert a.release(0) == 0  # it just grew: kept for the hold time
    a.leave()


def test_a_claim_makes_the_borrower_give_back_at_its_next_tick(gdir: Path) -> None:
    a = join(gdir, "a", guarantee=16 * MiB)
    b = join(gdir, "b", guarantee=32 * MiB)
    assert a.request(56 * MiB)  # a borrows b's unused guarantee
    assert not b.request(24 * MiB)  # 8 MiB free: b takes them and claims 16 MiB
    assert (b.granted, b.claim) == (8 * MiB, 16 * MiB)
    assert a.tick(force=True)  # a sees the claim at its next tick
    assert a.effective_limit == 40 * MiB  # 16 MiB owed, never below its guarantee
    assert not a.request(57 * MiB)  # no borrowing while b claims
    assert a.release(40 * MiB) == 16 * MiB
    assert b.tick(force=True)
    assert (b.granted, b.claim) == (24 * MiB, 0)
    assert b.request(24 * MiB)
    snap = read_snapshot(gdir)
    assert snap.claimed_bytes == 0 and snap.granted_bytes == 64 * MiB
    a.leave()
    b.leave()


def test_budget_and_guarantee_change_live(gdir: Path) -> None:
    a = join(gdir, "a", guarantee=8 * MiB)
    b = join(gdir, "b", guarantee=8 * MiB)
    assert a.request(40 * MiB)
    with pytest.raises(KVPlanError) as caught:
        set_budget(gdir, 15 * MiB)
    assert code_of(caught) == "KVP542"
    assert "below Σ guarantees 16777216 bytes" in str(caught.value)
    snap = set_budget(gdir, 32 * MiB)
    assert snap.budget_bytes == 32 * MiB and snap.owed_bytes == 8 * MiB
    assert a.tick(force=True) and a.effective_limit == 32 * MiB
    assert not b.request(MiB + 1)  # nothing grows while the grants exceed the budget
    with pytest.raises(KVPlanError) as caught:
        set_guarantee(gdir, "b", 30 * MiB)
    assert code_of(caught) == "KVP542"
    with pytest.raises(KVPlanError) as caught:
        set_guarantee(gdir, "b", MiB - 1)
    assert code_of(caught) == "KVP547" and "below its floor" in str(caught.value)
    # a name that is not a member now: kept for its join (no floor to check yet)
    assert set_guarantee(gdir, "nobody", MiB).kept_guarantees == {"nobody": MiB}
    with pytest.raises(KVPlanError) as caught:
        set_guarantee(gdir, "no body", MiB)
    assert code_of(caught) == "KVP547"
    snap = set_guarantee(gdir, "b", 16 * MiB)
    assert {m.name: m.guarantee_bytes for m in snap.members}["b"] == 16 * MiB
    a.leave()
    b.leave()


def test_the_snapshot_is_json_and_names_every_figure(gdir: Path) -> None:
    a = join(gdir, "a", guarantee=4 * MiB, factor=2)
    assert a.request(10 * MiB)
    data = json.loads(read_snapshot(gdir).model_dump_json())
    assert data["kind"] == "kvplan-group-snapshot" and data["budget_bytes"] == BUDGET
    (m,) = data["members"]
    assert m["charged_bytes"] == 2 * m["granted_bytes"] and m["liveness"] == "alive"
    assert data["guaranteed_bytes"] == 8 * MiB
    assert data["borrowed_bytes"] == 2 * (m["granted_bytes"] - 4 * MiB)
    a.leave()
    assert read_snapshot(gdir).members == []


def test_joining_refuses_what_does_not_fit(tmp_path: Path) -> None:
    with pytest.raises(KVPlanError) as caught:
        GroupMember.join(tmp_path, "a", floor=MiB, ceiling=BUDGET)
    assert code_of(caught) == "KVP544"
    a = GroupMember.join(tmp_path, "a", floor=MiB, guarantee=40 * MiB, ceiling=BUDGET,
                         budget=BUDGET)  # fmt: skip
    assert a.created
    with pytest.raises(KVPlanError) as caught:
        GroupMember.join(tmp_path, "b", floor=12 * MiB, guarantee=30 * MiB, ceiling=BUDGET,
                         factor=1)  # fmt: skip
    assert code_of(caught) == "KVP542"
    text = str(caught.value)
    assert "Σ guarantees 73400320 bytes" in text and "budget 67108864 bytes" in text
    assert "this member's 31457280 bytes" in text
    with pytest.raises(KVPlanError) as caught:
        GroupMember.join(tmp_path, "a", floor=MiB, ceiling=BUDGET)
    assert code_of(caught) == "KVP543" and "already named a" in str(caught.value)
    for bad in ("", "-x", "a/b", "a\nb", "x" * 200):
        with pytest.raises(KVPlanError) as caught:
            GroupMember.join(tmp_path, bad, floor=MiB, ceiling=BUDGET)
        assert code_of(caught) == "KVP543"
    with pytest.raises(KVPlanError) as caught:
        GroupMember.join(tmp_path, "c", floor=MiB, ceiling=BUDGET, factor=0)
    assert code_of(caught) == "KVP547"
    b = GroupMember.join(tmp_path, "b", floor=MiB, ceiling=BUDGET, budget=1)
    assert not b.created and b.budget == BUDGET  # a budget only creates a group
    # the refused joiners left nothing behind
    leases = sorted(os.listdir(GroupPaths(tmp_path).members))
    assert leases == sorted(f"{m.lease_id}.lease" for m in (a, b))
    a.leave()
    b.leave()


def test_acquire_gives_up_with_a_code_after_its_timeout(gdir: Path) -> None:
    a = join(gdir, "a")
    assert a.request(BUDGET)
    b = join(gdir, "b")
    with pytest.raises(KVPlanError) as caught:
        b.acquire(2 * MiB, timeout=0.2)
    assert code_of(caught) == "KVP546"
    a.leave()
    b.acquire(2 * MiB, timeout=5)
    b.leave()


def test_descriptors_are_close_on_exec(gdir: Path) -> None:
    a = join(gdir, "a")
    for fd in (a._lease.fd, a._lock.fd):
        assert fd is not None and fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    a.leave()


# -- unreachable and hostile -------------------------------------------------------------------


def test_a_missing_or_wrong_directory_is_unreachable(tmp_path: Path) -> None:
    for where in (tmp_path / "nope", tmp_path / "file"):
        if where.name == "file":
            where.write_text("x")
        calls = [
            lambda w=where: GroupMember.join(w, "a", floor=0, ceiling=1, budget=1),
            lambda w=where: read_snapshot(w),
            lambda w=where: set_budget(w, 1),
        ]
        if where.name == "file":
            calls.append(lambda w=where: set_budget(w, 1, create=True))
        for call in calls:
            with pytest.raises(KVPlanError) as caught:
                call()
            assert code_of(caught) == "KVP540"
    # a budget with create makes a missing directory, 0700 (the group files' own mode)
    set_budget(tmp_path / "nope", 1, create=True)
    assert stat.S_IMODE(os.stat(tmp_path / "nope").st_mode) == 0o700
    with pytest.raises(KVPlanError) as caught:
        read_snapshot(tmp_path)  # a directory that no engine has joined
    assert code_of(caught) == "KVP540" and "not a kvplan group" in str(caught.value)


def test_a_wedged_lock_holder_makes_every_operation_fail_in_bounded_time(gdir: Path) -> None:
    a = join(gdir, "a")
    assert a.request(MiB)
    fd = os.open(GroupPaths(gdir).lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: conflicts
    try:
        # readers take no lock: the snapshot and a worker's attach go on
        assert [m.name for m in read_snapshot(gdir).members] == ["a"]
        group.attach(gdir, "a").close()
        for call in (
            lambda: set_budget(gdir, BUDGET, timeout=0.1),
            lambda: GroupMember.join(gdir, "b", floor=0, ceiling=1, timeout=0.1),
        ):
            with pytest.raises(KVPlanError) as caught:
                call()
            assert code_of(caught) == "KVP540" and "more than 0.1 s" in str(caught.value)
        a.lock_timeout = 0.1
        with pytest.raises(KVPlanError) as caught:
            a.request(BUDGET)
        assert code_of(caught) == "KVP540"
    finally:
        os.close(fd)
    a.lock_timeout = 5
    assert a.request(BUDGET)
    a.leave()


def _valid_ledger(gdir: Path) -> str:
    a = join(gdir, "a", guarantee=4 * MiB)
    a.request(8 * MiB)
    text = GroupPaths(gdir).ledger.read_text()
    a.close_descriptors()
    return text


HOSTILE_TEXTS = {
    "truncated": lambda t: t[: len(t) // 2],
    "empty": lambda t: "",
    "not json": lambda t: "budget: 5\n",
    "a list": lambda t: "[1, 2]",
    "other kind": lambda t: t.replace("kvplan-group-ledger", "kvplan-elastic-limit"),
    "version 2": lambda t: t.replace('"version": 1', '"version": 2'),
    "huge number": lambda t: t.replace('"budget_bytes": 67108864', '"budget_bytes": 1' + "0" * 40),
    "above 1 EiB": lambda t: t.replace('"budget_bytes": 67108864', f'"budget_bytes": {1 << 61}'),
    "negative": lambda t: t.replace('"budget_bytes": 67108864', '"budget_bytes": -1'),
    "string": lambda t: t.replace('"budget_bytes": 67108864', '"budget_bytes": "64MiB"'),
    "bool": lambda t: t.replace('"factor": 1', '"factor": true'),
    "float": lambda t: t.replace('"factor": 1', '"factor": 1.5'),
    "nan": lambda t: t.replace('"factor": 1', '"factor": NaN'),
    "extra field": lambda t: t.replace('"revision"', '"owner": "x", "revision"'),
    "duplicate key": lambda t: t.replace('"revision"', '"budget_bytes": 1, "revision"'),
    "control char": lambda t: t.replace('"name": "a"', '"name": "a\x1b[31m"'),
    "bad lease id": lambda t: t.replace('"lease": "', '"lease": "../../etc/'),
    "guarantees over budget": lambda t: t.replace('"budget_bytes": 67108864', '"budget_bytes": 4'),
    "granted past ceiling": lambda t: t.replace('"ceiling_bytes": 67108864', '"ceiling_bytes": 5'),
    "two members one name": lambda t: _twice(t),
    "utf-16": lambda t: t.encode("utf-16").decode("latin-1"),
}


def _twice(text: str) -> str:
    data = json.loads(text)
    data["members"].append(dict(data["members"][0], lease="f" * 32))
    return json.dumps(data)


@pytest.mark.parametrize("name", list(HOSTILE_TEXTS))
def test_a_torn_or_hostile_ledger_is_coded_everywhere(gdir: Path, name: str) -> None:
    text = _valid_ledger(gdir)
    path = GroupPaths(gdir).ledger
    mutated = HOSTILE_TEXTS[name](text)
    path.write_bytes(mutated.encode("latin-1") if name == "utf-16" else mutated.encode())
    for call in (
        lambda: read_ledger(GroupPaths(gdir)),
        lambda: read_snapshot(gdir),
        lambda: set_budget(gdir, BUDGET),
        lambda: GroupMember.join(gdir, "b", floor=0, ceiling=1),
    ):
        with pytest.raises(KVPlanError) as caught:
            call()
        assert code_of(caught) == "KVP541", name
        assert "\x1b" not in str(caught.value)


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo", "directory", "huge"])
def test_a_ledger_that_is_not_a_small_regular_file_is_refused_without_blocking(
    gdir: Path, kind: str
) -> None:
    text = _valid_ledger(gdir)
    paths = GroupPaths(gdir)
    paths.ledger.unlink()
    if kind == "symlink":
        target = gdir / "elsewhere.json"
        target.write_text(text)
        paths.ledger.symlink_to(target)
    elif kind == "dangling symlink":
        paths.ledger.symlink_to(gdir / "missing.json")
    elif kind == "fifo":
        os.mkfifo(paths.ledger)
    elif kind == "directory":
        paths.ledger.mkdir()
    else:
        paths.ledger.write_text(text + " " * (group.MAX_LEDGER_BYTES + 1))
    for call in (
        lambda: read_snapshot(gdir),
        lambda: GroupMember.join(gdir, "b", floor=0, ceiling=1, budget=BUDGET),
        lambda: set_budget(gdir, BUDGET, create=True),
    ):
        with pytest.raises(KVPlanError) as caught:
            call()
        assert code_of(caught) == "KVP541", kind
    if kind == "symlink":
        assert (gdir / "elsewhere.json").read_text() == text  # never written through


@pytest.mark.parametrize("kind", ["replaced", "symlink", "fifo"])
def test_a_tampered_lease_is_coded_not_taken_for_dead(gdir: Path, kind: str) -> None:
    a = join(gdir, "a")
    assert a.request(8 * MiB)
    path = a.lease_path
    path.unlink()
    if kind == "replaced":
        path.write_text("")
    elif kind == "symlink":
        path.symlink_to(gdir / "ledger.json")
    else:
        os.mkfifo(path)
    with pytest.raises(KVPlanError) as caught:
        GroupMember.join(gdir, "b", floor=0, ceiling=1)
    assert code_of(caught) == "KVP545"
    assert {m.name: m.liveness for m in read_snapshot(gdir).members}["a"] == "tampered"
    with pytest.raises(KVPlanError) as caught:
        a.request(BUDGET)  # the member itself: its lease is not the file it locked
    assert code_of(caught) == "KVP545"
    path.unlink()  # the operator removes it: the member's process runs, so it is not reaped
    c = join(gdir, "c")
    assert not c.request(BUDGET)  # a keeps its 8 MiB
    a.tick(force=True)  # a makes a new lease file and goes on
    assert a.lease_path.is_file()
    a.leave()
    assert c.request(BUDGET)
    c.leave()


def test_a_lock_file_that_is_a_symlink_or_fifo_is_unreachable(tmp_path: Path) -> None:
    for kind in ("symlink", "fifo"):
        d = tmp_path / kind
        d.mkdir()
        if kind == "symlink":
            (d / "group.lock").symlink_to(tmp_path / "x")
        else:
            os.mkfifo(d / "group.lock")
        with pytest.raises(KVPlanError) as caught:
            GroupMember.join(d, "a", floor=0, ceiling=1, budget=5)
        assert code_of(caught) == "KVP540"
        assert not (tmp_path / "x").exists()


def test_a_member_removed_from_the_ledger_learns_it_and_must_not_map(gdir: Path) -> None:
    a = join(gdir, "a")
    assert a.request(MiB)
    paths = GroupPaths(gdir)
    ledger = read_ledger(paths)
    assert ledger is not None
    group.write_ledger(paths, ledger.model_copy(update={"members": []}))
    with pytest.raises(KVPlanError) as caught:
        a.tick(force=True)
    assert code_of(caught) == "KVP545"
    with pytest.raises(KVPlanError) as caught:
        a.request(BUDGET)
    assert code_of(caught) == "KVP545"


def _replace(path: Path) -> None:
    """A new file in place of ``path`` (atomically: a new inode at the same name)."""
    other = path.with_name(path.name + ".new")
    other.write_text("")
    os.replace(other, path)


def test_a_replaced_lease_is_seen_at_the_next_look_with_the_ledger_unchanged(gdir: Path) -> None:
    """The ledger says nothing changed, but the lease file is not the one the member locked:
    its tick and its check (what a failed engine retries) both say ``KVP545`` -- a look that
    only read the ledger would say the group can be reached, and the engine would flap."""
    a = join(gdir, "a")
    assert a.request(MiB)
    a.tick(force=True)
    assert not a.changed()
    _replace(a.lease_path)
    for look in (lambda: a.tick(force=True), a.check):
        with pytest.raises(KVPlanError) as caught:
            look()
        assert code_of(caught) == "KVP545"


def test_a_removed_lease_is_made_again_at_the_next_look(gdir: Path) -> None:
    a = join(gdir, "a")
    assert a.request(MiB)
    a.lease_path.unlink()
    a.tick(force=True)
    assert a.lease_path.is_file()
    a.check()
    assert {m.name: m.liveness for m in read_snapshot(gdir).members}["a"] == "alive"


def test_the_group_and_the_index_need_neither_torch_nor_vllm() -> None:
    import subprocess
    import sys

    code = (
        "import sys, kvplan.elastic.group, kvplan.elastic.grants, kvplan.elastic.admission\n"
        "bad = [m for m in ('torch', 'vllm') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    src = str(Path(group.__file__).parents[2])
    env = dict(os.environ, PYTHONPATH=src)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
