"""Backend registry: name → backend class, imported lazily (no torch or cuda-python at import).

A backend class carries what it can do (``info``, a :class:`BackendInfo`) and whether it can
run here (``available()``). Everything that depends on a backend — the CLI's ``--backend``
choices, the vLLM plugin's ``KVPLAN_BACKEND``, its planning granularity and placement
checks, ``kvplan doctor`` — reads the registry, so a class added with
:func:`register_backend` is usable everywhere without editing another module.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from kvplan.executor.backends.base import (
    PRIMITIVES,
    Backend,
    BackendCallError,
    BackendInfo,
    CallLog,
    LiveResources,
    TrackedBackend,
)
from kvplan.executor.backends.faults import FaultyBackend
from kvplan.schemas.errors import Code, KVPlanError, error


class BackendClass(Protocol):
    """What the registry holds: a backend class (or a factory carrying the same two
    attributes) — ``info``, ``available()``, and a constructor ``(device=..., **options)``."""

    info: BackendInfo

    def available(self) -> str | None: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Backend: ...


BACKENDS: dict[str, str | BackendClass] = {
    "meta": "kvplan.executor.backends.meta:MetaBackend",
    "torch": "kvplan.executor.backends.torch_backend:TorchBackend",
    "host-vmm": "kvplan.executor.backends.host_vmm:HostVmmBackend",
    "cuda-vmm": "kvplan.executor.backends.cuda_vmm:CudaVmmBackend",
}
"""Registered backends, in the order they are listed: a class, or ``"module:Class"``
imported on first use."""


def register_backend(name: str, backend: str | BackendClass) -> None:
    """Register (or replace) backend ``name``: a class (or ``"module:Class"``) with ``info``
    and ``available()``, constructed as ``backend(device=..., **options)``."""
    if not isinstance(backend, str):
        _check_class(name, backend)
    BACKENDS[name] = backend


def _check_class(name: str, backend: object) -> BackendClass:
    info = getattr(backend, "info", None)
    if not isinstance(info, BackendInfo) or not callable(getattr(backend, "available", None)):
        raise TypeError(
            f"backend {name!r}: {backend!r} has no BackendInfo `info` and `available()`; "
            "subclass kvplan.executor.backends.TrackedBackend or declare both"
        )
    return backend  # type: ignore[return-value]


def backend_class(name: str) -> BackendClass:
    """The class registered as ``name`` (imported on first use); unknown names: ``KVP401``."""
    entry = BACKENDS.get(name)
    if entry is None:
        known = ", ".join(BACKENDS)
        raise KVPlanError(
            error(Code.BACKEND_UNAVAILABLE, "backend", f"Unknown backend {name!r}; known: {known}.")
        )
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        return _check_class(name, getattr(importlib.import_module(module), attr))
    return entry


def backend_info(name: str) -> BackendInfo:
    """What backend ``name`` can do (``elastic``, ``granularity_default``, ``devices``, ...)."""
    return backend_class(name).info


def backend_names(*, plugin: bool = False) -> tuple[str, ...]:
    """Registered names in registration order; ``plugin=True``: only those that can hold a
    live vLLM KV cache (``info.plugin``)."""
    return tuple(name for name in BACKENDS if not plugin or backend_info(name).plugin)


def create_backend(name: str, *, device: str | None = None, **options: Any) -> Backend:
    """Instantiate backend ``name``; unknown names and bad options raise ``KVP401``."""
    cls = backend_class(name)
    kwargs = dict(options)
    if device is not None:
        kwargs["device"] = device
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise KVPlanError(
            error(Code.BACKEND_UNAVAILABLE, "backend", f"Backend {name!r}: {exc}.")
        ) from None


__all__ = [
    "BACKENDS",
    "PRIMITIVES",
    "Backend",
    "BackendCallError",
    "BackendClass",
    "BackendInfo",
    "CallLog",
    "FaultyBackend",
    "LiveResources",
    "TrackedBackend",
    "backend_class",
    "backend_info",
    "backend_names",
    "create_backend",
    "register_backend",
]
