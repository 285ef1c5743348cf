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

from kvplan.schemas.errors import Code, Diagnostic, error

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
    raw_dir = env.get(ENV_DUMP_DIR, "").strip()
    dump_dir = Path(raw_dir).expanduser() if raw_dir else None
    raw_plans = env.get(ENV_PLAN_DIR, "").strip()
    plan_dir = Path(raw_plans).expanduser() if raw_plans else None
    if plan_dir is not None and not plan_dir.is_dir():
        problems.append(
            error(
                Code.REVIEWED_PLAN_MISSING,
                ENV_PLAN_DIR,
                f"{ENV_PLAN_DIR}={raw_plans!r} is not a directory of reviewed plans.",
                f"point {ENV_PLAN_DIR} at a directory `kvplan golden` wrote, or unset it",
            )
        )
    return Settings(enabled, backend, mode, dump_dir, strict, plan_dir), problems


def prepare_dump_dir(path: Path) -> Diagnostic | None:
    """Create ``path`` if needed; a ``KVP501`` error if it cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return error(
            Code.INTEGRATION,
            ENV_DUMP_DIR,
            f"cannot create the dump directory {str(path)!r}: {exc.strerror or exc}.",
            f"point {ENV_DUMP_DIR} at a writable directory, or unset it",
        )
    if not os.access(path, os.W_OK):
        return error(
            Code.INTEGRATION,
            ENV_DUMP_DIR,
            f"the dump directory {str(path)!r} is not writable.",
            f"point {ENV_DUMP_DIR} at a writable directory, or unset it",
        )
    return None
