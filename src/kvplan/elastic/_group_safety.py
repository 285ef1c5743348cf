"""Who may use a group directory, checked the way ssh and systemd check theirs.

* The directory itself is never reached through a symbolic link (``lstat``; a dangling link
  or a loop is refused too), must be owned by this process's user or by root, and must not be
  writable by its group or by others.
* Every directory above it (the real path), up to the first sticky one (``/tmp``,
  ``/dev/shm``) or ``/``, must be owned by this user or by root and not be writable by group
  or others (a sticky one may be: nobody can rename or remove another user's entry there).
* ``group.lock``, the leases and ``members/`` grant nothing to group or others (kvplan
  creates them ``0600`` / ``0700``): ``flock`` needs only a descriptor, so a file another
  user can open is a lock another user can take. A directory kvplan creates is ``0700``.

Engines of one group run under one user (or root); there is no shared-group (``0770``)
mode. Every refusal is ``KVP540`` and names what to change. No torch, no vLLM.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kvplan.schemas.errors import Code, KVPlanError, error, printable

DIR_MODE = 0o700
"""The mode of a group directory (and ``members/``) kvplan creates."""
FILE_MODE = 0o600
"""The mode of ``group.lock``, the ledger and the leases kvplan creates."""
MAX_DEPTH = 256
"""Most directories above a group directory that are checked."""


def _refuse(path: object, problem: str, hint: str) -> KVPlanError:
    return KVPlanError(error(Code.GROUP_UNREACHABLE, printable(str(path)), problem, hint))


def _owner_ok(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def _who(uid: int) -> str:
    return f"uid {uid}"


def check_owner_and_mode(path: Path, info: os.stat_result, what: str, private: bool) -> None:
    """``KVP540`` unless ``info`` (of ``path``) is owned by this user or root and, for a
    ``private`` file (lock, lease, ``members/``), grants nothing to group or others; else
    (the group directory) is not writable by group or others."""
    if not _owner_ok(info.st_uid):
        raise _refuse(
            path,
            f"the {what} is owned by {_who(info.st_uid)}, not by this user "
            f"({_who(os.geteuid())}) or root; another user could stop or skew the group.",
            f"run the group's engines and kvplan as {_who(info.st_uid)}, or remove it "
            "(kvplan creates it)",
        )
    mode = stat.S_IMODE(info.st_mode)
    bad = mode & (0o077 if private else 0o022)
    if bad:
        wanted = (mode & ~0o077) if private else (mode & ~0o022)
        problem = "is open to" if private else "is writable by"
        raise _refuse(
            path,
            f"the {what} {problem} other users (mode {mode:04o}); another user could hold "
            "its lock or replace its files.",
            f"chmod {wanted:04o} {printable(str(path))}",
        )


def check_group_directory(directory: Path, *, create: bool) -> None:
    """The group directory's own checks (see the module); with ``create``, a missing one is
    made ``0700`` (its missing parents as ``mkdir -p`` makes them)."""
    check_parents(directory)
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        if not create:
            raise _refuse(
                directory,
                "the group directory does not exist.",
                "create it (kvplan limit --group DIR SIZE) or point KVPLAN_GROUP at the "
                "group's directory",
            ) from None
        info = _make(directory)
        check_parents(directory)  # the parents it made, too
    except OSError as exc:
        raise _refuse(
            directory,
            f"the group directory cannot be looked at: {exc.strerror or type(exc).__name__}.",
            "check the path and its permissions",
        ) from None
    if stat.S_ISLNK(info.st_mode):
        raise _refuse(
            directory,
            "the group directory is a symbolic link; kvplan does not follow it (a link "
            "planted in a shared directory would put the group in someone else's).",
            "point KVPLAN_GROUP at the real directory (readlink -f), or remove the link",
        )
    if not stat.S_ISDIR(info.st_mode):
        raise _refuse(
            directory,
            "the group directory is not a directory.",
            "point KVPLAN_GROUP at the group's directory",
        )
    check_owner_and_mode(directory, info, "group directory", private=False)


def _make(directory: Path) -> os.stat_result:
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(directory, DIR_MODE)
    except FileExistsError:
        pass  # made meanwhile (or a link planted meanwhile: lstat below sees it)
    except (OSError, ValueError) as exc:
        raise _refuse(
            directory,
            f"cannot create the group directory: {getattr(exc, 'strerror', None) or exc}.",
            "create it yourself (mkdir -m 700), or pick a writable place",
        ) from None
    return os.lstat(directory)


def check_parents(directory: Path) -> None:
    """Every real directory above ``directory`` up to a sticky one: this user's or root's,
    not writable by group or others (``KVP540`` naming the first that is not)."""
    try:
        parent = Path(os.path.realpath(directory.parent if directory.name else directory))
    except (OSError, ValueError):
        return  # the directory's own check says what is wrong
    for _ in range(MAX_DEPTH):
        try:
            info = os.stat(parent)
        except OSError:
            return  # missing: created below (and checked then) or refused there
        mode = stat.S_IMODE(info.st_mode)
        sticky = bool(info.st_mode & stat.S_ISVTX)
        if not _owner_ok(info.st_uid) or (mode & 0o022 and not sticky):
            owner = f"owned by {_who(info.st_uid)}" if not _owner_ok(info.st_uid) else ""
            writable = f"writable by other users (mode {mode:04o})" if mode & 0o022 else ""
            raise _refuse(
                directory,
                f"the directory {printable(str(parent))} above the group directory is "
                f"{' and '.join(w for w in (owner, writable) if w)} and not sticky: another "
                "user could replace the group directory.",
                f"chmod go-w {printable(str(parent))} (and own it), or put the group in a "
                "directory only this user can write (or a sticky one such as /dev/shm)",
            )
        if sticky or parent.parent == parent:
            return
        parent = parent.parent


# -- a member whose lease file was removed ------------------------------------------------

_BOOT: float | None = None


def _boot_time() -> float | None:
    global _BOOT
    if _BOOT is None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                for line in f:
                    if line.startswith("btime "):
                        _BOOT = float(line.split()[1])
                        break
        except (OSError, ValueError):
            return None
    return _BOOT


def started_before(pid: int, when: float, slack: float = 2.0) -> bool:
    """Whether process ``pid`` exists and started before ``when`` (unix seconds, plus
    ``slack``): the process that joined at ``when``, not a later one that reused its pid.
    False when it cannot be told (no ``/proc``, another pid namespace)."""
    if pid <= 0:
        return False
    boot = _boot_time()
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK") if boot is not None else None
    except (OSError, ValueError, IndexError):
        return False
    return start is not None and start <= when + slack
