"""A valid elastic stats document (``rankN.stats.json``) with chosen fields changed."""

from __future__ import annotations

from typing import Any

from kvplan.elastic.files import ElasticStats


def make_stats(**changes: Any) -> ElasticStats:
    values: dict[str, Any] = {
        "engine": "host:123",
        "rank": 0,
        "pid": 123,
        "time": 1_700_000_000.5,
        "state": "running",
        "backend": "host-vmm",
        "chunk_bytes": 2 << 20,
        "num_blocks": 1000,
        "reserved_bytes": 1 << 30,
        "mapped_bytes": 6 << 20,
        "peak_mapped_bytes": 8 << 20,
        "limit_bytes": 512 << 20,
        "cache_limit_bytes": 51 << 20,
        "reserve_bytes": 4 << 20,
        "live_blocks": 12,
        "cached_blocks": 3,
        "maps": 4,
        "unmaps": 1,
        "map_seconds": 0.0125,
        "unmap_seconds": 0.001,
        "failed_maps": 0,
        "steps": 40,
    }
    values.update(changes)
    return ElasticStats(**values)
