"""The elastic stats files: ``<KVPLAN_DUMP_DIR>/rank<N>.stats.json``, written off the step path
(:class:`StatsReporter`), read by ``kvplan top`` (the format is ``kvplan.elastic.files``)."""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvplan.elastic.files import HEARTBEAT_SECONDS, STEP_SECONDS_BUCKETS
from kvplan.schemas.errors import KVPlanError

logger = logging.getLogger("vllm.kvplan")

STATS_PERIOD_SECONDS = 0.5
"""A worker writes its stats file at most this often while figures change."""
EXIT_WRITE_SECONDS = 5.0
"""A signal's last snapshot waits at most this long for a write in progress."""


def count_step(counts: dict[str, list[int]], kind: str, started: float) -> float:
    """The seconds since ``started`` (``time.perf_counter()``), counted in ``counts[kind]``:
    one step in the bucket of :data:`~kvplan.elastic.files.STEP_SECONDS_BUCKETS` it falls in
    (the ``_seconds`` histograms of ``/metrics``). A bisection and an addition: step-path safe."""
    seconds = time.perf_counter() - started
    found = counts.get(kind)
    if found is None:
        found = counts[kind] = [0] * (len(STEP_SECONDS_BUCKETS) + 1)
    found[bisect.bisect_left(STEP_SECONDS_BUCKETS, seconds)] += 1
    return seconds


def engine_name(dump_dir: Path | None) -> str:
    """How ``kvplan top`` names this engine: ``KVPLAN_ENGINE_NAME``, else the dump dir's name."""
    name = os.environ.get("KVPLAN_ENGINE_NAME", "").strip()
    if name:
        return name[:80]
    return dump_dir.name if dump_dir is not None else "engine"


class StatsReporter:
    """Writes ``<dump dir>/rank<N>.stats.json`` atomically: at bind, within
    :data:`STATS_PERIOD_SECONDS` of a change, at least every
    :data:`~kvplan.elastic.files.HEARTBEAT_SECONDS` while nothing changes (the heartbeat:
    ``kvplan top`` calls an engine stale only when its writer stopped), and when the cache
    closes. Snapshots and writes (an fsync each) run on its own thread, off the step path;
    the last one also on SIGTERM/SIGINT (:func:`on_exit_signal`)."""

    def __init__(self, directory: Path, snapshot: Callable[[], Any]) -> None:
        self.directory = directory
        self.snapshot = snapshot
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.RLock()  # re-entrant: a signal handler may write mid-write
        self._written = 0.0
        self._write()
        self._thread = threading.Thread(target=self._run, name="kvplan-stats", daemon=True)
        self._thread.start()

    def changed(self) -> None:
        self._dirty.set()

    def _write(self, wait: float = -1) -> None:
        """One snapshot, written. ``wait``: how long to wait for a write in progress on the
        reporter's thread (a signal's last snapshot must not hang its process; ``-1``: as
        long as it takes)."""
        from kvplan.elastic.files import write_stats

        if not self._lock.acquire(timeout=wait):
            logger.warning("kvplan: the last elastic stats snapshot was not written in time")
            return
        try:
            try:
                write_stats(self.directory, self.snapshot())
            except (OSError, KVPlanError) as exc:
                logger.warning("kvplan: cannot write elastic stats: %s", exc)
            self._written = time.monotonic()
        finally:
            self._lock.release()

    def _run(self) -> None:
        while not self._stop.is_set():
            changed = self._dirty.wait(STATS_PERIOD_SECONDS)
            if self._stop.is_set():
                break
            if changed:
                self._dirty.clear()
                self._write()
                self._stop.wait(STATS_PERIOD_SECONDS)
            elif time.monotonic() - self._written >= HEARTBEAT_SECONDS:
                self._write()  # the heartbeat: same figures, a new time

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._thread.join(timeout=2)
        self._write()


_EXIT_HOOKS: list[Callable[[], None]] = []
_EXIT_LOCK = threading.Lock()
_INSTALLED: set[int] = set()


def on_exit_signal(hook: Callable[[], None]) -> None:
    """Run ``hook`` (a last stats snapshot) when this process gets SIGTERM or SIGINT, then
    whatever handled the signal before (vLLM's own shutdown, Python's KeyboardInterrupt, or
    the default action). Installed once per signal, from the main thread only (elsewhere the
    interpreter allows no handler: the cache's close still writes the last snapshot)."""
    with _EXIT_LOCK:
        _EXIT_HOOKS.append(hook)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig in _INSTALLED:
                continue
            try:
                signal.signal(sig, _chained(sig, signal.getsignal(sig)))
            except (ValueError, OSError):  # not the main interpreter, or not allowed
                continue
            _INSTALLED.add(sig)


def forget_exit_hook(hook: Callable[[], None]) -> None:
    with _EXIT_LOCK:
        if hook in _EXIT_HOOKS:
            _EXIT_HOOKS.remove(hook)


def _chained(sig: int, previous: Any) -> Callable[[int, Any], Any]:
    def handler(signum: int, frame: Any) -> Any:
        for hook in list(_EXIT_HOOKS):
            with contextlib.suppress(Exception):  # the signal must still do what it did
                hook()
        if callable(previous):
            return previous(signum, frame)
        if previous == signal.SIG_IGN:
            return None
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return None

    return handler
