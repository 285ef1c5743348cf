"""kvplan's figures on vLLM's Prometheus ``/metrics`` (``docs/guides/watch.md``, "Metrics").

The series (:data:`METRICS`) are read, at scrape time and in the API server's process, from
what the engine already writes: each rank's stats file (its reporter thread, off the step
path), the group snapshot, and an eager rank's plan. vLLM's stat logger plugin
(``stat_logger.KVPlanStatLogger``, which imports vLLM) points the collector at an engine with
vLLM's labels; in vLLM's multiprocess metrics mode (``PROMETHEUS_MULTIPROC_DIR``) a mirror
thread writes the same samples into that directory. No torch, no vLLM here.
"""

from __future__ import annotations

from kvplan.integrations.vllm.metrics._catalog import (
    GROUP_LABELS,
    METRICS,
    RANK_LABELS,
    STATUSES,
    VLLM_LABELS,
    Metric,
    metric,
)
from kvplan.integrations.vllm.metrics._collector import (
    EngineSource,
    KVPlanCollector,
    Reader,
    Sample,
    families,
    stats_samples,
)
from kvplan.integrations.vllm.metrics._multiproc import (
    MIRROR_SECONDS,
    Mirror,
    file_names,
    write_samples,
)
from kvplan.integrations.vllm.metrics._publish import publish, reader, unpublish

__all__ = [
    "GROUP_LABELS",
    "METRICS",
    "MIRROR_SECONDS",
    "RANK_LABELS",
    "STATUSES",
    "VLLM_LABELS",
    "EngineSource",
    "KVPlanCollector",
    "Metric",
    "Mirror",
    "Reader",
    "Sample",
    "families",
    "file_names",
    "metric",
    "publish",
    "reader",
    "stats_samples",
    "unpublish",
    "write_samples",
]
