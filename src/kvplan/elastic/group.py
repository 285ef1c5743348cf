"""One physical KV budget for a group of engines on one host: the files and the processes.

A group is a directory (``KVPLAN_GROUP=DIR``); every engine naming it is a member. Files:

* ``group.lock``: ``flock(LOCK_EX)`` around every read-check-write of the ledger (bounded
  wait, then ``KVP540``). Never removed (removing a lock file splits waiters across inodes).
* ``ledger.json``: the :class:`GroupLedger` (budget, members, grants, claims), replaced
  atomically (a unique temporary file renamed over it): a reader, and a writer killed at any
  instant, leave it whole. Read without following symbolic links, regular files only.
* ``members/<lease>.lease``: one per member. The member's processes hold ``flock(LOCK_SH)``
  on it for as long as they live (the engine core from :meth:`GroupMember.join`, every
  worker that maps memory through :func:`attach`). A reaper's ``LOCK_EX|LOCK_NB`` succeeds
  only when every holder is gone, so the kernel says who is dead and a reused pid does not
  matter. Every accounting operation first reaps dead members: their grants return.

The policy (grants, guarantees, claims, what borrowers owe) is :mod:`kvplan.elastic.grants`;
this module runs it inside the lock. No torch, no vLLM.

**Fork.** Every descriptor is opened ``O_CLOEXEC`` (a program that ``exec``\\ s gets none).
A plain ``fork()`` copies the descriptors, and with them the *same* open file description
and its flock: an inherited lease would keep the member alive for as long as the child
lives, and a child unlocking it would release the parent's lock. So a child closes every
inherited kvplan descriptor right after ``os.fork()`` (``os.register_at_fork``) without
unlocking; a forked process that maps memory attaches with :func:`attach` like any worker.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvplan.elastic import grants
from kvplan.elastic.grants import GroupState, MemberState, PolicyError
from kvplan.schemas.errors import Code, KVPlanError, error, printable, show_value
from kvplan.schemas.loading import (
    decode_text,
    diagnostics_from_validation,
    parse_text,
    write_text_atomic,
)

LEDGER_KIND: Final = "kvplan-group-ledger"
SNAPSHOT_KIND: Final = "kvplan-group-snapshot"
LEDGER_FILE = "ledger.json"
LOCK_FILE = "group.lock"
MEMBERS_DIR = "members"
LEASE_SUFFIX = ".lease"

MAX_LEDGER_BYTES = 1 << 20
"""Largest ledger read (1 MiB; a full one of 64 members is about 40 KiB)."""
MAX_MEMBERS = 64
MAX_BYTES = 1 << 60
"""Largest byte count a ledger holds (1 EiB)."""
MAX_FACTOR = 4096
MAX_SCAN = 4096
"""Most entries looked at when cleaning ``members/`` and the group directory."""
LOCK_TIMEOUT = 5.0
"""Seconds a member waits for the group's lock before ``KVP540``."""
TICK_SECONDS = 0.25
"""How often :meth:`GroupMember.tick` looks at the ledger (the engine calls it every step)."""
HOLD_SECONDS = 1.0
"""A grant that just grew is not shrunk voluntarily for this long (hysteresis in time)."""
DEBUG_UNLOCKED_ENV = "KVPLAN_DEBUG_GROUP_UNLOCKED"
"""Test-only negative control: ``1`` makes every read-check-write skip the lock."""

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$"
_LEASE = r"^[0-9a-f]{32}$"
_TEMP_PREFIX = f".{LEDGER_FILE}."


def _fail(code: Code, where: object, message: str, hint: str = "") -> KVPlanError:
    return KVPlanError(error(code, printable(str(where)), message, hint))


# -- documents --------------------------------------------------------------------------------


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)


class MemberRecord(_Document):
    """One member as the ledger keeps it (its bytes; the group charges ``× factor``)."""

    name: str = Field(pattern=_NAME)
    lease: str = Field(pattern=_LEASE, description="members/<lease>.lease")
    lease_inode: int = Field(ge=0, le=1 << 64, description="the lease file's inode")
    pid: int = Field(ge=0, le=1 << 32, description="the process that joined (informational)")
    factor: int = Field(ge=1, le=MAX_FACTOR)
    floor_bytes: int = Field(ge=0, le=MAX_BYTES)
    guarantee_bytes: int = Field(ge=0, le=MAX_BYTES)
    ceiling_bytes: int = Field(ge=0, le=MAX_BYTES)
    granted_bytes: int = Field(ge=0, le=MAX_BYTES)
    claim_bytes: int = Field(ge=0, le=MAX_BYTES)
    claim_seq: int = Field(ge=0, le=1 << 62)
    joined_at: float = Field(ge=0)


class GroupLedger(_Document):
    """``ledger.json``: the group's budget and members."""

    kind: Literal["kvplan-group-ledger"] = LEDGER_KIND
    version: Literal[1] = 1
    budget_bytes: int = Field(ge=0, le=MAX_BYTES)
    revision: int = Field(ge=0, le=1 << 62)
    members: list[MemberRecord] = Field(max_length=MAX_MEMBERS)


def to_state(ledger: GroupLedger) -> GroupState:
    state = GroupState(budget=ledger.budget_bytes, revision=ledger.revision)
    for r in ledger.members:
        state.members[r.name] = MemberState(
            name=r.name,
            factor=r.factor,
            floor=r.floor_bytes,
            guarantee=r.guarantee_bytes,
            ceiling=r.ceiling_bytes,
            granted=r.granted_bytes,
            claim=r.claim_bytes,
            claim_seq=r.claim_seq,
            lease=r.lease,
            lease_inode=r.lease_inode,
            pid=r.pid,
            joined_at=r.joined_at,
        )
    return state


def to_ledger(state: GroupState) -> GroupLedger:
    return GroupLedger(
        budget_bytes=state.budget,
        revision=state.revision,
        members=[
            MemberRecord(
                name=m.name,
                lease=m.lease,
                lease_inode=m.lease_inode,
                pid=m.pid,
                factor=m.factor,
                floor_bytes=m.floor,
                guarantee_bytes=m.guarantee,
                ceiling_bytes=m.ceiling,
                granted_bytes=m.granted,
                claim_bytes=m.claim,
                claim_seq=m.claim_seq,
                joined_at=m.joined_at,
            )
            for m in sorted(state.members.values(), key=lambda m: m.name)
        ],
    )


# -- paths and descriptors ------------------------------------------------------------------


@dataclass(frozen=True)
class GroupPaths:
    directory: Path

    @property
    def lock(self) -> Path:
        return self.directory / LOCK_FILE

    @property
    def ledger(self) -> Path:
        return self.directory / LEDGER_FILE

    @property
    def members(self) -> Path:
        return self.directory / MEMBERS_DIR

    def lease(self, lease: str) -> Path:
        return self.members / f"{lease}{LEASE_SUFFIX}"

    def lease_name(self, lease: str) -> str:
        """:meth:`lease` as a string (cheaper: the reaper builds one per member and op)."""
        return f"{self.directory}/{MEMBERS_DIR}/{lease}{LEASE_SUFFIX}"


_OPEN: set[_Descriptor] = set()
"""Every group descriptor this process holds open (closed in a forked child)."""


class _Descriptor:
    """A descriptor kvplan holds for a group (lock or lease); closed in a forked child."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        self.pid = os.getpid()
        _OPEN.add(self)

    def close(self) -> None:
        fd, self.fd = self.fd, None
        _OPEN.discard(self)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def forget_in_child(self) -> None:
        """After fork: drop the inherited copy without unlocking the parent's lock."""
        if self.pid != os.getpid():
            self.close()


def _after_fork_in_child() -> None:
    for item in list(_OPEN):
        item.forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)

_RDONLY = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _open_regular(path: Path, flags: int, what: str, code: Code, mode: int = 0o666) -> int:
    """Open ``path`` (never through a symbolic link, never blocking on a fifo) and make sure
    it is a regular file; the descriptor. ``FileNotFoundError`` passes through."""
    try:
        fd = os.open(path, flags, mode)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _fail(code, path, f"the {what} is a symbolic link.", "remove it") from None
        reason = exc.strerror or type(exc).__name__
        raise _fail(
            code, path, f"the {what} cannot be opened: {reason}.", "check its permissions"
        ) from None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _fail(code, path, f"the {what} is not a regular file.", "remove it")
    return fd


def _check_directory(directory: Path) -> GroupPaths:
    paths = GroupPaths(Path(directory))
    try:
        info = os.stat(paths.directory)
    except OSError as exc:
        reason = "does not exist" if exc.errno == errno.ENOENT else (exc.strerror or "error")
        raise _fail(
            Code.GROUP_UNREACHABLE,
            paths.directory,
            f"the group directory {reason}.",
            "create it (mkdir) or point KVPLAN_GROUP at the group's directory",
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise _fail(
            Code.GROUP_UNREACHABLE,
            paths.directory,
            "the group directory is not a directory.",
            "point KVPLAN_GROUP at the group's directory",
        )
    return paths


def _ensure_members_dir(paths: GroupPaths) -> None:
    with contextlib.suppress(FileExistsError):
        try:
            os.mkdir(paths.members, 0o777)
        except FileExistsError:
            raise
        except OSError as exc:
            raise _fail(
                Code.GROUP_UNREACHABLE,
                paths.members,
                f"cannot create the members directory: {exc.strerror or type(exc).__name__}.",
                "make the group directory writable",
            ) from None
    info = os.lstat(paths.members)
    if not stat.S_ISDIR(info.st_mode):
        raise _fail(
            Code.GROUP_UNREACHABLE,
            paths.members,
            "the members directory is not a directory (or is a symbolic link).",
            "remove it; kvplan creates it",
        )


def _unlocked() -> bool:
    return os.environ.get(DEBUG_UNLOCKED_ENV) == "1"


class GroupLock(_Descriptor):
    """The group's ``flock``; :meth:`hold` waits at most ``timeout`` seconds."""

    def __init__(self, paths: GroupPaths, *, create: bool) -> None:
        flags = (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | _RDONLY
        try:
            fd = _open_regular(paths.lock, flags, "group lock file", Code.GROUP_UNREACHABLE)
        except FileNotFoundError:
            raise _fail(
                Code.GROUP_UNREACHABLE,
                paths.directory,
                "the directory is not a kvplan group (no group.lock).",
                "start an engine with KVPLAN_GROUP naming it, or run kvplan limit on it",
            ) from None
        super().__init__(fd)
        self.paths = paths

    @contextlib.contextmanager
    def hold(self, timeout: float) -> Iterator[None]:
        """Hold the lock exclusively (``KVP540`` after ``timeout`` s)."""
        if _unlocked():
            yield
            return
        assert self.fd is not None
        _flock_bounded(self.fd, fcntl.LOCK_EX, timeout, self.paths.lock, "the group's lock")
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


def _flock_bounded(fd: int, mode: int, timeout: float, where: Path, what: str) -> None:
    deadline = time.monotonic() + timeout
    pause = 50e-6
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError as exc:
            raise _fail(
                Code.GROUP_UNREACHABLE,
                where,
                f"cannot lock {what}: {exc.strerror or type(exc).__name__}.",
                "check the file system holding the group (flock must work there)",
            ) from None
        if time.monotonic() >= deadline:
            raise _fail(
                Code.GROUP_UNREACHABLE,
                where,
                f"{what} was held by another process for more than {timeout:g} s.",
                "find the process that hangs holding it (fuser/lsof on the file); "
                "a dead holder releases it by itself",
            )
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


# -- the ledger -------------------------------------------------------------------------------


def _ledger_problem(paths: GroupPaths, message: str) -> KVPlanError:
    return _fail(
        Code.GROUP_LEDGER_INVALID,
        paths.ledger,
        f"the group ledger {message}",
        "stop the group's engines and remove the group directory (kvplan writes the ledger)",
    )


def read_ledger(paths: GroupPaths) -> GroupLedger | None:
    """The group's ledger; ``None`` when there is none. ``KVP541`` for anything else that is
    not a valid ledger (symbolic link, fifo, directory, too large, torn, hostile values)."""
    try:
        fd = _open_regular(paths.ledger, _RDONLY, "group ledger", Code.GROUP_LEDGER_INVALID)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        size = 0
        while size <= MAX_LEDGER_BYTES:
            part = os.read(fd, MAX_LEDGER_BYTES + 1 - size)
            if not part:
                break
            chunks.append(part)
            size += len(part)
    except OSError as exc:
        raise _ledger_problem(paths, f"cannot be read: {exc.strerror or 'error'}.") from None
    finally:
        os.close(fd)
    if size > MAX_LEDGER_BYTES:
        raise _ledger_problem(paths, f"is larger than {MAX_LEDGER_BYTES >> 20} MiB.")
    raw = b"".join(chunks)
    known = _LAST.get(str(paths.ledger))
    if known is not None and known[0] == raw:
        return known[1]  # the very bytes this process last read or wrote: the same ledger
    ledger = _parse_ledger(paths, raw)
    _LAST[str(paths.ledger)] = (raw, ledger)
    return ledger


_LAST: dict[str, tuple[bytes, GroupLedger]] = {}
"""Per ledger path, the bytes this process last read or wrote and what they parse to: an
unchanged ledger is not parsed again (the comparison is of the whole content, so it is exact)."""


def _parse_ledger(paths: GroupPaths, raw: bytes) -> GroupLedger:
    name = str(paths.ledger)
    try:
        data: Any = parse_text(decode_text(raw, name), name)
    except KVPlanError as exc:
        first = exc.diagnostics[0]
        raise _ledger_problem(
            paths, f"cannot be used: {first.code.value} {first.message.rstrip('.')}."
        ) from None
    if not isinstance(data, dict) or data.get("kind") != LEDGER_KIND:
        got = show_value(data.get("kind")) if isinstance(data, dict) else show_value(data)
        raise _ledger_problem(paths, f"is not a {LEDGER_KIND} document (kind {got}).")
    if data.get("version") != 1:
        raise _ledger_problem(
            paths, f"has version {show_value(data.get('version'))}; this kvplan reads 1."
        )
    try:
        ledger = GroupLedger.model_validate(data)
    except ValidationError as exc:
        diags = diagnostics_from_validation(exc, name, data)
        field = diags[0].location.removeprefix(name).lstrip(":. ") or "?"
        raise _ledger_problem(paths, f"has a bad field {field}: {diags[0].message}.") from None
    names = [m.name for m in ledger.members]
    leases = [m.lease for m in ledger.members]
    if len(set(names)) != len(names) or len(set(leases)) != len(leases):
        raise _ledger_problem(paths, "names a member or a lease twice.")
    problems = grants.check_state(to_state(ledger))
    if problems:
        raise _ledger_problem(paths, f"breaks the group's rules: {problems[0]}.")
    return ledger


def _signature(state: GroupState) -> tuple[object, ...]:
    """Everything a ledger records of ``state`` (to tell whether an operation changed it)."""
    return (
        state.budget,
        tuple(
            (m.name, m.lease, m.lease_inode, m.pid, m.factor, m.floor, m.guarantee, m.ceiling,
             m.granted, m.claim, m.claim_seq, m.joined_at)
            for m in sorted(state.members.values(), key=lambda m: m.name)
        ),
    )  # fmt: skip


def write_ledger(paths: GroupPaths, ledger: GroupLedger) -> None:
    """Replace the ledger atomically (``KVP540`` when it cannot be written)."""
    text = ledger.model_dump_json(indent=1) + "\n"
    try:
        write_text_atomic(paths.ledger, text)
        _LAST[str(paths.ledger)] = (text.encode(), ledger)
    except KVPlanError as exc:
        first = exc.diagnostics[0]
        raise _fail(
            Code.GROUP_UNREACHABLE,
            paths.ledger,
            f"cannot write the group ledger: {first.message.rstrip('.')}.",
            first.hint or "make the group directory writable",
        ) from None


def _ledger_stamp(paths: GroupPaths) -> tuple[int, int, int] | None:
    try:
        info = os.lstat(paths.ledger)
    except OSError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)


# -- leases -----------------------------------------------------------------------------------


class Lease(_Descriptor):
    """A shared ``flock`` on a member's lease file, held for this process's life (or until
    :meth:`close`). A member is alive while any of its processes holds one."""

    def __init__(self, fd: int, path: Path, inode: int) -> None:
        super().__init__(fd)
        self.path = path
        self.inode = inode

    @classmethod
    def create(cls, paths: GroupPaths, lease: str) -> Lease:
        path = paths.lease(lease)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = _open_regular(path, flags, "lease file", Code.GROUP_UNREACHABLE, 0o644)
        except FileNotFoundError:
            raise _fail(
                Code.GROUP_UNREACHABLE, path, "cannot create the lease file.", "check members/"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            inode = os.fstat(fd).st_ino
        except OSError as exc:
            os.close(fd)
            raise _fail(
                Code.GROUP_UNREACHABLE,
                path,
                f"cannot lock the new lease file: {exc.strerror or type(exc).__name__}.",
                "check the file system holding the group (flock must work there)",
            ) from None
        return cls(fd, path, inode)

    def still_mine(self) -> bool:
        """The lease file at its path is still the one this process locked."""
        try:
            return os.lstat(self.path).st_ino == self.inode
        except OSError:
            return False


class Liveness:
    ALIVE: Final = "alive"
    DEAD: Final = "dead"
    TAMPERED: Final = "tampered"


def probe_lease(paths: GroupPaths, lease: str, inode: int) -> str:
    """:data:`Liveness` of the member holding ``lease``: ``dead`` when its file is gone or
    nobody holds it; ``tampered`` when the file is not the one the member locked."""
    try:
        fd = os.open(paths.lease_name(lease), _RDONLY)
    except FileNotFoundError:
        return Liveness.DEAD
    except OSError:
        return Liveness.TAMPERED
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_ino != inode:
            return Liveness.TAMPERED
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Liveness.ALIVE
        return Liveness.DEAD
    finally:
        os.close(fd)


def _tampered(paths: GroupPaths, lease: str, name: str) -> KVPlanError:
    return _fail(
        Code.GROUP_LEASE_LOST,
        paths.lease(lease),
        f"the lease file of member {name} is not the file it locked (replaced, or not a "
        "regular file); its liveness cannot be told.",
        f"stop that member, remove the file, and start it again (it rejoins as {name})",
    )


def reap(paths: GroupPaths, state: GroupState, keep: str | None = None) -> list[str]:
    """Remove the dead members (``keep``: never this one); their names. Runs inside the
    exclusive lock: a dead member's lease file is removed while the reaper holds it."""
    dead = []
    for name, m in list(state.members.items()):
        if name == keep:
            continue
        lease = m.lease
        found = probe_lease(paths, lease, m.lease_inode)
        if found == Liveness.TAMPERED:
            raise _tampered(paths, lease, name)
        if found == Liveness.DEAD:
            grants.leave(state, name)
            with contextlib.suppress(OSError):
                os.unlink(paths.lease_name(lease))
            dead.append(name)
    return dead


def _still_alive(paths: GroupPaths, m: MemberState, tries: int = 5) -> bool:
    """Whether ``m`` is alive, asked a few times a millisecond apart: a reader (``kvplan
    top``) probing a dead member's lease holds it for a moment, which looks like a holder."""
    for i in range(tries):
        found = probe_lease(paths, m.lease, m.lease_inode)
        if found == Liveness.TAMPERED:
            raise _tampered(paths, m.lease, m.name)
        if found == Liveness.DEAD:
            return False
        if i + 1 < tries:
            time.sleep(0.002)
    return True


def _clean(paths: GroupPaths, ledger: GroupLedger | None) -> None:
    """Remove what killed writers and joiners left: temporary ledgers and unlocked lease
    files the ledger does not name (inside the exclusive lock; bounded)."""
    known = {m.lease for m in ledger.members} if ledger else set()
    with contextlib.suppress(OSError), os.scandir(paths.directory) as entries:
        for i, entry in enumerate(entries):
            if i >= MAX_SCAN:
                break
            if entry.name.startswith(_TEMP_PREFIX) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    with contextlib.suppress(OSError), os.scandir(paths.members) as entries:
        for i, entry in enumerate(entries):
            if i >= MAX_SCAN:
                break
            stem = entry.name.removesuffix(LEASE_SUFFIX)
            if stem == entry.name or stem in known or not re.fullmatch(_LEASE, stem):
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            if probe_lease(paths, stem, entry.inode()) == Liveness.DEAD:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


# -- a member ---------------------------------------------------------------------------------


def _policy_error(exc: PolicyError, where: object) -> KVPlanError:
    code = {
        "guarantees": Code.GROUP_GUARANTEES_EXCEED_BUDGET,
        "name": Code.GROUP_MEMBER_REFUSED,
    }.get(exc.kind, Code.GROUP_BAD_REQUEST)
    hint = {
        Code.GROUP_GUARANTEES_EXCEED_BUDGET: "raise the group's budget (kvplan limit) or "
        "lower a guarantee",
        Code.GROUP_MEMBER_REFUSED: "give the engine another name (KVPLAN_ENGINE_NAME)",
    }.get(code, "pass a value within the rules")
    return _fail(code, where, str(exc) + ".", hint)


class GroupMember:
    """This engine's membership of a group (made by :meth:`join`; one per engine core).

    Cheap reads for every step: :attr:`effective_limit` (bytes it must get under) and
    :attr:`granted` (bytes it may map). Group I/O only in :meth:`request` past the grant,
    :meth:`release` past the hysteresis, and :meth:`tick` when the ledger changed.
    """

    def __init__(
        self, paths: GroupPaths, lock: GroupLock, lease: Lease, name: str, lease_id: str
    ) -> None:
        self.paths = paths
        self.name = name
        self.lease_id = lease_id
        self._lock = lock
        self._lease = lease
        self.lock_timeout = LOCK_TIMEOUT
        self.tick_seconds = TICK_SECONDS
        self.hold_seconds = HOLD_SECONDS
        self.granted = 0
        self.effective_limit = 0
        self.claim = 0
        self.guarantee = 0
        self.factor = 1
        self.quantum = 1
        self.budget = 0
        self.created = False
        """Whether this join created the group (with the budget it was given)."""
        self._stamp: tuple[int, int, int] | None = None
        self._next_tick = 0.0
        self._grew_at = 0.0
        self._owed_to: tuple[str, ...] = ()
        self.group_ops = 0
        """Read-check-writes done under the lock (for tests and benchmarks)."""

    # -- joining ----------------------------------------------------------------------------
    @classmethod
    def join(
        cls,
        directory: Path | str,
        name: str,
        *,
        floor: int,
        ceiling: int,
        guarantee: int | None = None,
        factor: int = 1,
        initial: int = 0,
        budget: int | None = None,
        timeout: float = LOCK_TIMEOUT,
    ) -> GroupMember:
        """Join the group in ``directory`` as ``name`` and take its lease.

        ``floor``: the least the engine runs with (null block plus one ``max_model_len``
        request per KV cache group); ``guarantee`` defaults to it. ``ceiling``: its whole
        reservation. ``factor``: ranks charged per byte. ``initial``: bytes granted now if
        free (else claimed up to the guarantee; see :meth:`acquire`). ``budget``: the budget
        of a group that has no ledger yet (ignored once the group exists: see
        :attr:`budget`). ``KVP540``-``KVP547`` when it cannot join.
        """
        if not re.fullmatch(_NAME, name):
            raise _fail(
                Code.GROUP_MEMBER_REFUSED,
                directory,
                f"the member name {show_value(name)} is not valid (1-128 letters, digits and "
                "._:@+- , starting with a letter or digit).",
                "set KVPLAN_ENGINE_NAME to such a name",
            )
        if not 1 <= factor <= MAX_FACTOR:
            raise _fail(
                Code.GROUP_BAD_REQUEST,
                directory,
                f"the charge factor must be 1 to {MAX_FACTOR} (got {show_value(factor)}).",
                "pass the number of ranks whose memory the group holds",
            )
        for label, value in (("floor", floor), ("ceiling", ceiling), ("initial", initial)):
            if not 0 <= value <= MAX_BYTES:
                raise _fail(
                    Code.GROUP_BAD_REQUEST,
                    directory,
                    f"the {label} must be 0 to {MAX_BYTES} bytes (got {show_value(value)}).",
                    "pass a byte count",
                )
        if budget is not None and not 0 <= budget <= MAX_BYTES:
            raise _fail(
                Code.GROUP_BAD_REQUEST,
                directory,
                f"the budget must be 0 to {MAX_BYTES} bytes (got {show_value(budget)}).",
                "pass a byte count",
            )
        paths = _check_directory(Path(directory))
        _ensure_members_dir(paths)
        lock = GroupLock(paths, create=True)
        lease_id = secrets.token_hex(16)
        member_lease: Lease | None = None
        try:
            with lock.hold(timeout):
                ledger = read_ledger(paths)
                created = ledger is None
                if ledger is None:
                    if budget is None:
                        raise _fail(
                            Code.GROUP_BUDGET_MISSING,
                            paths.directory,
                            "the group has no ledger yet and no budget was given to create "
                            "it with.",
                            "set the group's budget (KVPLAN_GROUP_BUDGET, or kvplan limit "
                            "DIR SIZE) before the first engine joins",
                        )
                    state = GroupState(budget=budget)
                else:
                    state = to_state(ledger)
                reap(paths, state)
                _clean(paths, ledger)
                taken = state.members.get(name)
                if taken is not None and not _still_alive(paths, taken):
                    grants.leave(state, name)  # dead: a reader's probe hid it for a moment
                    with contextlib.suppress(OSError):
                        os.unlink(paths.lease_name(taken.lease))
                if name in state.members:
                    raise _fail(
                        Code.GROUP_MEMBER_REFUSED,
                        paths.directory,
                        f"a live member is already named {name} (pid {state.members[name].pid}).",
                        "give the engine another name (KVPLAN_ENGINE_NAME) or stop the other",
                    )
                if len(state.members) >= MAX_MEMBERS:
                    raise _fail(
                        Code.GROUP_MEMBER_REFUSED,
                        paths.directory,
                        f"the group is full ({MAX_MEMBERS} members).",
                        "use another group directory",
                    )
                member_lease = Lease.create(paths, lease_id)
                record = MemberState(
                    name=name,
                    factor=factor,
                    floor=floor,
                    guarantee=floor if guarantee is None else guarantee,
                    ceiling=ceiling,
                    lease=lease_id,
                    lease_inode=member_lease.inode,
                    pid=os.getpid(),
                    joined_at=time.time(),
                )
                try:
                    grants.join(state, record)
                except PolicyError as exc:
                    raise _policy_error(exc, paths.directory) from None
                if initial:
                    grants.request(state, name, min(initial, ceiling))
                write_ledger(paths, to_ledger(state))
        except BaseException:
            if member_lease is not None:
                with contextlib.suppress(OSError):
                    os.unlink(member_lease.path)
                member_lease.close()
            lock.close()
            raise
        member = cls(paths, lock, member_lease, name, lease_id)
        member.created = created
        member.lock_timeout = timeout
        member._adopt(state)
        member._stamp = _ledger_stamp(paths)
        member._next_tick = time.monotonic() + member.tick_seconds
        return member

    @property
    def lease_path(self) -> Path:
        """The lease file workers attach to (:func:`attach`)."""
        return self.paths.lease(self.lease_id)

    # -- the locked operation -------------------------------------------------------------
    def _adopt(self, state: GroupState) -> None:
        m = state.members[self.name]
        shares = grants.owed(state)
        before = self.granted
        self.granted = m.granted
        self.effective_limit = grants.effective_limit(state, self.name, shares)
        self.claim = m.claim
        self.guarantee = m.guarantee
        self.factor = m.factor
        self.quantum = state.quantum(m)
        self.budget = state.budget
        if self.granted > before:
            self._grew_at = time.monotonic()
        self._owed_to = (
            tuple(n for n, o in state.members.items() if o.claim > 0)
            if shares.get(self.name)
            else ()
        )

    def _mine(self, state: GroupState) -> MemberState:
        m = state.members.get(self.name)
        if m is None or m.lease != self.lease_id or not self._lease.still_mine():
            raise _fail(
                Code.GROUP_LEASE_LOST,
                self.paths.directory,
                f"member {self.name} is no longer in the group (its lease was lost or the "
                "ledger was replaced); it must not map more.",
                "restart the engine: it rejoins with a new lease",
            )
        return m

    @contextlib.contextmanager
    def _locked(self) -> Iterator[GroupState]:
        with self._lock.hold(self.lock_timeout):
            ledger = read_ledger(self.paths)
            if ledger is None:
                raise _ledger_problem(self.paths, "is missing.")
            state = to_state(ledger)
            self._mine(state)
            before = _signature(to_state(ledger))
            reap(self.paths, state, keep=self.name)
            yield state
            self.group_ops += 1
            if _signature(state) != before or state.revision != ledger.revision:
                if state.revision == ledger.revision:
                    state.revision += 1
                write_ledger(self.paths, to_ledger(state))
            self._adopt(state)
            self._stamp = _ledger_stamp(self.paths)

    # -- accounting ---------------------------------------------------------------------------
    def request(self, need: int) -> bool:
        """Make the grant cover ``need`` bytes (what the engine would map in all, its bytes)
        before it hands out blocks that map them. True when granted (``effective_limit``
        then covers ``need``). No group I/O when ``need`` is within the effective limit; a
        grant grows by at least a quantum (1/64 of the budget). False when the group cannot
        give it now: the member then claims up to its guarantee, and a later call (or
        :meth:`tick`) sees the claim served."""
        if need <= self.effective_limit:
            return True
        if need <= self.granted:
            return False  # it owes bytes to claims: give back first (tick sees the change)
        with self._locked() as state:
            grants.request(state, self.name, need)
        return need <= self.effective_limit

    def acquire(self, need: int, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until ``need`` bytes are granted; ``KVP546`` else.
        For start-up: the bytes a bound engine maps before its first step."""
        deadline = time.monotonic() + timeout
        while not self.request(need):
            if time.monotonic() >= deadline:
                raise _fail(
                    Code.GROUP_NOT_GRANTED,
                    self.paths.directory,
                    f"member {self.name} was not granted {need} bytes within {timeout:g} s "
                    f"(granted {self.granted}, guarantee {self.guarantee}, budget "
                    f"{self.budget} charged bytes).",
                    "raise the group's budget or lower the other members' use",
                )
            time.sleep(0.02)
            self.tick(force=True)

    def release(self, mapped: int) -> int:
        """Tell the group the engine maps ``mapped`` bytes now (after its workers unmapped);
        bytes given back. Shrinks the grant when it owes bytes to claims (down to its
        effective limit, or to ``mapped`` if that is above) or when the grant exceeds
        ``mapped`` by more than two quanta and did not grow in the last second (to ``mapped``
        plus a quantum). No group I/O otherwise. Never below ``mapped``."""
        target = self._release_target(self.granted, self.effective_limit, mapped, self.claim)
        if target is None:
            return 0
        with self._locked() as state:
            m = state.members[self.name]
            shares = grants.owed(state)
            eff = grants.effective_limit(state, self.name, shares)
            target = self._release_target(m.granted, eff, mapped, m.claim)
            freed = 0 if target is None else grants.release(state, self.name, target)
        return freed

    def give_back(self, to: int) -> int:
        """Shrink the grant to ``to`` bytes now, whatever the hysteresis says (an idle
        engine, or one about to stop); bytes given back. The engine must map no more than
        ``to`` when it calls this."""
        if to >= self.granted and not self.claim:
            return 0
        with self._locked() as state:
            freed = grants.release(state, self.name, to)
        return freed

    def _release_target(self, granted: int, eff: int, mapped: int, claim: int) -> int | None:
        q = self.quantum
        if granted > eff:
            target = max(mapped, min(eff, mapped + q))
        elif claim > 0 or granted - mapped <= 2 * q or self._held():
            return None
        else:
            target = mapped + q
        return target if target < granted else None

    def _held(self) -> bool:
        return time.monotonic() - self._grew_at < self.hold_seconds

    def tick(self, *, force: bool = False) -> bool:
        """Look at the group (at most every :data:`TICK_SECONDS` unless ``force``): a new
        budget, claims this member must give back to, its own claim served, a claimant that
        died. True when this member's figures changed. Cheap when nothing changed (a clock
        read, then one ``lstat`` of the ledger)."""
        now = time.monotonic()
        if not force and now < self._next_tick:
            return False
        self._next_tick = now + self.tick_seconds
        before = (self.granted, self.effective_limit, self.claim)
        stamp = _ledger_stamp(self.paths)
        if stamp != self._stamp or self._owed_to:
            ledger = read_ledger(self.paths)
            if ledger is None:
                raise _ledger_problem(self.paths, "is missing.")
            state = to_state(ledger)
            self._mine(state)
            self._stamp = stamp
            self._adopt(state)
            if any(
                probe_lease(self.paths, state.members[n].lease, state.members[n].lease_inode)
                != Liveness.ALIVE
                for n in self._owed_to
                if n in state.members
            ):
                with self._locked():
                    pass  # reaps the dead claimants; their claims vanish
        return (self.granted, self.effective_limit, self.claim) != before

    def leave(self) -> None:
        """Leave the group: the grant returns, the lease file is removed."""
        if self._lease.fd is None:
            return
        try:
            with self._lock.hold(self.lock_timeout):
                ledger = read_ledger(self.paths)
                if ledger is not None:
                    state = to_state(ledger)
                    m = state.members.get(self.name)
                    if m is not None and m.lease == self.lease_id:
                        grants.leave(state, self.name)
                        write_ledger(self.paths, to_ledger(state))
                with contextlib.suppress(OSError):
                    if self._lease.still_mine():
                        os.unlink(self._lease.path)
        finally:
            self._lease.close()
            self._lock.close()

    def close_descriptors(self) -> None:
        """Drop the lease and lock without touching the ledger (as a crash would: the next
        accounting operation of another member reaps this one). For tests."""
        self._lease.close()
        self._lock.close()


def attach(directory: Path | str, name: str, timeout: float = LOCK_TIMEOUT) -> Lease:
    """For a worker process of member ``name`` that maps memory: hold the member's lease
    (shared) for this process's life. ``KVP545`` when the member is not in the group or its
    lease is gone (it was reaped: the engine must not map).

    Takes no group lock (a storm of grant changes cannot starve a starting worker): the lease
    is locked, then found still at its path and still the member's. A reaper takes a lease
    only when nobody holds it, and removes the file while holding it; so either this process
    holds the lease first (and the member is alive) or it sees the file gone or replaced.
    """
    paths = _check_directory(Path(directory))
    GroupLock(paths, create=False).close()  # a kvplan group (KVP540 otherwise)

    def record() -> MemberRecord:
        ledger = read_ledger(paths)
        found = next((m for m in (ledger.members if ledger else []) if m.name == name), None)
        if found is None:
            raise _fail(
                Code.GROUP_LEASE_LOST,
                paths.directory,
                f"member {name} is not in the group.",
                "the engine core joins first; restart the engine",
            )
        return found

    member = record()
    path = paths.lease(member.lease)
    try:
        fd = _open_regular(path, _RDONLY, "lease file", Code.GROUP_LEASE_LOST)
    except FileNotFoundError:
        raise _fail(
            Code.GROUP_LEASE_LOST, path, f"the lease of {name} is gone.", "restart the engine"
        ) from None
    try:
        if os.fstat(fd).st_ino != member.lease_inode:
            raise _tampered(paths, member.lease, name)
        _flock_bounded(fd, fcntl.LOCK_SH, timeout, path, f"the lease of {name}")
        again = record()
        if again.lease != member.lease or not _same_inode(path, member.lease_inode):
            raise _fail(
                Code.GROUP_LEASE_LOST,
                path,
                f"member {name} was reaped while this worker attached.",
                "restart the engine",
            )
    except BaseException:
        os.close(fd)
        raise
    return Lease(fd, path, member.lease_inode)


def _same_inode(path: Path, inode: int) -> bool:
    try:
        return os.lstat(path).st_ino == inode
    except OSError:
        return False


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

    kind: Literal["kvplan-group-snapshot"] = SNAPSHOT_KIND
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


def snapshot_of(paths: GroupPaths, state: GroupState, liveness: dict[str, str]) -> GroupSnapshot:
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
                liveness=liveness.get(m.name, Liveness.ALIVE),
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
    )


def read_snapshot(directory: Path | str) -> GroupSnapshot:
    """The group now. Takes no lock — the ledger is replaced atomically, so a read always
    sees a whole ledger, and a writer that hangs holding the lock cannot block it. Dead
    members are shown as ``dead``, not reaped (reading needs no write access)."""
    paths = _check_directory(Path(directory))
    GroupLock(paths, create=False).close()  # a kvplan group (KVP540 otherwise)
    ledger = read_ledger(paths)
    if ledger is None:
        raise _ledger_problem(paths, "is missing (no engine has joined yet).")
    state = to_state(ledger)
    liveness = {r.name: probe_lease(paths, r.lease, r.lease_inode) for r in ledger.members}
    return snapshot_of(paths, state, liveness)


@contextlib.contextmanager
def _admin(
    directory: Path | str, timeout: float, create_budget: int | None = None
) -> Iterator[tuple[GroupPaths, GroupState]]:
    paths = _check_directory(Path(directory))
    if create_budget is not None:
        _ensure_members_dir(paths)
    lock = GroupLock(paths, create=create_budget is not None)
    try:
        with lock.hold(timeout):
            ledger = read_ledger(paths)
            if ledger is None:
                if create_budget is None:
                    raise _ledger_problem(paths, "is missing (no engine has joined yet).")
                state = GroupState(budget=create_budget)
            else:
                state = to_state(ledger)
            before = _signature(state)
            reap(paths, state)
            revision = state.revision
            yield paths, state
            if ledger is None or state.revision != revision or _signature(state) != before:
                if state.revision == revision:
                    state.revision += 1
                write_ledger(paths, to_ledger(state))
    finally:
        lock.close()


def set_budget(
    directory: Path | str, budget: int, *, create: bool = False, timeout: float = LOCK_TIMEOUT
) -> GroupSnapshot:
    """Change the group's budget (``kvplan limit``); with ``create``, make the group if it
    has no ledger. ``KVP542`` below Σ guarantees (the message names both); below Σ grants
    the borrowers owe the difference and give it back at their next ticks."""
    if not 0 <= budget <= MAX_BYTES:
        raise _fail(
            Code.GROUP_BAD_REQUEST,
            directory,
            f"the budget must be 0 to {MAX_BYTES} bytes (got {show_value(budget)}).",
            "pass a byte count",
        )
    with _admin(directory, timeout, budget if create else None) as (paths, state):
        try:
            grants.set_budget(state, budget)
        except PolicyError as exc:
            raise _policy_error(exc, paths.directory) from None
    return read_snapshot(directory)


def set_guarantee(
    directory: Path | str, name: str, guarantee: int, *, timeout: float = LOCK_TIMEOUT
) -> GroupSnapshot:
    """Change member ``name``'s guarantee. ``KVP547`` for an unknown member, a guarantee
    below its floor or above its ceiling; ``KVP542`` when the guarantees would not fit."""
    with _admin(directory, timeout) as (paths, state):
        if name not in state.members:
            raise _fail(
                Code.GROUP_BAD_REQUEST,
                paths.directory,
                f"the group has no member named {show_value(name)}.",
                "kvplan top DIR lists the members",
            )
        try:
            grants.set_guarantee(state, name, guarantee)
        except PolicyError as exc:
            raise _policy_error(exc, paths.directory) from None
    return read_snapshot(directory)
