"""kvplan's vLLM general plugin: every worker binds its KV cache from a validated plan.

Entry point ``vllm.general_plugins: kvplan = kvplan.integrations.vllm.plugin:register``.
vLLM calls :func:`register` in every process (API server, engine core, workers), possibly
several times. It does nothing unless ``KVPLAN_ENABLE=1`` (checked first, before any
import). When enabled it checks the vLLM version and every patch target, then wraps them
all, or raises ``KVPlanError`` (``KVP501``) and wraps none. See ``docs/integration.md``.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvplan.executor import BoundKVCache
    from kvplan.integrations.vllm._patch_runtime import Runtime
    from kvplan.integrations.vllm._patch_settings import Settings
    from kvplan.integrations.vllm._patch_targets import Resolved
    from kvplan.schemas.errors import Diagnostic

__all__ = [
    "active_settings",
    "bound_caches",
    "check_patches",
    "is_active",
    "register",
    "release_all",
    "stats",
    "unregister",
]


@dataclass
class _Patch:
    resolved: Resolved
    original: Any
    wrapper: Any


@dataclass
class _State:
    runtime: Runtime
    patches: list[_Patch] = field(default_factory=list)


_LOCK = threading.RLock()
_STATE: _State | None = None


def register() -> None:
    """vLLM's entry point: patch the KV-cache allocation sites if ``KVPLAN_ENABLE=1``.

    Idempotent. Raises :class:`~kvplan.schemas.errors.KVPlanError` (``KVP501``) for a bad
    setting, an unsupported vLLM version or a missing/changed patch target; then nothing is
    patched and vLLM does not start.
    """
    if os.environ.get("KVPLAN_ENABLE", "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    with _LOCK:
        if _STATE is not None:
            return
        _activate()


def _activate() -> None:
    global _STATE
    import vllm
    from kvplan.integrations.vllm import _patch_targets as targets
    from kvplan.integrations.vllm._patch_runtime import Runtime
    from kvplan.integrations.vllm._patch_settings import (
        backend_status,
        prepare_dump_dir,
        read_settings,
    )
    from kvplan.schemas.errors import Code, KVPlanError, error

    settings, problems = read_settings()
    if settings.enabled and not problems:
        usable, why = backend_status(settings.backend)
        if not usable:
            problems.append(
                error(
                    Code.INTEGRATION,
                    "KVPLAN_BACKEND",
                    f"the {settings.backend} backend is unavailable: {why}.",
                    "set KVPLAN_BACKEND=torch (any device) or install what it needs",
                )
            )
        if settings.dump_dir is not None:
            bad = prepare_dump_dir(settings.dump_dir)
            problems.extend([bad] if bad else [])
    version = str(getattr(vllm, "__version__", "unknown"))
    found, target_problems = targets.resolve_all(version)
    problems.extend(target_problems)
    if problems:
        reasons = " | ".join(p.render() for p in problems)
        lead = error(
            Code.INTEGRATION,
            __name__,
            f"kvplan's vLLM plugin refused to start (vLLM {version}): {reasons}",
            "or unset KVPLAN_ENABLE to start vLLM without kvplan",
        )
        raise KVPlanError([lead, *problems])
    if not settings.enabled:
        return
    readers = {r.target.qualname: r.value for r in found if r.target.role == targets.READ}
    shared_v2: Callable[[Any], Mapping[str, str]] = readers["get_shared_kv_cache_layers"]
    runtime = Runtime(settings, version, shared_v2=shared_v2, unpatched=_unpatched_sites)
    state = _State(runtime)
    try:
        for resolved in found:
            if resolved.target.role == targets.READ:
                continue
            wrapper = _wrap(resolved, runtime)
            state.patches.append(_Patch(resolved, resolved.value, wrapper))
            setattr(resolved.holder, resolved.attr, wrapper)
    except BaseException:
        _restore(state)
        raise
    _STATE = state


def _wrap(resolved: Resolved, runtime: Runtime) -> Callable[..., Any]:
    from kvplan.integrations.vllm._patch_runtime import Call

    original = resolved.value
    site = resolved.target.name
    sig = inspect.signature(original)
    handler = runtime.handler(resolved.target.role)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return handler(Call(original, sig, site, args, kwargs))

    setattr(wrapper, "__kvplan_wrapper__", True)  # noqa: B010
    setattr(wrapper, "__kvplan_site__", site)  # noqa: B010
    return wrapper


def _current(patch: _Patch) -> Any:
    holder, attr = patch.resolved.holder, patch.resolved.attr
    return vars(holder).get(attr) if isinstance(holder, type) else getattr(holder, attr, None)


def _restore(state: _State) -> list[str]:
    """Put every original back where kvplan's wrapper still sits; the sites left alone."""
    skipped = []
    for patch in reversed(state.patches):
        if _current(patch) is patch.wrapper:
            setattr(patch.resolved.holder, patch.resolved.attr, patch.original)
        else:
            skipped.append(patch.resolved.target.name)
    return skipped


def unregister(*, release: bool = True) -> None:
    """Undo :func:`register` (for tests): restore every patched site; close bound caches.

    A site someone else re-patched after kvplan is left as it is.
    """
    global _STATE
    with _LOCK:
        state, _STATE = _STATE, None
        if state is None:
            return
        state.runtime.active = False
        _restore(state)
    if release:
        release_all()


def _unpatched_sites() -> list[str]:
    state = _STATE
    if state is None:
        return []
    return [p.resolved.target.name for p in state.patches if _current(p) is not p.wrapper]


def check_patches() -> list[Diagnostic]:
    """``KVP501`` for every site kvplan patched that no longer holds kvplan's wrapper.

    Empty when the plugin is inactive (nothing to watch) or every site is wrapped.
    """
    from kvplan.schemas.errors import Code, error

    return [
        error(
            Code.INTEGRATION,
            name,
            f"{name} is no longer kvplan's wrapper; calls through it bypass kvplan.",
            "something re-patched vLLM after kvplan; load kvplan's plugin last",
        )
        for name in _unpatched_sites()
    ]


def is_active() -> bool:
    """Whether the plugin has patched vLLM in this process."""
    return _STATE is not None


def active_settings() -> Settings | None:
    """The settings the active plugin runs with (``None`` when inactive)."""
    state = _STATE
    return state.runtime.settings if state else None


def stats() -> dict[str, int]:
    """Counters of the active plugin: ``plans``, ``bound``, ``profiling``, ``empty``,
    ``refused``, ``bypassed`` (all zero when inactive)."""
    keys = ("plans", "bound", "profiling", "empty", "refused", "bypassed")
    state = _STATE
    counts = state.runtime.stats if state else {}
    return {key: int(counts.get(key, 0)) for key in keys}


def bound_caches() -> list[BoundKVCache]:
    """The KV caches the plugin bound that are still open (e.g. for elastic control)."""
    from kvplan.integrations.vllm._patch_lifetime import live_caches

    return live_caches()


def release_all() -> None:
    """Close every KV cache the plugin bound; their tensors must not be used afterwards."""
    from kvplan.integrations.vllm._patch_lifetime import release_all as _release

    _release()
