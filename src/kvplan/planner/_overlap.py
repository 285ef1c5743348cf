"""Do two tensor-backed views of one group share a byte? Exact for vLLM's strided layouts.

Views whose byte extents are disjoint cannot overlap (the common, layer-outermost case:
one sort). Views whose extents interleave (block-outermost packing) are compared by their
per-block footprints modulo the common block stride.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvplan.schemas.plan import View

MAX_RUNS_PER_BLOCK = 1 << 16


@dataclass(frozen=True)
class Finding:
    a: str
    b: str
    proven: bool
    """True: the views share a byte. False: kvplan could not prove they are disjoint."""


def _block_runs(view: View) -> list[tuple[int, int]] | None:
    """Byte runs ``(start, length)`` of one block (index 0 of dim 0), relative to the view."""
    isz = view.itemsize
    dims = list(zip(view.shape[1:], view.stride[1:], strict=True))
    if any(size == 0 for size, _ in dims):
        return []
    run = isz
    while dims and dims[-1][1] * isz == run:
        size, _ = dims.pop()
        run *= size
    count = 1
    for size, _ in dims:
        count *= size
    if count > MAX_RUNS_PER_BLOCK:
        return None
    starts = [0]
    for size, stride in dims:
        starts = [s + i * stride * isz for s in starts for i in range(size)]
    return sorted((s, run) for s in starts)


def _residue_check(views: Sequence[View], period: int) -> list[Finding] | None:
    intervals: list[tuple[int, int, str]] = []
    for view in views:
        runs = _block_runs(view)
        if runs is None:
            return None
        if runs and runs[-1][0] + runs[-1][1] - runs[0][0] > period and view.shape[0] > 1:
            return None
        for start, length in runs:
            lo = (view.offset_bytes + start) % period
            hi = lo + length
            if hi <= period:
                intervals.append((lo, hi, view.layer))
            else:
                intervals.append((lo, period, view.layer))
                intervals.append((0, hi - period, view.layer))
    intervals.sort()
    findings: list[Finding] = []
    reach_end, reach_layer = -1, ""
    for lo, hi, layer in intervals:
        if lo < reach_end and layer != reach_layer:
            findings.append(Finding(reach_layer, layer, proven=True))
            if len(findings) >= 8:
                break
        if hi > reach_end:
            reach_end, reach_layer = hi, layer
    return findings


def find_overlaps(views: Sequence[View]) -> list[Finding]:
    """Pairs of views (of one group) that share bytes, or that kvplan cannot prove disjoint."""
    live = [v for v in views if v.numel > 0]
    live.sort(key=lambda v: v.byte_extent)
    clusters: list[list[View]] = []
    reach = -1
    for view in live:
        lo, hi = view.byte_extent
        if clusters and lo < reach:
            clusters[-1].append(view)
        else:
            clusters.append([view])
        reach = max(reach, hi)
    findings: list[Finding] = []
    for cluster in clusters:
        if len(cluster) < 2:
            continue
        periods = {v.stride[0] * v.itemsize for v in cluster if v.shape}
        result = None
        if len(periods) == 1 and all(v.shape for v in cluster):
            period = periods.pop()
            if period > 0:
                result = _residue_check(cluster, period)
        if result is None:
            result = [Finding(cluster[0].layer, cluster[1].layer, proven=False)]
        findings.extend(result)
    return findings
