"""What a strategy produces, and small stride helpers shared by the strategies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvplan.planner._bind import layer_view
from kvplan.schemas.dtypes import itemsize
from kvplan.schemas.errors import Diagnostic
from kvplan.schemas.legacy import LegacyMambaSpec
from kvplan.schemas.plan import Alias, Pool, View


@dataclass
class LegacyBinding:
    """Pools, views and aliases of one strategy, before the plan is assembled."""

    pools: list[Pool] = field(default_factory=list)
    views: list[View] = field(default_factory=list)
    aliases: list[Alias] = field(default_factory=list)
    bytes_per_block: int = 0
    layout: str = ""
    problems: list[Diagnostic] = field(default_factory=list)


def dense_strides(shape: Sequence[int]) -> list[int]:
    """Row-major element strides of ``shape`` (``torch.empty(shape).stride()``)."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return strides


def inverse(order: Sequence[int]) -> list[int]:
    """``inv[j] = order.index(j)``: the permute that undoes ``order``."""
    return [list(order).index(j) for j in range(len(order))]


def permute(
    shape: Sequence[int], stride: Sequence[int], dims: Sequence[int]
) -> tuple[list[int], list[int]]:
    """``tensor.permute(*dims)``'s shape and stride."""
    return [shape[d] for d in dims], [stride[d] for d in dims]


def state_views_offsets(sizes: Sequence[int]) -> list[int]:
    """Running byte offsets of states packed back to back in one page."""
    out, at = [], 0
    for size in sizes:
        out.append(at)
        at += size
    return out


def mamba_state_views(
    layer: str, group: int, pool: str, spec: LegacyMambaSpec, blocks: int, step: int, base: int
) -> list[View]:
    """One view per state of a Mamba ``layer``, named ``<layer>#<i>``.

    State ``i`` is ``[blocks, *shapes[i]]`` of ``dtypes[i]``: dense within a page, pages
    ``step`` bytes apart, the first page at byte ``base`` of ``pool``; states packed back to back.
    """
    views = []
    offsets = state_views_offsets(spec.state_bytes)
    for i, (shape, dtype) in enumerate(zip(spec.shapes, spec.dtypes, strict=True)):
        full = [blocks, *shape]
        stride = dense_strides(full)
        stride[0] = step // itemsize(dtype)
        offset = base + offsets[i]
        views.append(layer_view(f"{layer}#{i}", group, pool, spec, dtype, full, stride, offset))
    return views


def aliases_of(sharers: dict[str, str]) -> list[Alias]:
    return [Alias(layer=s, target=t) for s, t in sharers.items()]
