"""Backend registry: name → factory, imported lazily (no torch or cuda-python at import)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from kvplan.executor.backends.base import (
    OPS,
    Backend,
    BackendCallError,
    CallLog,
    LiveResources,
    TrackedBackend,
)
from kvplan.executor.backends.faults import FaultyBackend
from kvplan.schemas.errors import Code, KVPlanError, error

BackendFactory = Callable[..., Backend]

BACKENDS: dict[str, str | BackendFactory] = {
    "meta": "kvplan.executor.backends.meta:MetaBackend",
    "torch": "kvplan.executor.backends.torch_backend:TorchBackend",
    "host-vmm": "kvplan.executor.backends.host_vmm:HostVmmBackend",
    "cuda-vmm": "kvplan.executor.backends.cuda_vmm:CudaVmmBackend",
}
"""Registered backends: a factory, or ``"module:attr"`` imported on first use."""


def register_backend(name: str, factory: str | BackendFactory) -> None:
    """Register (or replace) backend ``name``; ``factory(device=..., **options)``."""
    BACKENDS[name] = factory


def create_backend(name: str, *, device: str | None = None, **options: Any) -> Backend:
    """Instantiate backend ``name``; unknown names raise ``KVP401``."""
    factory = BACKENDS.get(name)
    if factory is None:
        raise KVPlanError(
            error(
                Code.BACKEND_UNAVAILABLE,
                "backend",
                f"Unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}.",
                "pick one of the known backends",
            )
        )
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    kwargs = dict(options)
    if device is not None:
        kwargs["device"] = device
    try:
        return factory(**kwargs)
    except TypeError as exc:
        raise KVPlanError(
            error(Code.BACKEND_UNAVAILABLE, "backend", f"Backend {name!r}: {exc}.")
        ) from None


__all__ = [
    "BACKENDS",
    "OPS",
    "Backend",
    "BackendCallError",
    "CallLog",
    "FaultyBackend",
    "LiveResources",
    "TrackedBackend",
    "create_backend",
    "register_backend",
]
