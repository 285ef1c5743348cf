"""vLLM's multiprocess metrics mode: ``PROMETHEUS_MULTIPROC_DIR`` set (by the user, or by
vLLM for ``--api-server-count`` > 1). ``/metrics`` then shows only what the processes wrote
into that directory (prometheus_client's ``MultiProcessCollector``), so a collector in the
API server's registry would never be asked. One thread of one API server (rank 0) instead
writes kvplan's samples there, every :data:`MIRROR_SECONDS`, in prometheus_client's own file
format: one file per metric type, each replaced whole (written beside, then renamed over), so
a series that went away leaves no stale value and a reader sees one refresh or the next.
Counters and histograms are written once (by one process): the collector sums such files over
processes, and two writers would double them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from kvplan.integrations.vllm.metrics._collector import Reader, Sample

logger = logging.getLogger("vllm.kvplan")

MIRROR_SECONDS = 0.5
"""How often the mirror rewrites its files (the stats files' own refresh period)."""
ENV_MULTIPROC = "PROMETHEUS_MULTIPROC_DIR"


def multiproc_dir() -> Path | None:
    named = os.environ.get(ENV_MULTIPROC)
    return Path(named) if named else None


def file_names(ident: str) -> dict[str, str]:
    """The files this process writes, by metric type, in prometheus_client's naming (type,
    the gauge's multiprocess mode, then a process id: here ``kvplan<pid>``)."""
    return {
        "gauge": f"gauge_mostrecent_{ident}.db",
        "counter": f"counter_{ident}.db",
        "histogram": f"histogram_{ident}.db",
    }


def write_samples(directory: Path, samples: Iterable[Sample], ident: str) -> None:
    """Write ``samples`` into ``directory`` as prometheus_client's multiprocess files."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key
    from prometheus_client.utils import floatToGoString

    from kvplan.elastic.files import STEP_SECONDS_BUCKETS

    bounds = [floatToGoString(b) for b in STEP_SECONDS_BUCKETS] + ["+Inf"]
    rows: dict[str, list[tuple[str, float]]] = {"gauge": [], "counter": [], "histogram": []}
    for s in samples:
        m = s.metric
        labels = list(m.labels)
        values = list(s.labels)
        if m.kind == "histogram":
            counts, total = s.value
            for bound, count in zip(bounds, counts, strict=True):
                key = mmap_key(
                    m.family, f"{m.family}_bucket", [*labels, "le"], [*values, bound], m.help
                )
                rows["histogram"].append((key, float(count)))
            rows["histogram"].append(
                (mmap_key(m.family, f"{m.family}_sum", labels, values, m.help), float(total))
            )
        elif m.kind == "counter":
            key = mmap_key(m.family, f"{m.family}_total", labels, values, m.help)
            rows["counter"].append((key, float(s.value)))
        else:
            rows["gauge"].append((mmap_key(m.family, m.family, labels, values, m.help), s.value))
    now = time.time()
    for kind, name in file_names(ident).items():
        final = directory / name
        temporary = directory / f".{name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        store = MmapedDict(str(temporary))
        try:
            for key, value in rows[kind]:
                store.write_value(key, float(value), now)
        finally:
            store.close()
        os.replace(temporary, final)


def remove_dead(directory: Path) -> list[str]:
    """Remove the files of earlier mirrors whose process is gone (a directory the user set and
    reused: their counters would be summed with ours, their series shown as current); the
    names removed."""
    removed = []
    for kind in file_names("*").values():
        for path in directory.glob(kind):
            pid = path.name.rsplit("_kvplan", 1)[-1].removesuffix(".db")
            if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Mirror:
    """The thread that keeps this process's multiprocess files current."""

    def __init__(self, reader: Reader, directory: Path) -> None:
        self.reader = reader
        self.directory = directory
        self.ident = f"kvplan{os.getpid()}"
        remove_dead(directory)
        self._stop = threading.Event()
        self._warned = False
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="kvplan-metrics", daemon=True)
        self._thread.start()

    def refresh(self) -> None:
        try:
            write_samples(self.directory, self.reader.samples(), self.ident)
        except Exception as exc:  # never the API server's problem
            if not self._warned:
                self._warned = True
                logger.warning("kvplan metrics: cannot write %s: %r", self.directory, exc)

    def _run(self) -> None:
        while not self._stop.wait(MIRROR_SECONDS):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
