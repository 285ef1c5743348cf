"""Stats snapshots, plans and scrapes for the metrics tests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from harness._builders import llama
from kvplan.elastic.files import STEP_SECONDS_BUCKETS, ElasticStats
from kvplan.integrations.vllm.metrics import KVPlanCollector, Reader
from kvplan.planner import build_plan
from kvplan.schemas.loading import dump, parse_input

MAP_COUNTS = [0, 3, 5, 0, 1] + [0] * (len(STEP_SECONDS_BUCKETS) - 4)
UNMAP_COUNTS = [2] + [0] * len(STEP_SECONDS_BUCKETS)


def stats(**changes: Any) -> ElasticStats:
    values: dict[str, Any] = {
        "engine": "e1",
        "rank": 0,
        "pid": 1,
        "time": time.time(),
        "state": "running",
        "backend": "host-vmm",
        "chunk_bytes": 4096,
        "num_blocks": 256,
        "reserved_bytes": 32 << 20,
        "mapped_bytes": 6 << 20,
        "peak_mapped_bytes": 8 << 20,
        "limit_bytes": 24 << 20,
        "cache_limit_bytes": 2 << 20,
        "reserve_bytes": 1 << 20,
        "live_blocks": 12,
        "cached_blocks": 3,
        "maps": 1536,
        "unmaps": 512,
        "map_seconds": 0.0125,
        "unmap_seconds": 0.001,
        "failed_maps": 1,
        "rollbacks": 7,
        "steps": 40,
        "floor_bytes": 4 << 20,
        "asked_limit_bytes": 24 << 20,
        "over_limit_preemptions": 5,
        "map_seconds_buckets": MAP_COUNTS,
        "unmap_seconds_buckets": UNMAP_COUNTS,
    }
    values.update(changes)
    return ElasticStats(**values)


def write_plan(directory: Path, rank: int = 0) -> int:
    """``rank<N>.plan.json`` of a small llama; its pools' bytes."""
    plan, findings = build_plan(parse_input(llama()))
    assert plan is not None, findings
    dump(plan, directory / f"rank{rank}.plan.json", within=directory, make_dirs=True)
    return sum(p.size_bytes for p in plan.pools)


def scrape(reader: Reader) -> dict[str, list[tuple[dict[str, str], float]]]:
    """What ``/metrics`` would show of ``reader``, parsed with prometheus_client's text parser:
    ``{sample name: [(labels, value), ...]}``."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(KVPlanCollector(reader))
    return parse(generate_latest(registry).decode())


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def only(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    hits = [v for lab, v in found.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, found.get(name))
    return hits[0]
