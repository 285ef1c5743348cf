"""Which engines ``kvplan limit DIR SIZE`` changes: the ones ``kvplan top DIR`` shows.

``top DIR`` reads every ``rank<N>.stats.json`` in DIR and two subdirectory levels below it;
each engine reads ``limit.json`` in its own dump directory (the folder of its stats files).
So ``limit DIR`` writes ``limit.json`` into every folder below DIR that holds an engine's
stats (DIR itself when the engines dump there, ``dumps/llama/`` and ``dumps/gemma/`` for
``limit dumps/``), and refuses (``KVP429``) a DIR under which no engine dumps: a
``limit.json`` there would be read by nobody.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from kvplan.elastic.files import LIMIT_FILE, ElasticStats, read_stats_tree
from kvplan.elastic.status import EngineStatus, engine_status
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error, printable

GONE = ("closed", "dead")
"""Statuses of an engine that is not running now: it reads the limit when started again with
the same dump directory, and its floor does not warn."""


@dataclass(frozen=True)
class Engine:
    """One rank of an engine below DIR: its stats file, what it says, its status now."""

    path: Path
    stats: ElasticStats
    status: EngineStatus

    @property
    def folder(self) -> Path:
        """The engine's dump directory: where it reads ``limit.json``."""
        return self.path.parent


@dataclass(frozen=True)
class Targets:
    """The engines ``limit DIR`` changes, the folders it writes, and the stats files it could
    not read (reported as warnings; their folders get no limit)."""

    engines: list[Engine]
    folders: list[Path]
    unreadable: list[Diagnostic]


def find_targets(directory: Path) -> Targets:
    """The engines under ``directory`` (as ``kvplan top`` finds them) and their folders.

    ``KVP416`` located at DIR when the listing was cut at its bounds (a limit for some of the
    engines ``top`` would show is not what was asked); ``KVP429`` when no readable stats file
    is there at all."""
    now = time.time()
    found = read_stats_tree(directory)
    cut = [d for p, d in found if isinstance(d, Diagnostic) and p == directory]
    if cut:
        raise KVPlanError(cut)
    engines = [Engine(p, s, engine_status(s, now)) for p, s in found if isinstance(s, ElasticStats)]
    engines.sort(key=lambda e: (str(e.folder), e.stats.engine, e.stats.rank))
    unreadable = [d for _, d in found if isinstance(d, Diagnostic)]
    if not engines:
        raise KVPlanError([no_engines(directory), *unreadable])
    folders = sorted({e.folder for e in engines}, key=str)
    return Targets(engines, folders, unreadable)


def no_engines(directory: Path) -> Diagnostic:
    shown = printable(str(directory))
    return error(
        Code.LIMIT_NO_ENGINES,
        shown,
        f"no elastic engine dumps into {shown} or the two directory levels below it (no "
        f"readable rank<N>.stats.json): a {LIMIT_FILE} written there would be read by no "
        "engine, so nothing was written.",
        "pass the directory kvplan top shows the engines in (or one engine's own "
        "KVPLAN_DUMP_DIR) once the engines serve; for a group's one budget pass --group and "
        "its KVPLAN_GROUP directory; for an engine not started yet set KVPLAN_MEMORY_LIMIT",
    )


def names(engines: list[Engine], folder: Path) -> str:
    """The engines (and ranks) dumping into ``folder``: ``llama rank 0, 1``."""
    ranks: dict[str, list[int]] = {}
    for e in engines:
        if e.folder == folder:
            ranks.setdefault(e.stats.engine, []).append(e.stats.rank)
    return "; ".join(
        f"{printable(name, 48)} rank {', '.join(str(r) for r in sorted(rs))}"
        for name, rs in sorted(ranks.items())
    )
