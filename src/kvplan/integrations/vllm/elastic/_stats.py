"""The elastic stats files: ``<KVPLAN_DUMP_DIR>/rank<N>.stats.json``, written off the step path
(:class:`StatsReporter`), read by ``kvplan top`` (the format is ``kvplan.elastic.files``)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvplan.schemas.errors import KVPlanError

logger = logging.getLogger("vllm.kvplan")

STATS_PERIOD_SECONDS = 0.5
"""A worker writes its stats file at most this often while figures change."""


def engine_name(dump_dir: Path | None) -> str:
    """How ``kvplan top`` names this engine: ``KVPLAN_ENGINE_NAME``, else the dump dir's name."""
    name = os.environ.get("KVPLAN_ENGINE_NAME", "").strip()
    if name:
        return name[:80]
    return dump_dir.name if dump_dir is not None else "engine"


class StatsReporter:
    """Writes ``<dump dir>/rank<N>.stats.json`` atomically: at bind, within
    :data:`STATS_PERIOD_SECONDS` of a change, and when the cache closes. Snapshots and writes
    (an fsync each) run on its own thread, off the step path."""

    def __init__(self, directory: Path, snapshot: Callable[[], Any]) -> None:
        self.directory = directory
        self.snapshot = snapshot
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._run, name="kvplan-stats", daemon=True)
        self._thread.start()

    def changed(self) -> None:
        self._dirty.set()

    def _write(self) -> None:
        from kvplan.elastic.files import write_stats

        try:
            write_stats(self.directory, self.snapshot())
        except (OSError, KVPlanError) as exc:
            logger.warning("kvplan: cannot write elastic stats: %s", exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._dirty.wait(STATS_PERIOD_SECONDS) and not self._stop.is_set():
                self._dirty.clear()
                self._write()
                self._stop.wait(STATS_PERIOD_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._thread.join(timeout=2)
        self._write()
