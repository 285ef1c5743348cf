"""The plugin's ``KVPLAN_*`` settings, read from the environment (no torch, no vLLM).

Shared by the plugin (which refuses to start on a bad value) and ``kvplan doctor`` (which
reports it). Backend availability is probed without initialising CUDA.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvplan.integrations.vllm._elastic import ElasticSettings, read_elastic_settings
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error

ENV_ENABLE = "KVPLAN_ENABLE"
ENV_BACKEND = "KVPLAN_BACKEND"
ENV_MODE = "KVPLAN_MODE"
ENV_DUMP_DIR = "KVPLAN_DUMP_DIR"
ENV_STRICT = "KVPLAN_STRICT"
ENV_PLAN_DIR = "KVPLAN_PLAN_DIR"

BACKENDS = ("cuda-vmm", "torch", "host-vmm")
"""Backends the plugin binds with (``meta`` tensors cannot hold a cache)."""
DEFAULT_BACKEND = "cuda-vmm"
MODES = ("eager", "elastic")
DEFAULT_MODE = "eager"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def _flag(environ: Mapping[str, str], name: str) -> tuple[bool, Diagnostic | None]:
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


def is_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``KVPLAN_ENABLE`` asks for the plugin (a malformed value raises ``KVP501``)."""
    on, problem = _flag(os.environ if environ is None else environ, ENV_ENABLE)
    if problem is not None:
        raise KVPlanError(problem)
    return on


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
    elastic: ElasticSettings = field(default_factory=lambda: ElasticSettings())
    """Elastic mode's limits and debug settings (read only when ``mode`` is elastic)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "enabled": self.enabled,
            "backend": self.backend,
            "mode": self.mode,
            "dump_dir": None if self.dump_dir is None else str(self.dump_dir),
            "strict": self.strict,
            "plan_dir": None if self.plan_dir is None else str(self.plan_dir),
            **({"elastic": self.elastic.as_dict()} if self.mode == "elastic" else {}),
        }


def read_settings(environ: Mapping[str, str] | None = None) -> tuple[Settings, list[Diagnostic]]:
    """The settings in ``environ`` and every problem with them (``KVP501`` errors)."""
    env = os.environ if environ is None else environ
    problems: list[Diagnostic] = []
    enabled, bad = _flag(env, ENV_ENABLE)
    problems.extend([bad] if bad else [])
    strict, bad = _flag(env, ENV_STRICT)
    problems.extend([bad] if bad else [])
    backend = env.get(ENV_BACKEND, "").strip() or DEFAULT_BACKEND
    if backend not in BACKENDS:
        problems.append(
            error(
                Code.INTEGRATION,
                ENV_BACKEND,
                f"{ENV_BACKEND}={backend!r} is not a backend the vLLM plugin can bind with.",
                f"use one of: {', '.join(BACKENDS)}",
            )
        )
        backend = DEFAULT_BACKEND
    mode = env.get(ENV_MODE, "").strip() or DEFAULT_MODE
    if mode not in MODES:
        problems.append(
            error(
                Code.INTEGRATION,
                ENV_MODE,
                f"{ENV_MODE}={mode!r} is not a mode.",
                f"use one of: {', '.join(MODES)}",
            )
        )
        mode = DEFAULT_MODE
    if mode == "elastic" and backend == "torch":
        problems.append(
            error(
                Code.INTEGRATION,
                ENV_MODE,
                "the torch backend commits all memory up front and cannot run elastic mode.",
                f"set {ENV_BACKEND}=cuda-vmm (or host-vmm on a CPU), or {ENV_MODE}=eager",
            )
        )
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
    elastic = ElasticSettings()
    if mode == "elastic":
        elastic, bad_elastic = read_elastic_settings(env)
        problems.extend(bad_elastic)
    settings = Settings(enabled, backend, mode, dump_dir, strict, plan_dir, elastic)
    return settings, problems


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


def _find_spec(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def cuda_driver_library() -> str | None:
    """The CUDA driver library this process can load (``libcuda.so.1``), else ``None``.

    Loading the library creates no CUDA context.
    """
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return None


def memfd_works() -> tuple[bool, str]:
    """Whether ``os.memfd_create`` works in this process (creates and closes one memfd)."""
    create = getattr(os, "memfd_create", None)
    if create is None:
        return False, "this Python has no os.memfd_create"
    try:
        fd = create("kvplan-probe", getattr(os, "MFD_CLOEXEC", 0))
    except OSError as exc:
        return False, f"os.memfd_create: {exc.strerror or exc}"
    os.close(fd)
    return True, "os.memfd_create works"


def backend_status(name: str) -> tuple[bool, str]:
    """Whether backend ``name`` can work in this process, and why (no CUDA context made)."""
    if name == "torch":
        return True, "plain torch allocations on the worker's device (what vLLM does)"
    if name == "host-vmm":
        import sys

        if not sys.platform.startswith("linux"):
            return False, "host-vmm needs Linux (mmap, memfd_create)"
        works, why = memfd_works()
        if not works:
            return False, f"host-vmm needs memfd_create, which fails here ({why})"
        return True, "CPU VMM twin (mmap/memfd, memfd_create works); only for workers on the CPU"
    if name == "cuda-vmm":
        if not (_find_spec("cuda.bindings") or _find_spec("cuda.cuda")):
            return False, "cuda-python is not installed (pip install cuda-python)"
        library = cuda_driver_library()
        if library is None:
            return False, "no CUDA driver library (libcuda.so.1) can be loaded"
        return True, f"cuda-python and the CUDA driver ({library}) are present"
    return False, f"unknown backend {name!r}"
