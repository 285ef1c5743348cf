"""A synthetic elastic engine dump for the ``top --html`` tests: the golden gemma-4-E2B plan
(real, from vLLM 0.33) as ``rank0.plan.json`` and a stats snapshot mapping blocks 0..1023 of
every layer slot (2 MiB chunks: chunks 0-15 of each 24 GiB slot)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness._stats import make_stats
from harness.render._pictures import GEMMA
from kvplan.elastic.files import ElasticStats, write_stats
from kvplan.schemas.loading import load_plan

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


GROUP_BUDGET = 8 << 20
GUARANTEE = 4 << 20


@contextmanager
def group_of_two(root: Path) -> Iterator[tuple[Path, Path]]:
    """A group (8 MiB budget) of two live members guaranteed 4 MiB each — ``llama`` borrowing
    3 MiB of ``gemma``'s share, ``gemma`` claiming 3 MiB of it back — and a dump directory per
    member (the gemma-4-E2B snapshot, naming its group): (group directory, dumps root)."""
    from kvplan.elastic.group import GroupMember, set_budget

    group, dumps = root / "group", root / "dumps"
    group.mkdir(parents=True)
    set_budget(group, GROUP_BUDGET, create=True)
    members = [
        GroupMember.join(group, name, floor=1 << 20, ceiling=GROUP_BUDGET, guarantee=GUARANTEE)
        for name in ("llama", "gemma")
    ]
    try:
        members[0].request(7 << 20)  # llama borrows gemma's idle share
        members[1].request(4 << 20)  # gemma asks for its guarantee: 1 MiB free, claims 3 MiB
        for name in ("llama", "gemma"):
            gemma_dump(dumps / name, engine=name, group=str(group), group_member=name)
        yield group, dumps
    finally:
        for member in members:
            member.leave()
