"""Prove that tensors match a plan: dtype, shape, stride, byte offset, alias identity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvplan.schemas.errors import Code, Diagnostic, error, warning
from kvplan.schemas.plan import BindingPlan

if TYPE_CHECKING:
    from torch import Tensor


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

    Checks each view layer's dtype, shape, stride (elements) and byte offset from its pool's
    base, and that each alias is the very same tensor object as its target (``is``). The
    pool base is ``pools[name].data_ptr()`` when ``pools`` is given, else the start of the
    tensor's storage; then all views of one pool must also share that storage. Works for
    any tensors (kvplan's, vLLM's, meta). Layers the plan does not know are warnings.
    """
    diags: list[Diagnostic] = []
    bases: dict[str, int] = {}
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
            base = pool.data_ptr()
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
                    )
                )
        offset = t.data_ptr() - base
        if offset != view.offset_bytes:
            diags.append(_mismatch(view.layer, "offset_bytes", view.offset_bytes, offset))
    for alias in plan.aliases:
        t = tensors.get(alias.layer)
        target = tensors.get(alias.target)
        if t is None:
            diags.append(error(Code.VERIFY_MISMATCH, alias.layer, "The alias layer has no tensor."))
        elif target is None:
            diags.append(
                error(
                    Code.VERIFY_MISMATCH,
                    f"{alias.layer}.target",
                    f"The alias target {alias.target!r} has no tensor.",
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
    for layer in tensors:
        if layer not in known:
            diags.append(
                warning(Code.VERIFY_MISMATCH, layer, "The plan has no such layer.", "re-plan")
            )
    return diags
