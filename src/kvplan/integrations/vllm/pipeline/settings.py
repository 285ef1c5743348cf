"""The plugin's own ``KVPLAN_*`` settings, read from the environment (no torch, no vLLM).

Read through the plugin's one preflight (``kvplan.integrations.vllm.plugin.preflight``),
which the plugin (refusing to start on a bad value) and ``kvplan doctor`` (reporting it) both
run. A mode's own settings (elastic: ``KVPLAN_MEMORY_LIMIT`` ...) are read by the mode's room
and handed over; nothing here knows them. The backends the plugin accepts, and what each can
do, come from the executor's registry (:func:`kvplan.executor.backends.backend_info`), never
from names written here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvplan.schemas.errors import Code, Diagnostic, error, printable

ENV_ENABLE = "KVPLAN_ENABLE"
ENV_BACKEND = "KVPLAN_BACKEND"
ENV_MODE = "KVPLAN_MODE"
ENV_DUMP_DIR = "KVPLAN_DUMP_DIR"
ENV_STRICT = "KVPLAN_STRICT"
ENV_PLAN_DIR = "KVPLAN_PLAN_DIR"

DEFAULT_BACKEND = "cuda-vmm"
DEFAULT_MODE = "eager"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def flag(environ: Mapping[str, str], name: str) -> tuple[bool, Diagnostic | None]:
    """``(on, problem)``: the one reader of on/off settings; a malformed value is off with a
    ``KVP501`` problem."""
    raw = environ.get(name, "").strip().lower()
    if raw in _TRUE:
        return True, None
    if raw in _FALSE:
        return False, None
    return False, error(
        Code.INTEGRATION,
        name,
        f"{name}={environ.get(name)!r} is neither on nor off.",
        f"set {name}=1 or {name}=0",
    )


@dataclass(frozen=True)
class Settings:
    """What the plugin does when it is active."""

    enabled: bool
    backend: str = DEFAULT_BACKEND
    mode: str = DEFAULT_MODE
    dump_dir: Path | None = None
    strict: bool = False
    plan_dir: Path | None = None
    """Reviewed plans (``KVPLAN_PLAN_DIR``): a worker whose live plan differs refuses."""

    def as_dict(self) -> dict[str, object]:
        return {
            "enabled": self.enabled,
            "backend": self.backend,
            "mode": self.mode,
            "dump_dir": None if self.dump_dir is None else str(self.dump_dir),
            "strict": self.strict,
            "plan_dir": None if self.plan_dir is None else str(self.plan_dir),
        }


def read_settings(
    environ: Mapping[str, str] | None = None, modes: Sequence[str] = (DEFAULT_MODE,)
) -> tuple[Settings, list[Diagnostic]]:
    """The settings in ``environ`` and every problem with them (``KVP501`` errors);
    ``modes`` are the names ``KVPLAN_MODE`` may take."""
    from kvplan.executor.backends import backend_names

    env = os.environ if environ is None else environ
    problems: list[Diagnostic] = []
    enabled, bad = flag(env, ENV_ENABLE)
    problems.extend([bad] if bad else [])
    strict, bad = flag(env, ENV_STRICT)
    problems.extend([bad] if bad else [])
    backend = env.get(ENV_BACKEND, "").strip() or DEFAULT_BACKEND
    usable = backend_names(plugin=True)
    if backend not in usable:
        problems.append(
            error(
                Code.INTEGRATION,
                ENV_BACKEND,
                f"{ENV_BACKEND}={backend!r} is not a backend the vLLM plugin can bind with.",
                f"use one of: {', '.join(usable)}",
            )
        )
        backend = DEFAULT_BACKEND
    mode = env.get(ENV_MODE, "").strip() or DEFAULT_MODE
    if mode not in modes:
        problems.append(
            error(
                Code.INTEGRATION,
                ENV_MODE,
                f"{ENV_MODE}={mode!r} is not a mode.",
                f"use one of: {', '.join(modes)}",
            )
        )
        mode = DEFAULT_MODE
    dump_dir = directory_setting(env, ENV_DUMP_DIR, problems)
    plan_dir = directory_setting(env, ENV_PLAN_DIR, problems)
    raw_plans = env.get(ENV_PLAN_DIR, "").strip()
    if plan_dir is not None and not _is_dir(plan_dir):
        problems.append(
            error(
                Code.REVIEWED_PLAN_MISSING,
                ENV_PLAN_DIR,
                f"{ENV_PLAN_DIR}={raw_plans!r} is not a directory of reviewed plans.",
                f"point {ENV_PLAN_DIR} at a directory `kvplan golden` wrote, or unset it",
            )
        )
    return Settings(enabled, backend, mode, dump_dir, strict, plan_dir), problems


MAX_PATH_CHARS = 4096
"""Longer directory settings are refused (Linux's PATH_MAX)."""


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def directory_setting(env: Mapping[str, str], name: str, problems: list[Diagnostic]) -> Path | None:
    """The directory ``env[name]`` names (``~`` expanded), or ``None`` when unset; a value that
    is no usable path (a NUL byte, an unknown ``~user``, longer than :data:`MAX_PATH_CHARS`)
    is a ``KVP501`` problem."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    why = None
    if "\x00" in raw:
        why = "it holds a NUL byte"
    elif len(raw) > MAX_PATH_CHARS:
        why = f"it is longer than {MAX_PATH_CHARS} characters"
    else:
        try:
            return Path(raw).expanduser()
        except (RuntimeError, KeyError, ValueError) as exc:  # ~nosuchuser
            why = f"its home directory cannot be found ({exc})"
    problems.append(
        error(
            Code.INTEGRATION,
            name,
            f"{name}={raw[:80]!r} is not a usable directory path: {why}.",
            f"point {name} at a directory, or unset it",
        )
    )
    return None


def prepare_dump_dir(path: Path) -> Diagnostic | None:
    """Create ``path`` if needed (``0700`` whatever the umask), check that kvplan may take
    commands from it (:func:`kvplan.elastic.trust.check_directory`: not a link, this user's
    or root's, not writable by others unless sticky; ``KVP428`` naming the owner otherwise),
    and prove that kvplan can write files in it (a probe file is created and removed:
    ``/proc`` or a read-only mount passes ``os.access`` as root but takes no file); a
    ``KVP501`` error otherwise."""
    import tempfile

    from kvplan.elastic import trust
    from kvplan.schemas.errors import KVPlanError

    def refused(why: str) -> Diagnostic:
        return error(
            Code.INTEGRATION,
            ENV_DUMP_DIR,
            f"the dump directory {printable(str(path))!r} {why}.",
            f"point {ENV_DUMP_DIR} at a writable directory, or unset it",
        )

    try:
        trust.check_directory(path, trust.DUMP, create=True)
    except KVPlanError as exc:
        return exc.diagnostics[0]
    try:
        fd, probe = tempfile.mkstemp(prefix=".kvplan-probe-", dir=path)
    except OSError as exc:
        return refused(f"takes no file ({exc.strerror or exc})")
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError as exc:
        return refused(f"keeps files it cannot remove ({exc.strerror or exc})")
    return None


def check_plan_dir(path: Path) -> Diagnostic | None:
    """``KVP428`` unless kvplan may take reviewed plans from ``path`` (as the dump
    directory: :func:`kvplan.elastic.trust.check_directory`, never created)."""
    from kvplan.elastic import trust
    from kvplan.schemas.errors import KVPlanError

    try:
        trust.check_directory(path, trust.PLANS, create=False)
    except KVPlanError as exc:
        return exc.diagnostics[0]
    return None
