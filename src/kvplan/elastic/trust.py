"""Which directories kvplan takes commands from, checked the way ssh and systemd check theirs.

One rule for every directory whose files steer an engine: the group directory
(``KVPLAN_GROUP``: its ledger sets budgets), the dump directory (``KVPLAN_DUMP_DIR``: its
``limit.json`` sets an engine's physical memory, its files feed ``kvplan top`` and
``/metrics``) and the reviewed-plan directory (``KVPLAN_PLAN_DIR``: the plans an engine
binds). Each is a :class:`Place`; :func:`check_directory` decides for all of them.

* The directory itself is never reached through a symbolic link (``lstat``; a dangling link
  or a loop is refused too), must be owned by this process's user or by root, and must not be
  writable by its group or by others -- unless the place allows a shared directory
  (``shared_ok``: the dump and plan directories) and the directory is sticky (``/tmp``-style:
  nobody can rename or remove another user's entry); then every file kvplan reads there must
  be this user's or root's (``read_bytes(..., own=True)`` checks the open descriptor).
  kvplan reads its control files that way in every place, sticky or not.
* Every directory above it (the real path), up to the first sticky one (``/tmp``,
  ``/dev/shm``) or ``/``, must be owned by this user or by root and not be writable by group
  or others.
* ``group.lock``, the leases and ``members/`` grant nothing to group or others (kvplan
  creates them ``0600`` / ``0700``): ``flock`` needs only a descriptor, so a file another
  user can open is a lock another user can take.
* A directory kvplan creates is ``0700`` whatever the umask (the ones above it it creates
  ``0755`` at most: never writable by others).

Every refusal names what to change and, for another user's file or directory, whose it is:
``KVP540`` for the group directory, ``KVP428`` for the dump and plan directories. No torch,
no vLLM.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kvplan.schemas.errors import Code, KVPlanError, error, printable
from kvplan.schemas.loading import is_trusted_owner, owner_text

DIR_MODE = 0o700
"""The mode of a directory kvplan creates (a group directory, ``members/``, a dump
directory)."""
PARENT_MODE = 0o755
"""The most a directory kvplan creates above one of them gets (less under a umask)."""
FILE_MODE = 0o600
"""The mode of ``group.lock``, the ledger and the leases kvplan creates."""
MAX_DEPTH = 256
"""Most directories above a checked directory that are checked."""


@dataclass(frozen=True)
class Place:
    """A kind of directory kvplan takes commands from."""

    what: str
    """How messages name it (``group directory``)."""
    setting: str
    """The environment variable that names it, for hints."""
    code: Code
    shared_ok: bool
    """Whether a sticky directory writable by others is accepted (its files then must be
    this user's or root's, which readers check on each file)."""


GROUP = Place("group directory", "KVPLAN_GROUP", Code.GROUP_UNREACHABLE, shared_ok=False)
DUMP = Place("dump directory (KVPLAN_DUMP_DIR)", "KVPLAN_DUMP_DIR", Code.UNTRUSTED, shared_ok=True)
PLANS = Place(
    "reviewed-plan directory (KVPLAN_PLAN_DIR)", "KVPLAN_PLAN_DIR", Code.UNTRUSTED, shared_ok=True
)


def _refuse(
    path: object, problem: str, hint: str, code: Code = Code.GROUP_UNREACHABLE
) -> KVPlanError:
    return KVPlanError(error(code, printable(str(path)), problem, hint))


def _owner_ok(uid: int) -> bool:
    return is_trusted_owner(uid)


def check_owner_and_mode(
    path: Path, info: os.stat_result, what: str, private: bool, place: Place = GROUP
) -> None:
    """Refuse unless ``info`` (of ``path``) is owned by this user or root and, for a
    ``private`` file (lock, lease, ``members/``), grants nothing to group or others; else
    (the directory itself) is not writable by group or others (a sticky one is, where
    ``place`` allows it)."""
    if not _owner_ok(info.st_uid):
        raise _refuse(
            path,
            f"the {what} is owned by {owner_text(info.st_uid)}, not by this user "
            f"({owner_text(os.geteuid())}) or root; another user could steer the engines "
            "through it.",
            f"run the engines and kvplan as {owner_text(info.st_uid)}, or remove it "
            "(kvplan creates it)",
            place.code,
        )
    mode = stat.S_IMODE(info.st_mode)
    sticky = bool(info.st_mode & stat.S_ISVTX)
    bad = mode & (0o077 if private else 0o022)
    if bad and not (place.shared_ok and sticky and not private):
        wanted = (mode & ~0o077) if private else (mode & ~0o022)
        problem = "is open to" if private else "is writable by"
        raise _refuse(
            path,
            f"the {what} {problem} other users (mode {mode:04o}); another user could "
            + ("hold its lock or read it." if private else "plant or replace its files."),
            f"chmod {wanted:04o} {printable(str(path))}",
            place.code,
        )


def check_directory(directory: Path, place: Place, *, create: bool) -> None:
    """The checks of the module for one directory of ``place``; with ``create``, a missing
    one is made ``0700`` whatever the umask (its missing parents ``0755`` at most)."""
    what = place.what
    check_parents(directory, place)
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        if not create:
            raise _refuse(
                directory,
                f"the {what} does not exist.",
                f"create it (mkdir -m 700) or point {place.setting} at it",
                place.code,
            ) from None
        info = _make(directory, place)
        check_parents(directory, place)  # the parents it made, too
    except (OSError, ValueError) as exc:
        raise _refuse(
            directory,
            f"the {what} cannot be looked at: {getattr(exc, 'strerror', None) or exc}.",
            "check the path and its permissions",
            place.code,
        ) from None
    if stat.S_ISLNK(info.st_mode):
        raise _refuse(
            directory,
            f"the {what} is a symbolic link; kvplan does not follow it (a link planted in a "
            "shared directory would put the engine's files in someone else's).",
            f"point {place.setting} at the real directory (readlink -f), or remove the link",
            place.code,
        )
    if not stat.S_ISDIR(info.st_mode):
        raise _refuse(
            directory, f"the {what} is not a directory.", f"point {place.setting} at a directory",
            place.code,
        )  # fmt: skip
    check_owner_and_mode(directory, info, what, private=False, place=place)


def check_group_directory(directory: Path, *, create: bool) -> None:
    """:func:`check_directory` for a group directory (``KVP540``)."""
    check_directory(directory, GROUP, create=create)


def _make(directory: Path, place: Place) -> os.stat_result:
    try:
        _make_parents(directory.parent)
        os.mkdir(directory, DIR_MODE)
        os.chmod(directory, DIR_MODE, follow_symlinks=False)  # a umask of 0o200 and such
    except FileExistsError:
        pass  # made meanwhile (or a link planted meanwhile: lstat below sees it)
    except (OSError, ValueError) as exc:
        raise _refuse(
            directory,
            f"cannot create the {place.what}: {getattr(exc, 'strerror', None) or exc}.",
            "create it yourself (mkdir -m 700), or pick a writable place",
            place.code,
        ) from None
    return os.lstat(directory)


def _make_parents(folder: Path) -> None:
    """``mkdir -p`` whose directories are never writable by others, whatever the umask."""
    if folder.exists() or folder == folder.parent:
        return
    _make_parents(folder.parent)
    try:
        os.mkdir(folder, PARENT_MODE)
    except FileExistsError:
        return
    mask = os.umask(0o022)
    os.umask(mask)
    os.chmod(folder, PARENT_MODE & ~mask & ~0o022, follow_symlinks=False)


def check_parents(directory: Path, place: Place = GROUP) -> None:
    """Every real directory above ``directory`` up to a sticky one: this user's or root's,
    not writable by group or others (refused naming the first that is not)."""
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
            owner = f"owned by {owner_text(info.st_uid)}" if not _owner_ok(info.st_uid) else ""
            writable = f"writable by other users (mode {mode:04o})" if mode & 0o022 else ""
            raise _refuse(
                directory,
                f"the directory {printable(str(parent))} above the {place.what} is "
                f"{' and '.join(w for w in (owner, writable) if w)} and not sticky: another "
                f"user could replace the {place.what}.",
                f"chmod go-w {printable(str(parent))} (and own it), or put the {place.what} "
                "in a directory only this user can write (or a sticky one such as /dev/shm)",
                place.code,
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
