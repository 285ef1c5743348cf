"""The one writer: every file kvplan writes, atomically, regular files only.

Private to :mod:`kvplan.schemas`; :mod:`kvplan.schemas.loading` re-exports the public names
(``write_text_atomic``, ``check_output``, ``OutputError``, ``same_file``,
``refuse_output_over_input``). Documents (``-o``), ``--html`` pages, golden files, the
stats files of elastic engines and ``kvplan limit``'s ``limit.json`` all come through
:func:`write_text_atomic`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path

from kvplan.schemas._reading import file_kind, is_trusted_owner, open_below, owner_text
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error, printable

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_STDOUT_HINT = "leave out the option to print to standard output, or name a regular file"


class OutputError(KVPlanError, OSError):
    """A file could not be written (``KVP016``) or may not be (``KVP023``, ``KVP017``).

    Also an ``OSError``, so callers that wrap write failures in their own diagnostic (the
    vLLM plugin's dump directory) still do."""

    def __init__(self, diagnostic: Diagnostic, code: int | None, reason: str) -> None:
        super().__init__(diagnostic)
        self.errno = code
        self.strerror = reason

    def __str__(self) -> str:
        return self._summary()


def _refuse(
    code: Code, name: str, message: str, hint: str, errno_: int | None = None, reason: str = ""
) -> OutputError:
    return OutputError(error(code, name, message, hint), errno_, reason or message.rstrip("."))


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one file (same inode, or the same real path)."""
    if str(a) == "-" or str(b) == "-":
        return False
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def refuse_output_over_input(output: str | Path, inputs: Sequence[str | Path]) -> None:
    """``KVP017`` when ``output`` is one of ``inputs`` (directly, by ``..``, or by a hard or
    symbolic link)."""
    for source in inputs:
        if same_file(output, source):
            raise _refuse(
                Code.OUTPUT_IS_INPUT,
                str(output),
                f"the output is the input file {printable(str(source))}; writing it would "
                "destroy the input.",
                "write the output to another file",
            )


def _open_parent(path: Path, within: str | Path | None, make_dirs: bool) -> tuple[int, str]:
    """The directory ``path`` goes in (a descriptor) and its file name."""
    name = str(path)
    if within is not None:
        try:
            return open_below(within, path, create=make_dirs)
        except OutputError:
            raise
        except KVPlanError as exc:
            first = exc.diagnostics[0]
            code = Code.UNSAFE_OUTPUT if first.code is Code.UNSAFE_OUTPUT else Code.OUTPUT_FAILED
            raise _refuse(code, name, first.message, first.hint) from None
    parent = path.parent
    if make_dirs:
        with contextlib.suppress(OSError):
            parent.mkdir(parents=True, exist_ok=True)
    try:
        folder = os.open(parent, _DIR_FLAGS)
    except OSError as exc:
        what = "does not exist" if exc.errno == errno.ENOENT else "is not a usable directory"
        raise _refuse(
            Code.OUTPUT_FAILED,
            name,
            f"the directory {printable(str(parent))} {what}.",
            "create it first",
            exc.errno,
        ) from None
    return folder, path.name


FILE_MODE = 0o644
"""The mode of a file kvplan writes (less under a umask), whatever stood there before: the
replaced file's mode is never carried over (another user's planted ``0666`` or set-id file
would otherwise come back as this user's)."""
_ALLOWED_BITS = 0o666
"""Never a set-id, sticky or execute bit, whatever a caller asks."""


def _existing_mode(folder: int, leaf: str, name: str, own: bool = False) -> int | None:
    """The old file's mode (``None``: there is none). Refuses what may not be replaced: a
    link, a directory, a special file, a read-only file (naming its owner), and with ``own``
    another user's file (``KVP428``: a planted file is named, not obeyed)."""
    try:
        info = os.stat(leaf, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refuse(
            Code.OUTPUT_FAILED,
            name,
            f"cannot look at the file: {exc.strerror or type(exc).__name__}.",
            "check the path and its permissions",
            exc.errno,
        ) from None
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        raise _refuse(Code.OUTPUT_FAILED, name, "is a directory.", "name a file to write")
    if stat.S_ISLNK(mode):
        raise _refuse(
            Code.UNSAFE_OUTPUT,
            name,
            "is a symbolic link; kvplan never writes through a link (it could point anywhere).",
            "name the file itself or remove the link; leave out the option to print to "
            "standard output",
        )
    if not stat.S_ISREG(mode):
        raise _refuse(
            Code.UNSAFE_OUTPUT,
            name,
            f"is {file_kind(mode)}; kvplan replaces regular files only.",
            _STDOUT_HINT,
        )
    if own and not is_trusted_owner(info.st_uid):
        raise _refuse(
            Code.UNTRUSTED,
            name,
            f"the file in the way is owned by {owner_text(info.st_uid)}, not by this user "
            f"({owner_text(os.geteuid())}) or root: another user planted it, and kvplan "
            "neither obeys nor overwrites it.",
            "remove it (and find out who could write into the directory), then run again",
        )
    if not mode & 0o222 or not os.access(leaf, os.W_OK, dir_fd=folder):
        # read-only by its mode bits: refused even for root, who could write it
        raise _refuse(
            Code.OUTPUT_FAILED,
            name,
            f"the file is read-only (owned by {owner_text(info.st_uid)}).",
            "make it writable (chmod u+w) or remove it, or write elsewhere",
        )
    return mode & 0o7777


def _target(
    path: str | Path,
    inputs: Sequence[str | Path],
    within: str | Path | None,
    make_dirs: bool,
    own: bool = False,
) -> tuple[int, str, int | None]:
    """Every check of :func:`write_text_atomic`: ``(directory descriptor, name, old mode)``."""
    name = str(path)
    if name == "-":
        raise _refuse(
            Code.UNSAFE_OUTPUT,
            name,
            "- is standard output; this option writes files only.",
            _STDOUT_HINT,
        )
    refuse_output_over_input(path, inputs)
    target = Path(path)
    if target.name in ("", ".", ".."):
        raise _refuse(Code.OUTPUT_FAILED, name, "is a directory.", "name a file to write")
    folder, leaf = _open_parent(target, within, make_dirs)
    try:
        return folder, leaf, _existing_mode(folder, leaf, name, own)
    except BaseException:
        os.close(folder)
        raise


def check_output(
    path: str | Path,
    *,
    inputs: Sequence[str | Path] = (),
    within: str | Path | None = None,
    make_dirs: bool = False,
) -> None:
    """Refuse now what :func:`write_text_atomic` would refuse, before any work is done."""
    if within is not None and make_dirs:
        refuse_output_over_input(path, inputs)
        try:
            folder, leaf = open_below(within, path)
        except KVPlanError as exc:
            if exc.code is Code.UNREADABLE:
                return  # a folder on the way does not exist yet: nothing there to refuse
            first = exc.diagnostics[0]
            raise _refuse(first.code, str(path), first.message, first.hint) from None
        try:
            _existing_mode(folder, leaf, str(path))
        finally:
            os.close(folder)
        return
    folder, _, _ = _target(path, inputs, within, make_dirs=False)
    os.close(folder)


def write_text_atomic(
    path: str | Path,
    text: str,
    *,
    inputs: Sequence[str | Path] = (),
    within: str | Path | None = None,
    make_dirs: bool = False,
    durable: bool = True,
    mode: int = FILE_MODE,
    own: bool = False,
) -> None:
    """Replace ``path`` with ``text`` all at once: readers see the old file or the new one.

    The one writer. The text goes to a new temporary file in the same directory (created
    exclusively, never through a link), is fsynced (unless not ``durable``: a file rewritten
    every fraction of a second, whose rename must survive its writer's death but not the
    machine's, need not wait for the disk), then renamed over ``path``; a rename replaces a
    name and never writes through what stood there. Refused, with nothing
    written: a path that is one of ``inputs`` (``KVP017``); a symbolic link, a fifo, a
    socket or a device where the file goes, ``-``, or, with ``within``, a path outside that
    directory or through a link below it (``KVP023``); a directory, a missing directory
    (unless ``make_dirs``), a read-only file (``KVP016``). On a failed write (a full disk)
    the previous file is left intact, the temporary file removed, and ``KVP016`` raised.

    The new file gets ``mode`` (by its role: ``0644`` by default, ``0600`` for a private
    file; less under the umask; never a set-id, sticky or execute bit), not the mode of the
    file it replaces. ``own``: the file steers an engine (stats, ``limit.json``, the plugin's
    dumps): another user's file in its place is refused (``KVP428``, naming the owner).
    """
    name = str(path)
    folder, leaf, _ = _target(path, inputs, within, make_dirs, own)
    wanted = mode & _ALLOWED_BITS & ~_umask()
    data = text.encode("utf-8")
    tmp = ""
    try:
        fd = -1
        for _ in range(8):
            tmp = f".{leaf[:180]}.{secrets.token_hex(4)}.tmp"
            try:
                fd = os.open(tmp, _TMP_FLAGS, 0o600, dir_fd=folder)
                break
            except FileExistsError:
                tmp = ""
        if fd < 0:
            raise OSError(errno.EEXIST, "no free temporary name")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), wanted)
        os.replace(tmp, leaf, src_dir_fd=folder, dst_dir_fd=folder)
        tmp = ""
        if durable:
            with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
                os.fsync(folder)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        hint = (
            "free some space and run again"
            if exc.errno in (errno.ENOSPC, errno.EDQUOT)
            else "check the path and its permissions"
        )
        raise _refuse(
            Code.OUTPUT_FAILED, name, f"cannot write the file: {reason}.", hint, exc.errno, reason
        ) from None
    finally:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
        os.close(folder)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
