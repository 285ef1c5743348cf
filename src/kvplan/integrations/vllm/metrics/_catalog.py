"""Every series kvplan adds to vLLM's ``/metrics``: name, type, labels, meaning, source.

The one list (:data:`METRICS`): the collector emits exactly these, ``docs/guides/watch.md``
documents exactly these (tested), and the Grafana examples may query only these (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

VLLM_LABELS = ("model_name", "engine")
"""vLLM's own labels (``PrometheusStatLogger``): the served model name, the engine index."""
RANK_LABELS = (*VLLM_LABELS, "rank")
GROUP_LABELS = (*VLLM_LABELS, "group", "member")
STATUSES = ("bound", "running", "closed", "stale", "dead")
"""The values of ``kvplan_kv_status``'s ``status`` label (``kvplan top``'s status column)."""

Kind = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True)
class Metric:
    """One series family as ``/metrics`` shows it."""

    name: str
    """The family's name; counters end in ``_total`` (the sample's name)."""
    kind: Kind
    labels: tuple[str, ...]
    help: str
    source: str
    """Who writes the figure, and where: a stats-file field (the worker's reporter thread;
    the scheduler's figures reach it on the step's operations), the plan, the group ledger."""
    eager: bool = False
    """Also shown for eager engines (the reservation): the rest are elastic only."""

    @property
    def family(self) -> str:
        """The name prometheus_client's metric families take (without ``_total``)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name

    @property
    def sample_names(self) -> tuple[str, ...]:
        """The names of the samples this family exposes."""
        if self.kind == "histogram":
            return tuple(f"{self.name}_{s}" for s in ("bucket", "sum", "count"))
        return (self.name,)


def _rank(name: str, kind: Kind, help: str, source: str, eager: bool = False) -> Metric:
    return Metric(name, kind, RANK_LABELS, help, source, eager)


def _group(name: str, help: str, source: str) -> Metric:
    return Metric(name, "gauge", GROUP_LABELS, help, source)


METRICS: tuple[Metric, ...] = (
    _rank(
        "kvplan_kv_reserved_bytes", "gauge",
        "KV address space reserved for all pools of the rank (eager: the plan's pool bytes)",
        "worker: stats `reserved_bytes`; eager: the pools of `rank<N>.plan.json`", eager=True,
    ),
    _rank("kvplan_kv_mapped_bytes", "gauge", "KV bytes backed by physical memory now",
          "worker: stats `mapped_bytes`"),
    _rank("kvplan_kv_peak_mapped_bytes", "gauge", "the most kvplan_kv_mapped_bytes has been",
          "worker: stats `peak_mapped_bytes`"),
    _rank("kvplan_kv_limit_bytes", "gauge",
          "the engine's own limit: KVPLAN_MEMORY_LIMIT or kvplan limit, raised to its "
          "floor (in a group the limit in force is the lower of this and "
          "kvplan_group_effective_limit_bytes)",
          "engine core: stats `limit_bytes`"),
    _rank("kvplan_kv_asked_limit_bytes", "gauge",
          "the limit asked (KVPLAN_MEMORY_LIMIT or kvplan limit); absent when none was",
          "engine core: stats `asked_limit_bytes`"),
    _rank("kvplan_kv_floor_bytes", "gauge",
          "the smallest limit the engine accepts (null block + one max_model_len "
          "request); absent before the engine's first step",
          "engine core: stats `floor_bytes`"),
    _rank("kvplan_kv_cache_limit_bytes", "gauge",
          "the most freed-but-cached KV kept backed", "engine core: stats `cache_limit_bytes`"),
    _rank("kvplan_kv_reserve_bytes", "gauge",
          "free, uncached pages kept backed off the critical path",
          "engine core: stats `reserve_bytes`"),
    _rank("kvplan_kv_blocks", "gauge", "KV blocks of the engine (vLLM's block count)",
          "worker: stats `num_blocks`"),
    _rank("kvplan_kv_live_blocks", "gauge", "blocks held by requests (the scheduler's count)",
          "engine core: stats `live_blocks`"),
    _rank("kvplan_kv_cached_blocks", "gauge",
          "freed blocks whose KV is kept for prefix-cache hits",
          "engine core: stats `cached_blocks`"),
    _rank("kvplan_kv_snapshot_age_seconds", "gauge",
          "seconds since the rank's stats snapshot was taken (at scrape time)",
          "worker: stats `time`"),
    Metric(
        "kvplan_kv_status", "gauge", (*RANK_LABELS, "status"),
        "1 for the rank's status (bound, running, closed, stale, dead), 0 for the others",
        "worker: stats `state`, `time`, `pid` (as `kvplan top` judges them)",
    ),
    _rank("kvplan_kv_mapped_chunks_total", "counter", "chunks mapped", "worker: stats `maps`"),
    _rank("kvplan_kv_unmapped_chunks_total", "counter", "chunks unmapped",
          "worker: stats `unmaps`"),
    _rank("kvplan_kv_failed_maps_total", "counter",
          "maps that failed and were rolled back (their requests were preempted)",
          "worker: stats `failed_maps`"),
    _rank("kvplan_kv_rolled_back_chunks_total", "counter",
          "chunks a failed map mapped and unmapped again", "worker: stats `rollbacks`"),
    _rank("kvplan_kv_over_limit_preemptions_total", "counter",
          "requests preempted because blocks in use exceeded the effective limit (a lowered "
          "limit, another member's claim); absent for an older writer",
          "engine core: stats `over_limit_preemptions`"),
    _rank("kvplan_kv_elastic_steps_total", "counter",
          "steps that carried elastic operations", "worker: stats `steps`"),
    _rank("kvplan_kv_map_step_seconds", "histogram",
          "time a step's map took, per step that mapped",
          "worker: stats `map_seconds_buckets`, `map_seconds`"),
    _rank("kvplan_kv_unmap_step_seconds", "histogram",
          "time a step's unmap took, per step that unmapped",
          "worker: stats `unmap_seconds_buckets`, `unmap_seconds`"),
    _group("kvplan_group_budget_bytes", "the group's budget (charged bytes)",
           "group ledger: `budget_bytes`"),
    _group("kvplan_group_free_bytes", "the group's bytes granted to no member",
           "group ledger: `free_bytes`"),
    _group("kvplan_group_granted_bytes", "the member's grant (bytes one rank maps)",
           "group ledger: the member\'s `granted_bytes`"),
    _group("kvplan_group_charged_bytes",
           "what the member's grant costs the budget (grant x charge factor)",
           "group ledger: the member\'s `charged_bytes`"),
    _group("kvplan_group_guarantee_bytes", "the member's guarantee",
           "group ledger: the member\'s `guarantee_bytes`"),
    _group("kvplan_group_borrowed_bytes", "charged bytes granted above the guarantee",
           "group ledger: the member\'s `borrowed_bytes`"),
    _group("kvplan_group_claim_bytes",
           "bytes the member waits for below its guarantee (a claim on borrowers)",
           "group ledger: the member\'s `claim_bytes`"),
    _group("kvplan_group_owed_bytes", "charged bytes the member must give back to claims",
           "group ledger: the member\'s `owed_bytes`"),
    _group("kvplan_group_effective_limit_bytes",
           "the member's effective limit (its bytes): its grant now, less what it owes "
           "to others' claims; not a cap, it grows on request while the budget has free bytes",
           "group ledger: the member\'s `effective_limit_bytes`"),
)  # fmt: skip

BY_NAME = {m.name: m for m in METRICS}


def metric(name: str) -> Metric:
    return BY_NAME[name]
