"""kvplan's vLLM general plugin: every worker binds its KV cache from a validated plan.

Entry point ``vllm.general_plugins: kvplan = kvplan.integrations.vllm.plugin:register``.
vLLM calls :func:`register` in every process (API server, engine core, workers), possibly
several times. It does nothing unless ``KVPLAN_ENABLE=1`` (checked first, before any
import). When enabled it checks the vLLM version and every patch target, then wraps them
all, or raises ``KVPlanError`` (``KVP501``) and wraps none. What is wrapped, and the handler
each wrapper runs, comes from the vLLM release's adapter (``versions/``); the handlers drive
the pipeline (``kvplan.integrations.vllm.pipeline``) in the mode ``KVPLAN_MODE`` names (eager,
or elastic serving from ``kvplan.integrations.vllm.elastic``), decided once here. Every check
runs in ``_preflight``, which ``kvplan doctor`` runs too. See ``docs/integration.md``.
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
    from kvplan.integrations.vllm.pipeline import Handler, Runtime
    from kvplan.integrations.vllm.pipeline.settings import Settings
    from kvplan.integrations.vllm.plugin._preflight import Preflight
    from kvplan.integrations.vllm.versions import Resolved
    from kvplan.schemas.errors import Diagnostic

__all__ = [
    "active_settings",
    "bound_caches",
    "check_patches",
    "is_active",
    "preflight",
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
    from kvplan.integrations.vllm.pipeline.settings import ENV_ENABLE, flag

    on, malformed = flag(os.environ, ENV_ENABLE)
    if not on and malformed is None:
        return  # a malformed value goes on: _activate refuses it with KVP501
    with _LOCK:
        if _STATE is not None:
            return
        _activate()


def _activate() -> None:
    global _STATE
    import vllm

    from kvplan.integrations.vllm.pipeline import HANDLERS, Runtime, refusals
    from kvplan.integrations.vllm.pipeline.announce import announce
    from kvplan.integrations.vllm.plugin._preflight import preflight
    from kvplan.schemas.errors import KVPlanError

    version = str(getattr(vllm, "__version__", "unknown"))
    try:
        found = preflight(vllm_version=version)
    except KVPlanError as exc:
        raise announce(refusals.plugin_refused(version, exc.diagnostics)) from None
    except Exception as exc:  # whatever it is, vLLM sees kvplan's refusal, not a traceback
        problem = refusals.internal(exc, "kvplan.integrations.vllm.plugin")
        raise announce(refusals.plugin_refused(version, [problem])) from exc
    settings, mode, adapter = found.settings, found.mode, found.adapter
    handlers = {**HANDLERS, **mode.handlers()}
    for resolved in found.resolved:
        name = resolved.target.handler
        if resolved.target.patched and (name is None or name not in handlers):
            found.problems.append(refusals.no_handler(resolved.target.name, name, mode.name))
    if found.problems:
        raise announce(refusals.plugin_refused(version, found.problems))
    if not settings.enabled or adapter is None:
        return
    readers = {r.target.name: r.value for r in found.resolved if not r.target.patched}
    runtime = Runtime(settings, mode, adapter, version, readers=readers, unpatched=_unpatched_sites)
    state = _State(runtime)
    try:
        for resolved in found.resolved:
            if not resolved.target.patched:
                continue
            handler = handlers[str(resolved.target.handler)]
            wrapper = _wrap(resolved, runtime, handler)
            state.patches.append(_Patch(resolved, resolved.value, wrapper))
            setattr(resolved.holder, resolved.attr, wrapper)
    except BaseException:
        _restore(state)
        raise
    _STATE = state


def preflight(
    environ: Mapping[str, str] | None = None, vllm_version: str | None = None
) -> Preflight:
    """Every check :func:`register` runs before it wraps anything (``kvplan doctor`` asks
    this too): settings, the mode's own settings, backend, dump directory, the release's
    adapter, the mode's support for it, every target. ``vllm_version`` ``None`` leaves the
    release checks out (vLLM is not importable)."""
    from kvplan.integrations.vllm.plugin._preflight import preflight as run

    return run(environ, vllm_version)


def _wrap(resolved: Resolved, runtime: Runtime, handler: Handler) -> Callable[..., Any]:
    """The wrapper vLLM calls instead of ``resolved``: ``handler`` while active."""
    from kvplan.integrations.vllm.pipeline import Call, positions_of

    original = resolved.value
    target = resolved.target
    sig = inspect.signature(original)
    positions = positions_of(sig)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not runtime.active:
            return original(*args, **kwargs)
        return handler(runtime, Call(original, sig, target, args, kwargs, positions))

    setattr(wrapper, "__kvplan_wrapper__", True)  # noqa: B010
    setattr(wrapper, "__kvplan_site__", target.name)  # noqa: B010
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
    from kvplan.integrations.vllm.pipeline import refusals

    return [refusals.site_unwrapped(name) for name in _unpatched_sites()]


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
    from kvplan.integrations.vllm.pipeline import live_caches

    return live_caches()


def release_all() -> None:
    """Close every KV cache the plugin bound; their tensors must not be used afterwards."""
    from kvplan.integrations.vllm.pipeline import release_all as _release

    _release()
