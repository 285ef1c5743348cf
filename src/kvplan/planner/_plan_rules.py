"""Validation of a BindingPlan's geometry: bounds, overlap, alignment, overflow, aliases."""

from __future__ import annotations

from collections import defaultdict

from kvplan.planner._overlap import Budget, Finding, find_overlaps
from kvplan.planner._sharing import analyse
from kvplan.planner._text import names, num, nums
from kvplan.schemas.errors import Code, Diagnostic, Findings, error, warning
from kvplan.schemas.plan import BindingPlan, Pool, View
from kvplan.units import VMM_GRANULARITY

INT64_MAX = (1 << 63) - 1


def check_plan(plan: BindingPlan, *, granularity: int = VMM_GRANULARITY) -> Findings:
    """Every geometric problem of ``plan``; warnings for pools off the VMM granularity.

    Bounded work for any plan: overlap is decided exactly within a fixed budget of pair
    checks (``KVP311`` when a hand-written plan exceeds it), aliases in linear time.
    """
    out = Findings()
    pools: dict[str, Pool] = {}
    for pool in plan.pools:
        if pool.name in pools:
            out.append(
                error(
                    Code.DUPLICATE_POOL,
                    f"pools.{pool.name}",
                    "the plan declares this pool more than once",
                    "give every pool a unique name and keep one entry per pool",
                )
            )
            continue
        pools[pool.name] = pool
        if pool.size_bytes > INT64_MAX:
            out.append(
                error(
                    Code.OVERFLOW,
                    f"pools.{pool.name}",
                    f"pool of {num(pool.size_bytes)} bytes overflows a signed 64-bit size",
                    "lower num_blocks",
                )
            )
        elif granularity and pool.size_bytes % granularity:
            out.append(
                warning(
                    Code.POOL_NOT_GRANULAR,
                    f"pools.{pool.name}",
                    f"pool of {num(pool.size_bytes)} bytes is not a multiple of the "
                    f"{num(granularity)}-byte VMM granularity; the last chunk is partly unused",
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
        if not view.is_raw_storage:
            by_group[(view.pool, view.group)].append(view)
    budget = Budget()
    for (pool_name, group), views in sorted(by_group.items()):
        for finding in find_overlaps(views, budget):
            out.append(_overlap_diagnostic(finding, pool_name, group))
    out.extend(_check_aliases(plan, seen))
    return out


def _overlap_diagnostic(finding: Finding, pool: str, group: int) -> Diagnostic:
    if finding.kind == "pair":
        return error(
            Code.VIEW_OVERLAP,
            finding.b,
            f"shares bytes with {finding.a} in group {group} of pool {pool}",
            "layers of one group must not share bytes; check layer_stride, block_stride and offset",
        )
    if finding.kind == "self":
        return error(
            Code.VIEW_SELF_OVERLAP,
            finding.a,
            f"the view overlaps itself ({finding.detail}), so writing one block or element "
            "overwrites another",
            "make the block stride at least one page (and every stride at least the extent "
            "of the axes inside it)",
        )
    return error(
        Code.OVERLAP_UNDECIDED,
        finding.a,
        f"kvplan cannot decide within its work bound whether the views of group {group} "
        f"of pool {pool} are disjoint: {finding.detail}",
        "use views with fewer strided axes (vLLM layouts need one progression per view)",
    )


def _check_view(view: View, pool: Pool | None) -> Diagnostic | None:
    if pool is None:
        return error(
            Code.UNKNOWN_POOL,
            view.layer,
            f"view names pool {view.pool!r}, which the plan does not declare",
            "add the pool or fix the name",
        )
    if (
        len(view.shape) != len(view.stride)
        or any(s < 0 for s in view.shape)
        or any(s < 0 for s in view.stride)
    ):
        return error(
            Code.BAD_VIEW_SHAPE,
            view.layer,
            f"shape {nums(view.shape)} and stride {nums(view.stride)} do not describe a "
            "strided tensor",
            "give one non-negative size and one non-negative stride per dimension",
        )
    isz = view.itemsize
    if view.offset_bytes % isz:
        return error(
            Code.MISALIGNED,
            view.layer,
            f"offset {num(view.offset_bytes)} B is not a multiple of {view.dtype}'s "
            f"{isz}-byte element",
            "align the offset to the dtype",
        )
    lo, hi = view.byte_extent
    if hi > INT64_MAX or lo < -INT64_MAX:
        return error(
            Code.OVERFLOW,
            view.layer,
            f"view reaches byte {num(hi)}, beyond a signed 64-bit offset",
            "lower num_blocks or the strides",
        )
    if lo < 0 or hi > pool.size_bytes:
        return error(
            Code.VIEW_OUT_OF_BOUNDS,
            view.layer,
            f"view spans bytes [{num(lo)}, {num(hi)}) but pool {pool.name} has "
            f"{num(pool.size_bytes)} bytes",
            "shrink the view or grow the pool",
        )
    return None


def _check_aliases(plan: BindingPlan, viewed: set[str]) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    sharers: dict[str, str] = {}
    for alias in plan.aliases:
        sharers.setdefault(alias.layer, alias.target)
    graph = analyse({k: v for k, v in sharers.items() if k != v})
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
        elif alias.layer in graph.on_cycle:
            cycle = graph.cycles[graph.on_cycle[alias.layer]]
            if cycle[0] == alias.layer:  # one diagnostic per cycle
                out.append(
                    error(
                        Code.ALIAS_CYCLE,
                        loc,
                        f"aliases form a cycle of {len(cycle)} layers: " + names(cycle, len(cycle)),
                        "point every alias of the cycle at a tensor-backed layer",
                    )
                )
        elif alias.target in sharers:
            root = graph.root.get(alias.layer)
            out.append(
                error(
                    Code.ALIAS_CHAIN,
                    loc,
                    f"target {alias.target} is itself an alias",
                    f"point the alias at {root} directly"
                    if root is not None and root in viewed
                    else "point the alias at a tensor-backed layer",
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
