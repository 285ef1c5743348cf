"""Validation of a BindingPlan's geometry: bounds, overlap, alignment, overflow, aliases."""

from __future__ import annotations

from collections import defaultdict

from kvplan.planner._overlap import find_overlaps
from kvplan.schemas.errors import Code, Diagnostic, error, warning
from kvplan.schemas.plan import BindingPlan, Pool, View

INT64_MAX = (1 << 63) - 1
VMM_GRANULARITY = 2 << 20
"""Default CUDA VMM allocation granularity (bytes); pools should be a multiple of it."""

_RAW_STORAGE_KINDS = frozenset({"HiSparseHotSpec", "HiSparseResidentSpec"})


def check_plan(plan: BindingPlan, *, granularity: int = VMM_GRANULARITY) -> list[Diagnostic]:
    """Every geometric problem of ``plan``; warnings for pools off the VMM granularity."""
    out: list[Diagnostic] = []
    pools = plan.pool_by_name
    for pool in plan.pools:
        if pool.size_bytes > INT64_MAX:
            out.append(
                error(
                    Code.OVERFLOW,
                    f"pools.{pool.name}",
                    f"pool of {pool.size_bytes} bytes overflows a signed 64-bit size",
                    "lower num_blocks",
                )
            )
        elif granularity and pool.size_bytes % granularity:
            out.append(
                warning(
                    Code.POOL_NOT_GRANULAR,
                    f"pools.{pool.name}",
                    f"pool of {pool.size_bytes} bytes is not a multiple of the "
                    f"{granularity}-byte VMM granularity; the last chunk is partly unused",
                    "round num_blocks so the pool size is a multiple of the granularity",
                )
            )
    seen: set[str] = set()
    by_group: dict[tuple[str, int], list[View]] = defaultdict(list)
    for view in plan.views:
        if view.layer in seen:
            out.append(
                error(
                    Code.DUPLICATE_VIEW,
                    view.layer,
                    "layer has more than one view",
                    "keep one view per layer",
                )
            )
            continue
        seen.add(view.layer)
        problem = _check_view(view, pools.get(view.pool))
        if problem:
            out.append(problem)
            continue
        if view.kind not in _RAW_STORAGE_KINDS:
            by_group[(view.pool, view.group)].append(view)
    for (pool_name, group), views in sorted(by_group.items()):
        for finding in find_overlaps(views):
            if finding.proven:
                out.append(
                    error(
                        Code.VIEW_OVERLAP,
                        finding.b,
                        f"shares bytes with {finding.a} in group {group} of pool {pool_name}",
                        "layers of one group must not share bytes; check layer_stride/offset",
                    )
                )
            else:
                out.append(
                    warning(
                        Code.OVERLAP_UNPROVEN,
                        finding.b,
                        f"kvplan cannot prove it is disjoint from {finding.a} in group {group}",
                        "use a vLLM layout, or check the views by hand",
                    )
                )
    out.extend(_check_aliases(plan, seen))
    return out


def _check_view(view: View, pool: Pool | None) -> Diagnostic | None:
    if pool is None:
        return error(
            Code.UNKNOWN_POOL,
            view.layer,
            f"view names pool {view.pool!r}, which the plan does not declare",
            "add the pool or fix the name",
        )
    if len(view.shape) != len(view.stride) or any(s < 0 for s in view.shape):
        return error(
            Code.BAD_VIEW_SHAPE,
            view.layer,
            f"shape {view.shape} and stride {view.stride} do not describe a tensor",
            "give one non-negative size and one stride per dimension",
        )
    isz = view.itemsize
    if view.offset_bytes % isz:
        return error(
            Code.MISALIGNED,
            view.layer,
            f"offset {view.offset_bytes} B is not a multiple of {view.dtype}'s {isz}-byte element",
            "align the offset to the dtype",
        )
    lo, hi = view.byte_extent
    if hi > INT64_MAX or lo < -INT64_MAX:
        return error(
            Code.OVERFLOW,
            view.layer,
            f"view reaches byte {hi}, beyond a signed 64-bit offset",
            "lower num_blocks or the strides",
        )
    if lo < 0 or hi > pool.size_bytes:
        return error(
            Code.VIEW_OUT_OF_BOUNDS,
            view.layer,
            f"view spans bytes [{lo}, {hi}) but pool {pool.name} has {pool.size_bytes} bytes",
            "shrink the view or grow the pool",
        )
    return None


def _check_aliases(plan: BindingPlan, viewed: set[str]) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    sharers = {a.layer: a.target for a in plan.aliases}
    counted: set[str] = set()
    for alias in plan.aliases:
        loc = f"aliases.{alias.layer}"
        if alias.layer in counted:
            out.append(
                error(
                    Code.DUPLICATE_VIEW,
                    loc,
                    "layer is aliased more than once",
                    "keep one alias per layer",
                )
            )
            continue
        counted.add(alias.layer)
        if alias.layer == alias.target:
            out.append(error(Code.ALIAS_SELF, loc, "layer aliases itself", "remove the alias"))
        elif alias.layer in viewed:
            out.append(
                error(
                    Code.ALIAS_ALSO_BOUND,
                    loc,
                    f"layer has its own view and also aliases {alias.target}",
                    "drop the view or the alias",
                )
            )
        elif alias.target in sharers:
            code = Code.ALIAS_CYCLE if _cycles(alias.layer, sharers) else Code.ALIAS_CHAIN
            out.append(
                error(
                    code,
                    loc,
                    f"target {alias.target} is itself an alias",
                    "point the alias at a tensor-backed layer",
                )
            )
        elif alias.target not in viewed:
            out.append(
                error(
                    Code.ALIAS_TARGET_MISSING,
                    loc,
                    f"target {alias.target} has no view in the plan",
                    "point the alias at a tensor-backed layer",
                )
            )
    return out


def _cycles(start: str, sharers: dict[str, str]) -> bool:
    node, steps = start, 0
    while node in sharers and steps <= len(sharers):
        node = sharers[node]
        steps += 1
        if node == start:
            return True
    return False
