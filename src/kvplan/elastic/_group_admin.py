"""Administering a group without being a member: the snapshot ``kvplan top`` shows and the
budget and guarantee changes ``kvplan limit`` makes (``kvplan.elastic.group`` re-exports them)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvplan.elastic import _group_files as files
from kvplan.elastic import grants
from kvplan.elastic.grants import GroupState, PolicyError
from kvplan.schemas.errors import Code, KVPlanError, show_value

# -- administration (kvplan limit, kvplan top) -----------------------------------------------


class MemberSnapshot(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    pid: int
    liveness: Literal["alive", "dead", "tampered"]
    factor: int
    floor_bytes: int
    guarantee_bytes: int
    ceiling_bytes: int
    granted_bytes: int = Field(description="the member's bytes (charged × factor)")
    charged_bytes: int
    borrowed_bytes: int = Field(description="charged bytes granted above the guarantee")
    claim_bytes: int = Field(description="bytes it waits for below its guarantee")
    owed_bytes: int = Field(description="charged bytes it must give back to claims")
    effective_limit_bytes: int = Field(description="what it must get under (its bytes)")
    joined_at: float


class GroupSnapshot(BaseModel):
    """The group as ``kvplan top`` shows it (``--json``-ready). Group figures are charged."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["kvplan-group-snapshot"] = files.SNAPSHOT_KIND
    version: Literal[1] = 1
    directory: str
    time: float
    revision: int
    budget_bytes: int
    granted_bytes: int
    free_bytes: int
    guaranteed_bytes: int
    borrowed_bytes: int
    claimed_bytes: int
    owed_bytes: int
    members: list[MemberSnapshot]
    kept_guarantees: dict[str, int] = Field(default_factory=dict)
    """Guarantees an operator set, kept by member name across restarts (live or not)."""


def snapshot_of(
    paths: files.GroupPaths, state: GroupState, liveness: dict[str, str]
) -> GroupSnapshot:
    shares = grants.owed(state)
    limits = grants.effective_limits(state)
    return GroupSnapshot(
        directory=str(paths.directory),
        time=time.time(),
        revision=state.revision,
        budget_bytes=state.budget,
        granted_bytes=state.granted(),
        free_bytes=state.free(),
        guaranteed_bytes=state.guaranteed(),
        borrowed_bytes=state.borrowed(),
        claimed_bytes=state.claimed(),
        owed_bytes=grants.need(state),
        members=[
            MemberSnapshot(
                name=m.name,
                pid=m.pid,
                liveness=liveness.get(m.name, files.Liveness.ALIVE),
                factor=m.factor,
                floor_bytes=m.floor,
                guarantee_bytes=m.guarantee,
                ceiling_bytes=m.ceiling,
                granted_bytes=m.granted,
                charged_bytes=m.charged(),
                borrowed_bytes=m.borrowed(),
                claim_bytes=m.claim,
                owed_bytes=shares.get(m.name, 0),
                effective_limit_bytes=limits[m.name],
                joined_at=m.joined_at,
            )
            for m in sorted(state.members.values(), key=lambda m: m.name)
        ],
        kept_guarantees=dict(sorted(state.kept.items())),
    )


def read_snapshot(directory: Path | str) -> GroupSnapshot:
    """The group now. Takes no lock — the ledger is replaced atomically, so a read always
    sees a whole ledger, and a writer that hangs holding the lock cannot block it. Dead
    members are shown as ``dead``, not reaped (reading needs no write access)."""
    paths = files.check_directory(directory)
    files.GroupLock(paths, create=False).close()  # a kvplan group (KVP540 otherwise)
    ledger = files.read_ledger(paths)
    if ledger is None:
        raise files.ledger_problem(paths, "is missing (no engine has joined yet).")
    state = files.to_state(ledger)
    liveness = {
        r.name: files.probe_lease(paths, r.lease, r.lease_inode, r.pid, r.joined_at)
        for r in ledger.members
    }
    return snapshot_of(paths, state, liveness)


@contextlib.contextmanager
def _admin(
    directory: Path | str, timeout: float, create_budget: int | None = None
) -> Iterator[tuple[files.GroupPaths, GroupState]]:
    creating = create_budget is not None
    paths = files.check_directory(directory, create=creating)
    lock = files.GroupLock(paths, create=creating)
    try:
        with lock.hold(timeout):
            if creating:
                files.ensure_members_dir(paths)  # after the lock: a refused group makes none
            ledger = files.read_ledger(paths)
            if ledger is None:
                if create_budget is None:
                    raise files.ledger_problem(paths, "is missing (no engine has joined yet).")
                files.refuse_forgetting(paths, "ledger (ledger.json)")
                state = GroupState(budget=create_budget)
            else:
                state = files.to_state(ledger)
            before = files.signature(state)
            files.reap(paths, state)
            revision = state.revision
            yield paths, state
            if ledger is None or state.revision != revision or files.signature(state) != before:
                if state.revision == revision:
                    state.revision += 1
                files.write_ledger(paths, files.to_ledger(state))
    finally:
        lock.close()


def set_budget(
    directory: Path | str, budget: int, *, create: bool = False, timeout: float = files.LOCK_TIMEOUT
) -> GroupSnapshot:
    """Change the group's budget (``kvplan limit``); with ``create``, make what the group
    lacks: the directory (``0700``), ``members/``, and ``group.lock`` and the ledger only
    while no member's lease is held (``KVP541`` else: never a silent reset). ``KVP542`` below
    Σ guarantees (the message names both); below Σ grants the borrowers owe the difference
    and give it back at their next ticks."""
    files.check_bytes(directory, "budget", budget)
    with _admin(directory, timeout, budget if create else None) as (paths, state):
        try:
            grants.set_budget(state, budget)
        except PolicyError as exc:
            raise files.policy_error(exc, paths.directory) from None
    return read_snapshot(directory)


def set_guarantee(
    directory: Path | str, name: str, guarantee: int, *, timeout: float = files.LOCK_TIMEOUT
) -> GroupSnapshot:
    """Set member ``name``'s guarantee and keep it in the ledger by name: the member keeps it
    across restarts (it rejoins with it) until it is set again or cleared
    (:func:`clear_guarantee`). A live member's guarantee changes now: ``KVP547`` below its
    floor or above its ceiling, ``KVP542`` when the guarantees would not fit. For a name not
    in the group now it is kept for that member's next join (checked then)."""
    with _admin(directory, timeout) as (paths, state):
        if name in state.members:
            try:
                grants.set_guarantee(state, name, guarantee)
            except PolicyError as exc:
                raise files.policy_error(exc, paths.directory) from None
        else:
            _check_kept(paths.directory, state, name, guarantee)
        state.kept[name] = guarantee
    return read_snapshot(directory)


def clear_guarantee(
    directory: Path | str, name: str, *, timeout: float = files.LOCK_TIMEOUT
) -> tuple[GroupSnapshot, int | None]:
    """Forget the guarantee kept for ``name``; the snapshot after it and the guarantee that
    was kept (``None``: none was). A live member keeps its present guarantee until it
    restarts; it then joins with its own (``KVPLAN_GROUP_GUARANTEE``, else its floor)."""
    with _admin(directory, timeout) as (_, state):
        was = state.kept.pop(name, None)
    return read_snapshot(directory), was


def _check_kept(where: Path, state: GroupState, name: str, guarantee: int) -> None:
    if not re.fullmatch(files._NAME, name):
        raise files.fail(
            Code.GROUP_BAD_REQUEST,
            where,
            f"the member name {show_value(name)} is not valid (1-128 letters, digits and "
            "._:@+- , starting with a letter or digit).",
            "pass the member's KVPLAN_ENGINE_NAME (kvplan top DIR lists the members)",
        )
    files.check_bytes(where, "guarantee", guarantee)
    if len(state.kept) >= files.MAX_KEPT and name not in state.kept:
        raise files.fail(
            Code.GROUP_BAD_REQUEST,
            where,
            f"the group already keeps {files.MAX_KEPT} guarantees.",
            "clear the guarantees of members that are gone (--member NAME --clear)",
        )


def is_group_directory(directory: Path | str) -> bool:
    """Whether ``directory`` really is a group: a ``group.lock`` and a valid ledger (a
    marker file alone is not one; ``kvplan limit DIR`` without ``--group`` asks this)."""
    try:
        paths = files.check_directory(directory)
        files.GroupLock(paths, create=False).close()
        return files.read_ledger(paths) is not None
    except KVPlanError:
        return False
