"""The files of a group directory: the ledger (its document is ``_group_doc``), the lock,
the leases, and how each is opened, read, written and probed, with the owners and modes
``trust`` checks (``kvplan.elastic.group`` runs the members on them).

No torch, no vLLM. Every descriptor is opened ``O_CLOEXEC`` and without following links."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from kvplan.elastic import grants
from kvplan.elastic import trust as safety
from kvplan.elastic._group_doc import (
    _LEASE,
    _NAME,
    _TEMP_PREFIX,
    HOLD_SECONDS,
    LEASE_SUFFIX,
    LEDGER_FILE,
    LEDGER_KIND,
    LOCK_FILE,
    LOCK_TIMEOUT,
    MAX_BYTES,
    MAX_FACTOR,
    MAX_KEPT,
    MAX_LEDGER_BYTES,
    MAX_MEMBERS,
    MAX_REVISION,
    MAX_SCAN,
    MEMBERS_DIR,
    SNAPSHOT_KIND,
    TICK_SECONDS,
    GroupLedger,
    MemberRecord,
    check_bytes,
    check_range,
    fail,
    to_ledger,
    to_state,
)
from kvplan.elastic.grants import GroupState, MemberState, PolicyError
from kvplan.schemas.errors import Code, KVPlanError, show_value
from kvplan.schemas.loading import (
    decode_text,
    diagnostics_from_validation,
    parse_text,
    write_text_atomic,
)

__all__ = [  # the document part lives in _group_doc; the group files re-export it
    "HOLD_SECONDS",
    "LEASE_SUFFIX",
    "LEDGER_FILE",
    "LEDGER_KIND",
    "LOCK_FILE",
    "LOCK_TIMEOUT",
    "MAX_BYTES",
    "MAX_FACTOR",
    "MAX_KEPT",
    "MAX_LEDGER_BYTES",
    "MAX_MEMBERS",
    "MAX_REVISION",
    "MAX_SCAN",
    "MEMBERS_DIR",
    "SNAPSHOT_KIND",
    "TICK_SECONDS",
    "_LEASE",
    "_NAME",
    "_TEMP_PREFIX",
    "GroupLedger",
    "MemberRecord",
    "check_bytes",
    "check_range",
    "fail",
    "to_ledger",
    "to_state",
]


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

    @functools.cached_property
    def ledger_name(self) -> str:
        """:attr:`ledger` as a string, made once (:func:`ledger_stamp` runs at a group
        member's steps)."""
        return str(self.ledger)

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


def open_regular(
    path: Path, flags: int, what: str, code: Code, mode: int = 0o666, *, private: bool = False
) -> int:
    """Open ``path`` (never through a symbolic link, never blocking on a fifo) and make sure
    it is a regular file; the descriptor. ``private`` (the lock, a lease): owned by this user
    or root and open to nobody else (``KVP540``). ``FileNotFoundError`` passes through."""
    try:
        fd = os.open(path, flags, mode)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise fail(code, path, f"the {what} is a symbolic link.", "remove it") from None
        reason = exc.strerror or type(exc).__name__
        raise fail(
            code, path, f"the {what} cannot be opened: {reason}.", "check its permissions"
        ) from None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise fail(code, path, f"the {what} is not a regular file.", "remove it")
    if private:
        try:
            safety.check_owner_and_mode(path, info, what, private=True)
        except KVPlanError:
            os.close(fd)
            raise
    return fd


def check_directory(directory: Path | str, *, create: bool = False) -> GroupPaths:
    """The group directory, checked (:mod:`.trust`: never a symbolic link, this
    user's or root's, not writable by others, nor is any directory above it up to a sticky
    one); with ``create``, a missing one is made ``0700``. ``KVP540`` otherwise."""
    if not str(directory).strip():
        raise _unreachable(
            "''", "the group directory is empty.", "name the group's directory (KVPLAN_GROUP)"
        )
    paths = GroupPaths(Path(directory))
    safety.check_group_directory(paths.directory, create=create)
    try:
        members = os.lstat(paths.members)
    except OSError:
        return paths  # made (and checked) by the first writer
    if not stat.S_ISDIR(members.st_mode):
        problem = "the members directory is not a directory (or is a symbolic link)."
        raise _unreachable(paths.members, problem, "remove it; kvplan creates it")
    safety.check_owner_and_mode(paths.members, members, "members directory", private=True)
    return paths


def ensure_members_dir(paths: GroupPaths) -> None:
    try:
        os.mkdir(paths.members, safety.DIR_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        problem = f"cannot create the members directory: {exc.strerror or type(exc).__name__}."
        raise _unreachable(paths.members, problem, "make the group directory writable") from None
    info = os.lstat(paths.members)
    if not stat.S_ISDIR(info.st_mode):
        problem = "the members directory is not a directory (or is a symbolic link)."
        raise _unreachable(paths.members, problem, "remove it; kvplan creates it")
    safety.check_owner_and_mode(paths.members, info, "members directory", private=True)


def live_leases(paths: GroupPaths) -> int:
    """How many lease files in ``members/`` some process holds (bounded scan): members that
    are alive whatever the ledger says."""
    found = 0
    with contextlib.suppress(OSError), os.scandir(paths.members) as entries:
        for i, entry in enumerate(entries):
            if i >= MAX_SCAN:
                break
            stem = entry.name.removesuffix(LEASE_SUFFIX)
            if stem == entry.name or not re.fullmatch(_LEASE, stem):
                continue
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False) and (
                    probe_lease(paths, stem, entry.inode()) == Liveness.ALIVE
                ):
                    found += 1
    return found


def refuse_forgetting(paths: GroupPaths, what: str) -> None:
    """``KVP541`` when ``what`` (the ledger, the lock) is missing while members are alive:
    making it anew would forget them (a silent reset)."""
    alive = live_leases(paths)
    if alive:
        raise fail(
            Code.GROUP_LEDGER_INVALID,
            paths.directory,
            f"the group's {what} is missing while {alive} member lease"
            f"{'s are' if alive > 1 else ' is'} held: a new one would forget live members "
            "and their grants (a silent reset).",
            "stop the group's engines (their leases are then free), then create the group "
            "again (kvplan limit --group DIR SIZE, or the first engine's KVPLAN_GROUP_BUDGET)",
        )


def _unreachable(path: object, problem: str, hint: str) -> KVPlanError:
    """``KVP540``: a group directory (or its members directory) kvplan cannot use."""
    return fail(Code.GROUP_UNREACHABLE, path, problem, hint)


_UNLOCKED = False
"""The group tests' negative control, set only by a test in its own process (the race test
then sees the last bytes granted twice): no environment variable or setting of the product
turns the lock off."""


def _unlocked() -> bool:
    return _UNLOCKED


class GroupLock(_Descriptor):
    """The group's ``flock``; :meth:`hold` waits at most ``timeout`` seconds, then checks
    that ``group.lock`` is still the file this descriptor opened (``KVP540`` if it was
    removed or replaced: processes that opened the old and the new file would not exclude
    each other). With ``create``, a missing lock file is made (``0600``) only while no lease
    is held (:func:`refuse_forgetting`)."""

    def __init__(self, paths: GroupPaths, *, create: bool) -> None:
        what = "group lock file"
        try:
            fd = open_regular(paths.lock, os.O_RDONLY | _RDONLY, what, Code.GROUP_UNREACHABLE,
                              private=True)  # fmt: skip
        except FileNotFoundError:
            if not create:
                raise fail(
                    Code.GROUP_UNREACHABLE,
                    paths.directory,
                    "the directory is not a kvplan group (no group.lock).",
                    "start an engine with KVPLAN_GROUP naming it, or run kvplan limit --group "
                    "on it",
                ) from None
            fd = self._create(paths)
        info = os.fstat(fd)
        super().__init__(fd)
        self.paths = paths
        self.identity = (info.st_dev, info.st_ino)

    @staticmethod
    def _create(paths: GroupPaths) -> int:
        refuse_forgetting(paths, "lock file (group.lock)")
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _RDONLY
        try:
            fd = open_regular(paths.lock, flags, "group lock file", Code.GROUP_UNREACHABLE,
                              safety.FILE_MODE)  # fmt: skip
            os.fchmod(fd, safety.FILE_MODE)
            return fd
        except FileExistsError:  # made meanwhile by another process: open that one
            flags = os.O_RDONLY | _RDONLY
            return open_regular(paths.lock, flags, "group lock file", Code.GROUP_UNREACHABLE,
                                private=True)  # fmt: skip
        except FileNotFoundError:
            raise _unreachable(paths.lock, "cannot create the lock file.", "check DIR") from None

    def check_same(self) -> None:
        """``KVP540`` unless ``group.lock`` is still the file this descriptor opened."""
        try:
            info = os.lstat(self.paths.lock)
            same = (info.st_dev, info.st_ino) == self.identity
        except OSError:
            same = False
        if not same:
            raise fail(
                Code.GROUP_UNREACHABLE,
                self.paths.lock,
                "the group's lock file was removed or replaced since this process opened it: "
                "processes holding the old and the new file no longer exclude each other.",
                "stop every engine of the group and start them again; never remove group.lock",
            )

    @contextlib.contextmanager
    def hold(self, timeout: float) -> Iterator[None]:
        """Hold the lock exclusively (``KVP540`` after ``timeout`` s)."""
        if _unlocked():
            yield
            return
        assert self.fd is not None
        flock_bounded(self.fd, fcntl.LOCK_EX, timeout, self.paths.lock, "the group's lock")
        try:
            self.check_same()
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


def flock_bounded(fd: int, mode: int, timeout: float, where: Path, what: str) -> None:
    deadline = time.monotonic() + timeout
    pause = 50e-6
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError as exc:
            raise fail(
                Code.GROUP_UNREACHABLE,
                where,
                f"cannot lock {what}: {exc.strerror or type(exc).__name__}.",
                "check the file system holding the group (flock must work there)",
            ) from None
        if time.monotonic() >= deadline:
            raise fail(
                Code.GROUP_UNREACHABLE,
                where,
                f"{what} was held by another process for more than {timeout:g} s.",
                "find the process that hangs holding it (fuser/lsof on the file); "
                "a dead holder releases it by itself",
            )
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


# -- the ledger -------------------------------------------------------------------------------


def ledger_problem(paths: GroupPaths, message: str) -> KVPlanError:
    return fail(
        Code.GROUP_LEDGER_INVALID,
        paths.ledger,
        f"the group ledger {message}",
        "stop the group's engines and remove the group directory (kvplan writes the ledger)",
    )


def read_ledger(paths: GroupPaths) -> GroupLedger | None:
    """The group's ledger; ``None`` when there is none. ``KVP541`` for anything else that is
    not a valid ledger (symbolic link, fifo, directory, too large, torn, hostile values)."""
    try:
        fd = open_regular(paths.ledger, _RDONLY, "group ledger", Code.GROUP_LEDGER_INVALID)
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
        raise ledger_problem(paths, f"cannot be read: {exc.strerror or 'error'}.") from None
    finally:
        os.close(fd)
    if size > MAX_LEDGER_BYTES:
        raise ledger_problem(paths, f"is larger than {MAX_LEDGER_BYTES >> 20} MiB.")
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
    if raw.startswith(b"\xef\xbb\xbf"):
        raise ledger_problem(paths, "starts with a UTF-8 BOM; kvplan writes none (edited?).")
    try:
        data: Any = parse_text(decode_text(raw, name), name)
    except KVPlanError as exc:
        first = exc.diagnostics[0]
        raise ledger_problem(
            paths, f"cannot be used: {first.code.value} {first.message.rstrip('.')}."
        ) from None
    if not isinstance(data, dict) or data.get("kind") != LEDGER_KIND:
        got = show_value(data.get("kind")) if isinstance(data, dict) else show_value(data)
        raise ledger_problem(paths, f"is not a {LEDGER_KIND} document (kind {got}).")
    if data.get("version") != 1:
        raise ledger_problem(
            paths, f"has version {show_value(data.get('version'))}; this kvplan reads 1."
        )
    try:
        ledger = GroupLedger.model_validate(data)
    except ValidationError as exc:
        diags = diagnostics_from_validation(exc, name, data)
        field = diags[0].location.removeprefix(name).lstrip(":. ") or "?"
        raise ledger_problem(paths, f"has a bad field {field}: {diags[0].message}.") from None
    names = [m.name for m in ledger.members]
    leases = [m.lease for m in ledger.members]
    if len(set(names)) != len(names) or len(set(leases)) != len(leases):
        raise ledger_problem(paths, "names a member or a lease twice.")
    problems = grants.check_state(to_state(ledger))
    if problems:
        raise ledger_problem(paths, f"breaks the group's rules: {problems[0]}.")
    return ledger


def signature(state: GroupState) -> tuple[object, ...]:
    """Everything a ledger records of ``state`` (to tell whether an operation changed it)."""
    return (
        state.budget,
        tuple(
            (m.name, m.lease, m.lease_inode, m.pid, m.factor, m.floor, m.guarantee, m.ceiling,
             m.granted, m.claim, m.claim_seq, m.joined_at)
            for m in sorted(state.members.values(), key=lambda m: m.name)
        ),
        tuple(sorted(state.kept.items())),
    )  # fmt: skip


def write_ledger(paths: GroupPaths, ledger: GroupLedger) -> None:
    """Replace the ledger atomically (``KVP540`` when it cannot be written)."""
    text = ledger.model_dump_json(indent=1) + "\n"
    try:
        write_text_atomic(paths.ledger, text, mode=safety.FILE_MODE, own=True)
        _LAST[str(paths.ledger)] = (text.encode(), ledger)
    except KVPlanError as exc:
        first = exc.diagnostics[0]
        raise fail(
            Code.GROUP_UNREACHABLE,
            paths.ledger,
            f"cannot write the group ledger: {first.message.rstrip('.')}.",
            first.hint or "make the group directory writable",
        ) from None


def ledger_stamp(paths: GroupPaths) -> tuple[int, int, int] | None:
    try:
        info = os.lstat(paths.ledger_name)
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
            fd = open_regular(path, flags, "lease file", Code.GROUP_UNREACHABLE, safety.FILE_MODE)
        except FileNotFoundError:
            raise fail(
                Code.GROUP_UNREACHABLE, path, "cannot create the lease file.", "check members/"
            ) from None
        try:
            os.fchmod(fd, safety.FILE_MODE)
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            inode = os.fstat(fd).st_ino
        except OSError as exc:
            os.close(fd)
            raise fail(
                Code.GROUP_UNREACHABLE,
                path,
                f"cannot lock the new lease file: {exc.strerror or type(exc).__name__}.",
                "check the file system holding the group (flock must work there)",
            ) from None
        return cls(fd, path, inode)

    MINE: Final = "mine"
    REMOVED: Final = "removed"
    OTHER: Final = "other"

    def look(self) -> str:
        """What is at the lease's path now (one ``lstat``): :attr:`MINE`, the file this
        process locked; :attr:`REMOVED`, nothing; :attr:`OTHER`, another file (replaced) or
        a path that cannot be looked at."""
        try:
            inode = os.lstat(self.path).st_ino
        except FileNotFoundError:
            return self.REMOVED
        except OSError:
            return self.OTHER
        return self.MINE if inode == self.inode else self.OTHER

    def still_mine(self) -> bool:
        """The lease file at its path is still the one this process locked."""
        return self.look() == self.MINE

    def removed(self) -> bool:
        """Nothing is at the lease's path any more (removed, not replaced)."""
        return self.look() == self.REMOVED


class Liveness:
    ALIVE: Final = "alive"
    DEAD: Final = "dead"
    TAMPERED: Final = "tampered"


def probe_lease(
    paths: GroupPaths, lease: str, inode: int, pid: int = 0, joined_at: float = 0.0
) -> str:
    """:data:`Liveness` of the member holding ``lease``: ``dead`` when nobody holds its file;
    ``tampered`` when the file is not the one the member locked (or is open to other users).
    A file removed under a member (``rm``) says nothing of it: the member is then ``alive``
    while the process ``pid`` that joined at ``joined_at`` runs (its next group operation
    makes a new lease file), ``dead`` otherwise."""
    try:
        fd = os.open(paths.lease_name(lease), _RDONLY)
    except FileNotFoundError:
        alive = safety.started_before(pid, joined_at)
        return Liveness.ALIVE if alive else Liveness.DEAD
    except OSError:
        return Liveness.TAMPERED
    try:
        info = os.fstat(fd)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_ino != inode
            or stat.S_IMODE(info.st_mode) & 0o077
        ):
            return Liveness.TAMPERED
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Liveness.ALIVE
        return Liveness.DEAD
    finally:
        os.close(fd)


def tampered(paths: GroupPaths, lease: str, name: str) -> KVPlanError:
    return fail(
        Code.GROUP_LEASE_LOST,
        paths.lease(lease),
        f"the lease file of member {name} is not the file it locked (replaced, not a "
        "regular file, or open to other users); its liveness cannot be told.",
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
        found = probe_lease(paths, lease, m.lease_inode, m.pid, m.joined_at)
        if found == Liveness.TAMPERED:
            raise tampered(paths, lease, name)
        if found == Liveness.DEAD:
            grants.leave(state, name)
            with contextlib.suppress(OSError):
                os.unlink(paths.lease_name(lease))
            dead.append(name)
    return dead


def still_alive(paths: GroupPaths, m: MemberState, tries: int = 5) -> bool:
    """Whether ``m`` is alive, asked a few times a millisecond apart: a reader (``kvplan
    top``) probing a dead member's lease holds it for a moment, which looks like a holder."""
    for i in range(tries):
        found = probe_lease(paths, m.lease, m.lease_inode, m.pid, m.joined_at)
        if found == Liveness.TAMPERED:
            raise tampered(paths, m.lease, m.name)
        if found == Liveness.DEAD:
            return False
        if i + 1 < tries:
            time.sleep(0.002)
    return True


def clean(paths: GroupPaths, ledger: GroupLedger | None) -> None:
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


def policy_error(exc: PolicyError, where: object) -> KVPlanError:
    code = {
        "guarantees": Code.GROUP_GUARANTEES_EXCEED_BUDGET,
        "name": Code.GROUP_MEMBER_REFUSED,
    }.get(exc.kind, Code.GROUP_BAD_REQUEST)
    hint = {
        Code.GROUP_GUARANTEES_EXCEED_BUDGET: "raise the group's budget (kvplan limit) or "
        "lower a guarantee",
        Code.GROUP_MEMBER_REFUSED: "give the engine another name (KVPLAN_ENGINE_NAME)",
    }.get(code, "pass a value within the rules")
    return fail(code, where, str(exc) + ".", hint)
