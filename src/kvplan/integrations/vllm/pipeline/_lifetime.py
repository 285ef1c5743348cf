"""Lifetime of the KV caches the vLLM plugin binds.

A cache lives as long as the runner that owns it (``weakref.finalize``, which also runs at
interpreter exit); a runner that binds again closes its previous cache first. Caches bound
without a runner live until :func:`release_all` or exit. A cache may come with a callback the
binding mode gave (``on_close``: elastic mode's last stats snapshot), run after it closes.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvplan.executor import BoundKVCache

logger = logging.getLogger("vllm.kvplan")

_LOCK = threading.RLock()
OnClose = Callable[[], None]
_Kept = tuple["BoundKVCache", "OnClose | None"]

_OWNED: dict[int, tuple[weakref.finalize, list[_Kept]]] = {}
_UNOWNED: list[_Kept] = []
_ATEXIT = False


def _close_quietly(caches: list[_Kept]) -> None:
    while caches:
        cache, on_close = caches.pop()
        try:
            cache.close()
        except Exception as exc:  # shutdown must go on; say what leaked
            logger.warning("kvplan: closing a KV cache failed: %s", exc)
        if on_close is None:
            continue
        try:
            on_close()
        except Exception as exc:  # best effort at shutdown
            logger.warning("kvplan: after closing a KV cache: %s", exc)


def _close_owned(key: int, caches: list[_Kept]) -> None:
    with _LOCK:
        entry = _OWNED.get(key)
        if entry is not None and entry[1] is caches:
            del _OWNED[key]
    _close_quietly(caches)


def keep(owner: Any, cache: BoundKVCache, on_close: OnClose | None = None) -> None:
    """Keep ``cache`` alive as long as ``owner`` (a runner); without one, until release.
    ``on_close`` runs after the cache is closed."""
    global _ATEXIT
    kept: _Kept = (cache, on_close)
    with _LOCK:
        if owner is not None:
            entry = _OWNED.get(id(owner))
            if entry is None:
                caches: list[_Kept] = []
                try:
                    finalizer = weakref.finalize(owner, _close_owned, id(owner), caches)
                except TypeError:  # not weak-referenceable: keep until release_all
                    finalizer = None
                if finalizer is not None:
                    entry = _OWNED[id(owner)] = (finalizer, caches)
            if entry is not None:
                entry[1].append(kept)
                return
        _UNOWNED.append(kept)
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


def discard(cache: BoundKVCache) -> None:
    """Close ``cache`` now and forget it: kvplan refused what vLLM did with it."""
    found: list[_Kept] = []
    with _LOCK:
        for _, caches in _OWNED.values():
            found.extend(kept for kept in caches if kept[0] is cache)
            caches[:] = [kept for kept in caches if kept[0] is not cache]
        found.extend(kept for kept in _UNOWNED if kept[0] is cache)
        _UNOWNED[:] = [kept for kept in _UNOWNED if kept[0] is not cache]
    _close_quietly(found or [(cache, None)])


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
        kept = [k for entry in _OWNED.values() for k in entry[1]] + list(_UNOWNED)
    return [cache for cache, _ in kept if not cache.closed]
