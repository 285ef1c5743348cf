"""How the engine tests share the suite's two pytest-xdist workers (``-n 2``).

Each unit runs on one worker, its files one after the other in :data:`ENGINE_UNITS`' order;
the two ``steady`` units start at once, one per worker, and the rest of the suite fills
whichever worker is free. Files that share engines (a driver run of ``_multiproc.SHARED``, a
session fixture's such as ``engine_run``) are in one unit. Two units bound seconds and are held
back (``tests/conftest.py``'s scheduler): ``beside-the-rest`` (co-location: a killed member's
share within 5 s; metrics: a scrape within 2 s of its snapshot) starts once no steady engine
test is left, beside the rest of the suite's tests (one process at a time, never an engine);
``timed`` (reclaim within one second, a preemption within a tick) starts only once every other
test is done, so it has the machine to itself. A test file not named here joins
``steady-servers``.
"""

from __future__ import annotations

from pathlib import Path

ENGINE_UNITS: dict[str, tuple[str, ...]] = {
    "engine:steady-drivers": (
        "test_differential", "test_inspect_releases", "test_engines", "test_reviewed_plans",
        "test_multiprocessing", "test_tensor_parallel", "test_failed_map_multiprocess",
        "test_ray", "test_features",
    ),
    "engine:steady-servers": (
        "test_elastic", "test_other_plugins", "test_stats_lifecycle", "test_openai_server",
        "test_unservable", "test_soak", "test_multinode", "test_pipeline_parallel",
    ),
    "engine:beside-the-rest": ("test_colocation", "test_metrics"),
    "engine:timed": ("test_reclaim",),
}  # fmt: skip
BESIDE = "engine:beside-the-rest"
TIMED = "engine:timed"
HELD = (BESIDE, TIMED)
"""The units the scheduler holds back, in the order they run (after the rest of the suite in
the collection order)."""
STEADY = tuple(unit for unit in ENGINE_UNITS if unit not in HELD)
DEFAULT_UNIT = "engine:steady-servers"
ENGINE_DIR = "tests/engine/"
ORDER = tuple(name for names in ENGINE_UNITS.values() for name in names)


WHOLE_FILES = ("tests/integrations/vllm/capture/test_differential.py",)
"""Files outside ``tests/engine/`` that run as one unit each: their tests share a session
cache of cases vLLM built (``built``), which a second worker would build again."""


def scope_of(nodeid: str) -> str:
    """The unit the scheduler hands out a test in: its engine unit, its file where the file
    is one unit (:data:`WHOLE_FILES`), else the test alone."""
    path = nodeid.split("::", 1)[0]
    return unit_of(nodeid) or (path if path in WHOLE_FILES else nodeid)


def unit_of(nodeid: str) -> str | None:
    """The engine unit of a test (its node id, relative to the rootdir), ``None`` for a test
    outside ``tests/engine/``."""
    if not nodeid.startswith(ENGINE_DIR):
        return None
    stem = Path(nodeid.split("::", 1)[0]).stem
    for unit, names in ENGINE_UNITS.items():
        if stem in names:
            return unit
    return DEFAULT_UNIT


def rank(nodeid: str) -> tuple[int, int]:
    """Where an engine test runs in the suite's order: its unit, then its file."""
    unit = unit_of(nodeid) or DEFAULT_UNIT
    stem = Path(nodeid.split("::", 1)[0]).stem
    place = ORDER.index(stem) if stem in ORDER else len(ORDER)
    return list(ENGINE_UNITS).index(unit), place
