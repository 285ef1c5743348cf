"""The directories ``kvplan top`` and ``kvplan limit`` read and write: they exist, are
directories, and are ones kvplan may take commands from (the engines' own check,
:func:`kvplan.elastic.trust.check_directory`)."""

from __future__ import annotations

from pathlib import Path

from kvplan.elastic import trust
from kvplan.schemas.errors import Code, KVPlanError, error, printable


def existing_directory(path: Path, option: str = "DIR") -> Path:
    """``path`` if it is a directory (``KVP419`` otherwise: never created here)."""
    if not path.exists():
        raise KVPlanError(
            error(
                Code.DIRECTORY_MISSING,
                printable(str(path)),
                f"{option}: the directory does not exist.",
                "pass the engines' KVPLAN_DUMP_DIR (create it first)",
            )
        )
    if not path.is_dir():
        raise KVPlanError(
            error(
                Code.DIRECTORY_MISSING,
                printable(str(path)),
                f"{option}: this is not a directory.",
                "pass the engines' KVPLAN_DUMP_DIR, the directory of the rank<N>.stats.json files",
            )
        )
    return path


def trusted_directory(path: Path) -> Path:
    """``DIR`` as :func:`existing_directory` checks it, and a directory kvplan takes commands
    from (:func:`kvplan.elastic.trust.check_directory`, the engines' own check: ``KVP428``)."""
    existing_directory(path)
    trust.check_directory(path, trust.DUMP, create=False)
    return path
