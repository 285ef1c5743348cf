"""Prove that tensors match a plan: dtype, shape, stride, byte offset, alias identity."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvplan.planner import Budget, check_plan, find_overlaps, num
from kvplan.schemas.errors import Code, Diagnostic, error, warning
from kvplan.schemas.plan import BindingPlan, View

if TYPE_CHECKING:
    from torch import Tensor


_MAX_DIAGNOSTICS = 1000


def _real_view(view: View, t: Tensor, offset: int) -> View | None:
    """The view the tensor really is (plan dtype, the tensor's shape/stride/offset)."""
    shape, stride = list(t.shape), list(t.stride())
    if offset < 0 or any(s < 0 for s in stride):
        return None
    return View(
        layer=view.layer,
        group=view.group,
        pool=view.pool,
        kind=view.kind,
        dtype=view.dtype,
        shape=shape,
        stride=stride,
        offset_bytes=offset,
    )


def _address(t: Tensor) -> int:
    """Where ``t`` starts: its storage's address plus its storage offset. ``data_ptr()`` is
    0 for a tensor with no elements (torch has nothing to point at), which would make an
    empty view look as if it started at minus its pool's address."""
    return int(t.untyped_storage().data_ptr()) + int(t.storage_offset()) * t.element_size()


def _mismatch(layer: str, field: str, expected: object, got: object) -> Diagnostic:
    return error(
        Code.VERIFY_MISMATCH,
        f"{layer}.{field}",
        f"{field} is {got}, the plan says {expected}.",
        "the binding does not follow the plan; re-plan or fix the allocator",
    )


def verify(
    plan: BindingPlan,
    tensors: Mapping[str, Tensor],
    *,
    pools: Mapping[str, Tensor] | None = None,
) -> list[Diagnostic]:
    """``KVP403`` diagnostics for every way ``tensors`` differ from ``plan`` (empty: proven).

    First the plan itself is validated (its errors are returned with validate's codes: a
    tensor matching a wrong plan proves nothing). Then each view layer's dtype, shape,
    stride (elements) and byte offset from its pool's base are compared, and each alias
    must be the very same tensor object as its target (``is``). The pool base is
    ``pools[name].data_ptr()`` when ``pools`` is given, else the start of the tensor's
    storage; then all views of one pool must also share that storage. Independently of the
    plan, the memory the tensors really use is checked: every tensor lies inside its pool's
    allocation, and the tensors of different views of one group (and the elements of one
    view) share no byte. Works for any tensors (kvplan's, vLLM's, meta). Layers the plan
    does not know are warnings.
    """
    diags: list[Diagnostic] = check_plan(plan, granularity=0).errors
    bases: dict[str, int] = {}
    actual: dict[tuple[str, int], list[View]] = defaultdict(list)
    for view in plan.views:
        t = tensors.get(view.layer)
        if t is None:
            diags.append(
                error(Code.VERIFY_MISMATCH, view.layer, "The layer has no tensor.", "bind it")
            )
            continue
        got_dtype = str(t.dtype).removeprefix("torch.")
        if got_dtype != view.dtype:
            diags.append(_mismatch(view.layer, "dtype", view.dtype, got_dtype))
        if list(t.shape) != view.shape:
            diags.append(_mismatch(view.layer, "shape", view.shape, list(t.shape)))
        if list(t.stride()) != view.stride:
            diags.append(_mismatch(view.layer, "stride", view.stride, list(t.stride())))
        if pools is not None and view.pool in pools:
            pool = pools[view.pool]
            base = _address(pool)
            if t.device != pool.device:
                diags.append(_mismatch(view.layer, "device", pool.device, t.device))
        else:
            base = t.untyped_storage().data_ptr()
            first = bases.setdefault(view.pool, base)
            if first != base:
                diags.append(
                    error(
                        Code.VERIFY_MISMATCH,
                        f"{view.layer}.pool",
                        f"The tensor's storage is not the storage of the other views of pool "
                        f"{view.pool!r}.",
                        "bind every view of a pool over that pool's one allocation",
                    )
                )
        offset = _address(t) - base
        if offset != view.offset_bytes:
            diags.append(_mismatch(view.layer, "offset_bytes", view.offset_bytes, offset))
        if got_dtype != view.dtype:
            continue
        if pools is not None and view.pool in pools:
            limit = pools[view.pool].numel() * pools[view.pool].element_size()
        else:
            limit = t.untyped_storage().nbytes()
        real = _real_view(view, t, offset)
        if real is None:
            diags.append(
                error(
                    Code.VERIFY_MISMATCH,
                    f"{view.layer}.memory",
                    f"The tensor starts {num(-offset)} bytes before its pool's base "
                    f"or has a negative stride.",
                    "the binding does not follow the plan; re-plan or fix the allocator",
                )
            )
            continue
        lo, hi = real.byte_extent
        if hi > limit:
            diags.append(
                error(
                    Code.VERIFY_MISMATCH,
                    f"{view.layer}.memory",
                    f"The tensor uses bytes [{num(lo)}, {num(hi)}) but its pool's allocation "
                    f"has {num(limit)} bytes.",
                    "the binding does not follow the plan; re-plan or fix the allocator",
                )
            )
        elif not view.is_raw_storage:
            actual[(view.pool, view.group)].append(real)
    budget = Budget()
    for (pool_name, group), views in sorted(actual.items()):
        for finding in find_overlaps(views, budget):
            where = finding.b or finding.a
            if finding.kind == "pair":
                text = f"The tensors of {finding.a} and {finding.b} share memory"
            elif finding.kind == "self":
                text = f"The tensor of {finding.a} overlaps itself ({finding.detail})"
            else:
                text = f"Disjointness could not be decided ({finding.detail})"
            diags.append(
                error(
                    Code.VERIFY_MISMATCH,
                    f"{where}.memory",
                    f"{text} in group {group} of pool {pool_name!r}.",
                    "views of one group must be disjoint; re-plan or fix the allocator",
                )
            )
    for alias in plan.aliases:
        t = tensors.get(alias.layer)
        target = tensors.get(alias.target)
        if t is None:
            diags.append(
                error(
                    Code.VERIFY_MISMATCH,
                    alias.layer,
                    "The alias layer has no tensor.",
                    "bind the sharer to its target's tensor object",
                )
            )
        elif target is None:
            diags.append(
                error(
                    Code.VERIFY_MISMATCH,
                    f"{alias.layer}.target",
                    f"The alias target {alias.target!r} has no tensor.",
                    "bind the target layer first",
                )
            )
        elif t is not target:
            diags.append(
                error(
                    Code.VERIFY_MISMATCH,
                    f"{alias.layer}.alias",
                    f"The tensor is not the very tensor object of {alias.target!r} "
                    "(equal values or a copy are not an alias).",
                    "bind the sharer to its target's tensor object",
                )
            )
    known = set(plan.layers)
    if len(diags) > _MAX_DIAGNOSTICS:
        diags = diags[:_MAX_DIAGNOSTICS]
    for layer in tensors:
        if layer not in known:
            diags.append(
                warning(Code.VERIFY_MISMATCH, layer, "The plan has no such layer.", "re-plan")
            )
    return diags
