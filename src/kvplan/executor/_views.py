"""Per-layer tensors over pool byte tensors: ``pool.view(dtype).as_strided(...)``; aliases."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.schemas.errors import Code, KVPlanError, error
from kvplan.schemas.plan import BindingPlan

if TYPE_CHECKING:
    import torch


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``bfloat16`` → ``torch.bfloat16``), else ``KVP006``."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise KVPlanError(
            error(
                Code.UNKNOWN_DTYPE,
                "dtype",
                f"This torch ({torch.__version__}) has no dtype {name!r}.",
                "upgrade torch",
            )
        )
    return dtype


def build_tensors(plan: BindingPlan, pools: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One tensor per view layer and per alias (an alias *is* its target's tensor object).

    ``pools``: name → ``int8`` byte tensor of ``size_bytes`` elements. Each view is the pool
    viewed as its dtype (trailing bytes that do not fill an element are dropped) and then
    ``as_strided(shape, stride, offset_bytes // itemsize)``. Misaligned or out-of-bounds
    views raise ``KVP303``/``KVP301`` instead of a torch error.
    """
    import torch

    typed: dict[tuple[str, str], torch.Tensor] = {}
    tensors: dict[str, torch.Tensor] = {}
    for view in plan.views:
        raw = pools.get(view.pool)
        if raw is None:
            raise KVPlanError(
                error(
                    Code.UNKNOWN_POOL,
                    view.layer,
                    f"View uses unknown pool {view.pool!r}.",
                    "validate the plan (kvplan validate) before binding it",
                )
            )
        isz = view.itemsize
        if view.offset_bytes % isz:
            raise KVPlanError(
                error(
                    Code.MISALIGNED,
                    f"{view.layer}.offset_bytes",
                    f"offset {view.offset_bytes} is not a multiple of {view.dtype}'s {isz} bytes.",
                    "validate the plan (kvplan validate) before binding it",
                )
            )
        lo, hi = view.byte_extent
        if lo < 0 or hi > raw.numel():
            raise KVPlanError(
                error(
                    Code.VIEW_OUT_OF_BOUNDS,
                    view.layer,
                    f"bytes [{lo}, {hi}) fall outside pool {view.pool!r} ({raw.numel()} bytes).",
                    "validate the plan (kvplan validate) before binding it",
                )
            )
        key = (view.pool, view.dtype)
        base = typed.get(key)
        if base is None:
            n = raw.numel() - raw.numel() % isz
            base = raw[:n].view(torch_dtype(view.dtype))
            typed[key] = base
        tensors[view.layer] = torch.as_strided(base, view.shape, view.stride, view.storage_offset)
    for alias in plan.aliases:
        target = alias.target
        seen = {alias.layer}
        while target not in tensors and target not in seen:
            seen.add(target)
            target = next((a.target for a in plan.aliases if a.layer == target), target)
        if target not in tensors:
            raise KVPlanError(
                error(
                    Code.ALIAS_TARGET_MISSING,
                    alias.layer,
                    f"Alias target {alias.target!r} has no tensor.",
                    "point the alias at a tensor-backed layer",
                )
            )
        tensors[alias.layer] = tensors[target]
    return tensors
