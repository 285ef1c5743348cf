"""Lifetime of the KV caches the vLLM plugin binds.

A cache lives as long as the runner that owns it (``weakref.finalize``, which also runs at
interpreter exit); a runner that binds again closes its previous cache first. Caches bound
without a runner live until :func:`release_all` or exit.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvplan.executor import BoundKVCache

logger = logging.getLogger("vllm.kvplan")

_LOCK = threading.RLock()
_OWNED: dict[int, tuple[weakref.finalize, list[BoundKVCache]]] = {}
_UNOWNED: list[BoundKVCache] = []
_ATEXIT = False


def _close_quietly(caches: list[BoundKVCache]) -> None:
    from kvplan.integrations.vllm._elastic import detach_cache

    while caches:
        cache = caches.pop()
        try:
            cache.close()
        except Exception as exc:  # shutdown must go on; say what leaked
            logger.warning("kvplan: closing a KV cache failed: %s", exc)
        try:
            detach_cache(cache)  # elastic: the last stats snapshot
        except Exception as exc:  # best effort at shutdown
            logger.warning("kvplan: final elastic stats failed: %s", exc)


def _close_owned(key: int, caches: list[BoundKVCache]) -> None:
    with _LOCK:
        entry = _OWNED.get(key)
        if entry is not None and entry[1] is caches:
            del _OWNED[key]
    _close_quietly(caches)


def keep(owner: Any, cache: BoundKVCache) -> None:
    """Keep ``cache`` alive as long as ``owner`` (a runner); without one, until release."""
    global _ATEXIT
    with _LOCK:
        if owner is not None:
            entry = _OWNED.get(id(owner))
            if entry is None:
                caches: list[BoundKVCache] = []
                try:
                    finalizer = weakref.finalize(owner, _close_owned, id(owner), caches)
                except TypeError:  # not weak-referenceable: keep until release_all
                    finalizer = None
                if finalizer is not None:
                    entry = _OWNED[id(owner)] = (finalizer, caches)
            if entry is not None:
                entry[1].append(cache)
                return
        _UNOWNED.append(cache)
        if not _ATEXIT:
            atexit.register(release_all)
            _ATEXIT = True


def release_owner(owner: Any) -> None:
    """Close the caches ``owner`` holds (it is binding a new one)."""
    if owner is None:
        return
    with _LOCK:
        entry = _OWNED.get(id(owner))
        caches = list(entry[1]) if entry else []
        if entry:
            entry[1].clear()
    _close_quietly(caches)


def release_all() -> None:
    """Close every cache the plugin bound (tests, shutdown)."""
    with _LOCK:
        finalizers = [entry[0] for entry in _OWNED.values()]
        unowned = list(_UNOWNED)
        _UNOWNED.clear()
    for finalizer in finalizers:
        finalizer()
    _close_quietly(unowned)


def live_caches() -> list[BoundKVCache]:
    """Every cache the plugin bound that is still open."""
    with _LOCK:
        caches = [c for entry in _OWNED.values() for c in entry[1]] + list(_UNOWNED)
    return [c for c in caches if not c.closed]
