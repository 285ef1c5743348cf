"""A worker counts each step's map and unmap time in the buckets its stats file carries (the
``_step_seconds`` histograms), and the collector shows exactly those counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import _builders as builders
from kvplan.elastic.files import STEP_SECONDS_BUCKETS, read_stats, write_stats
from kvplan.executor import apply
from kvplan.integrations.vllm import elastic
from kvplan.integrations.vllm.elastic import ElasticOps, ElasticSettings, WorkerSide
from kvplan.integrations.vllm.metrics import EngineSource, Reader
from tests.elastic.test_ledger import PAGE, plan_of
from tests.integrations.vllm.metrics._helpers import only, scrape


def _ops(worker: WorkerSide, seq: int, **kw: Any) -> ElasticOps:
    fields: dict[str, Any] = dict(
        seq=seq, unmap=(), map=(), live_blocks=0, cached_blocks=0, limit_bytes=1 << 30,
        cache_limit_bytes=0, reserve_bytes=0, mapped_bytes=0, digest=worker.digest,
    )  # fmt: skip
    fields.update(kw)
    return ElasticOps(**fields)


def test_each_step_that_maps_or_unmaps_is_counted_once(tmp_path: Path) -> None:
    plan = plan_of(builders.llama(num_blocks=64))
    cache = apply(plan, backend="host-vmm", mode="elastic", chunk_size=PAGE)
    cache.ensure_mapped([0])
    worker = elastic.worker_side(
        cache, ElasticSettings(), dump_dir=None, backend="host-vmm", label="rank0"
    )
    with worker.cache:
        first = worker.snapshot()
        assert first.map_seconds_buckets is None and first.unmap_seconds_buckets is None
        worker.apply(_ops(worker, 1, map=(1, 2, 3)))
        worker.apply(_ops(worker, 2, map=(4,)))
        worker.apply(_ops(worker, 3, unmap=(1, 2)))
        worker.apply(_ops(worker, 4))  # neither: not counted
        snap = worker.snapshot()
        assert snap.map_seconds_buckets is not None and snap.unmap_seconds_buckets is not None
        assert len(snap.map_seconds_buckets) == len(STEP_SECONDS_BUCKETS) + 1
        assert sum(snap.map_seconds_buckets) == 2 and sum(snap.unmap_seconds_buckets) == 1
        write_stats(tmp_path, snap)
    reread = read_stats(tmp_path / "rank0.stats.json")
    assert not isinstance(reread, type(None)) and reread == snap
    reader = Reader()
    reader.add(EngineSource("tiny", "0", tmp_path))
    found = scrape(reader)
    assert only(found, "kvplan_kv_map_step_seconds_count") == 2
    assert only(found, "kvplan_kv_unmap_step_seconds_count") == 1
    assert only(found, "kvplan_kv_map_step_seconds_sum") == snap.map_seconds
