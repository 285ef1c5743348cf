"""A synthetic elastic engine dump for the ``top --html`` tests: the golden gemma-4-E2B plan
(real, from vLLM 0.33) as ``rank0.plan.json`` and a stats snapshot mapping blocks 0..1023 of
every layer slot (2 MiB chunks: chunks 0-15 of each 24 GiB slot)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from kvplan.elastic.files import ElasticStats, write_stats
from kvplan.schemas.loading import load_plan
from tests.elastic.test_files import make_stats
from tests.render._pictures import GEMMA

CHUNK = 2 << 20
SLOT = 24 << 30
RUNS = {"kv_cache": [(0, 16), (SLOT // CHUNK, 16), (2 * SLOT // CHUNK, 16)]}


def gemma_dump(directory: Path, **changes: Any) -> ElasticStats:
    """``directory/rank0.plan.json`` (the golden plan) and ``rank0.stats.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(GEMMA / "plan.json", directory / "rank0.plan.json")
    plan = load_plan(directory / "rank0.plan.json")
    values: dict[str, Any] = {
        "engine": "gemma-e2b",
        "time": time.time(),
        "chunk_bytes": CHUNK,
        "num_blocks": plan.source.num_blocks,
        "reserved_bytes": plan.summary.pool_bytes,
        "mapped_bytes": 48 * CHUNK,
        "peak_mapped_bytes": 64 * CHUNK,
        "limit_bytes": 24 << 30,
        "asked_limit_bytes": 24 << 30,
        "floor_bytes": 1 << 30,
        "cache_limit_bytes": 2 << 30,
        "live_blocks": 900,
        "cached_blocks": 100,
        "mapped_runs": RUNS,
        "plan_fingerprint": plan.fingerprint,
    }
    values.update(changes)
    stats = make_stats(**values)
    write_stats(directory, stats)
    return stats
