"""The output document ``kvplan.plan/1``: pools, per-layer views and aliases.

A view's tensor is the pool's bytes viewed as ``dtype`` then
``as_strided(shape, stride, offset_bytes // itemsize)``: ``stride`` is in elements,
``offset_bytes`` counts from the pool's first byte.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, Field

from kvplan.schemas.bounds import FROZEN, Dims, items
from kvplan.schemas.dtypes import DType, itemsize
from kvplan.schemas.specs import KVCacheSpecKind

PLAN_FORMAT = "kvplan.plan/1"


class _Frozen(BaseModel):
    model_config = FROZEN


class Source(_Frozen):
    """Where the plan came from."""

    vllm_version: str | None = None
    layout: str | None = Field(default=None, description="resolved KVCacheLayout name")
    num_blocks: int = Field(ge=0)


class Pool(_Frozen):
    """One backing allocation (bytes)."""

    name: str
    size_bytes: int = Field(ge=0)
    alignment_bytes: int = Field(gt=0, description="required alignment of the pool's base")
    num_blocks: int = Field(ge=0, description="blocks addressable in this pool")


class View(_Frozen):
    """One tensor-backed layer's tensor: ``dtype``, ``shape``, element ``stride``, byte offset."""

    layer: str
    group: int = Field(ge=0)
    pool: str
    kind: str = Field(description="vLLM spec class of the layer")
    dtype: DType
    shape: Dims
    stride: Dims
    offset_bytes: int = Field(ge=0)

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def spec_kind(self) -> KVCacheSpecKind | None:
        """``kind`` as a :class:`KVCacheSpecKind` (None: a hand-written kind kvplan does not
        know, which a plan may carry)."""
        return KVCacheSpecKind.of(self.kind)

    @property
    def is_raw_storage(self) -> bool:
        """The layer keeps the raw pool (HiSparse): outside the per-group overlap rule."""
        kind = self.spec_kind
        return kind is not None and kind.is_raw_storage

    @property
    def storage_offset(self) -> int:
        """Offset in elements of ``dtype`` (what ``as_strided`` takes)."""
        return self.offset_bytes // self.itemsize

    @property
    def numel(self) -> int:
        total = 1
        for size in self.shape:
            total *= size
        return total

    @property
    def byte_extent(self) -> tuple[int, int]:
        """``[first, last + 1)`` bytes the view touches, relative to the pool (empty: (o, o))."""
        if self.numel == 0:
            return (self.offset_bytes, self.offset_bytes)
        lo = hi = 0
        for size, stride in zip(self.shape, self.stride, strict=True):
            span = (size - 1) * stride
            if span >= 0:
                hi += span
            else:
                lo += span
        isz = self.itemsize
        return (self.offset_bytes + lo * isz, self.offset_bytes + (hi + 1) * isz)


class Alias(_Frozen):
    """A KV-sharing layer: bound to the very tensor of ``target``."""

    layer: str
    target: str


class Summary(_Frozen):
    tensor_backed_layers: int = Field(ge=0)
    aliased_layers: int = Field(ge=0)
    bytes_per_block: int = Field(ge=0, description="pool bytes per block, all tensor-backed layers")
    pool_bytes: int = Field(ge=0)
    alias_saved_bytes: int = Field(ge=0, description="bytes the sharers would need without sharing")


class BindingPlan(_Frozen):
    """A validated KV-cache binding: canonical, diffable, executable."""

    format: Literal["kvplan.plan/1"] = "kvplan.plan/1"
    fingerprint: str = Field(description="sha256 of the canonical input document")
    source: Source
    pools: list[Pool] = items()
    views: list[View] = items()
    aliases: list[Alias] = items()
    summary: Summary

    @cached_property
    def view_by_layer(self) -> dict[str, View]:
        return {view.layer: view for view in self.views}

    @cached_property
    def pool_by_name(self) -> dict[str, Pool]:
        return {pool.name: pool for pool in self.pools}

    @property
    def layers(self) -> list[str]:
        """Every bound layer name: views first, then aliases."""
        return [v.layer for v in self.views] + [a.layer for a in self.aliases]
