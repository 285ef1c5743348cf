"""torch helpers shared by the tests, the benchmark and the GPU check (no pytest)."""

from __future__ import annotations

import torch

from kvplan.schemas.plan import BindingPlan


def vanilla(
    plan: BindingPlan, device: str = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What vLLM does: one ``torch.zeros`` int8 buffer per pool, ``as_strided`` views, aliases."""
    raw = {p.name: torch.zeros(p.size_bytes, dtype=torch.int8, device=device) for p in plan.pools}
    out: dict[str, torch.Tensor] = {}
    for v in plan.views:
        base = raw[v.pool]
        base = base[: base.numel() - base.numel() % v.itemsize].view(getattr(torch, v.dtype))
        out[v.layer] = torch.as_strided(base, v.shape, v.stride, v.storage_offset)
    for a in plan.aliases:
        out[a.layer] = out[a.target]
    return raw, out


def fill_pattern(plan: BindingPlan, tensors: dict[str, torch.Tensor]) -> None:
    """Write a distinct, layer-dependent pattern through every view, in plan order."""
    for i, v in enumerate(plan.views):
        t = tensors[v.layer]
        if t.numel() == 0:
            continue
        pattern = torch.arange(t.numel(), dtype=torch.int32, device=t.device)
        pattern = (pattern * 7 + i * 13) % 97
        t.copy_(pattern.reshape(t.shape).to(t.dtype))
