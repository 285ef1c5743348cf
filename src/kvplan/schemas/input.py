"""The input document ``kvplan.input/1``: vLLM 0.33's ``KVCacheConfig`` plus runner-side facts.

Field names are vLLM's dataclass field names, so a config dumped from vLLM loads as it is.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, PlainSerializer, PlainValidator, WithJsonSchema

from kvplan.schemas.bounds import FROZEN, OmitsLaterFields, items
from kvplan.schemas.layout import KVCacheLayout, parse_layout
from kvplan.schemas.specs import AnySpec, by_name

INPUT_FORMAT = "kvplan.input/1"


class KVCacheGroupRole(StrEnum):
    DEFAULT = "default"
    HISPARSE_SOURCE = "hisparse_source"
    HISPARSE_INDEXER = "hisparse_indexer"


LayoutField = Annotated[
    KVCacheLayout,
    PlainValidator(parse_layout),
    PlainSerializer(lambda layout: layout.name),
    WithJsonSchema({"type": "string", "enum": [*KVCacheLayout.__members__, "NHD", "HND"]}),
]


class _Frozen(BaseModel):
    model_config = FROZEN


class KVCacheTensor(_Frozen):
    """Placement of same-shaped layers in the one backing allocation (bytes).

    Layer ``layers[l]``, block ``b`` starts at ``offset + l * layer_stride + b * block_stride``.
    """

    size: int = Field(gt=0, description="bytes of the backing allocation")
    layers: list[str] = items()
    layer_stride: int = Field(gt=0)
    block_stride: int = Field(gt=0)
    offset: int = Field(default=0, ge=0)
    host_resident: bool = False


class KVCacheGroupSpec(_Frozen):
    """Layers that share one block table, and their spec."""

    layer_names: list[str] = items()
    kv_cache_spec: AnySpec
    is_eagle_group: bool = False
    host_resident: bool = False
    enable_kv_transfer: bool = True
    role: Annotated[KVCacheGroupRole, *by_name(KVCacheGroupRole)] = KVCacheGroupRole.DEFAULT


class KVCacheConfig(OmitsLaterFields, _Frozen):
    """vLLM's ``KVCacheConfig`` (``v1/kv_cache_interface.py``)."""

    LATER_FIELDS: ClassVar[tuple[str, ...]] = ("needs_kv_cache_zeroing",)

    num_blocks: int = Field(gt=0)
    kv_cache_tensors: list[KVCacheTensor] = items()
    kv_cache_groups: list[KVCacheGroupSpec] = items()
    prefix_cache_retention_interval: int | None = Field(default=None, ge=0)
    kv_cache_layout: LayoutField | None = None
    hash_block_size: int | None = Field(default=None, gt=0)
    cache_hit_alignment_tokens: int | None = Field(default=None, gt=0)
    hisparse_host_num_blocks: int | None = Field(
        default=None, gt=0, description="blocks of host-resident HiSparse pools"
    )
    hisparse_host_block_stride: int | None = Field(default=None, gt=0)
    hisparse_shared_host_pool: bool = False
    kv_tp_replicas: int = Field(default=1, gt=0)
    needs_kv_cache_zeroing: bool = False
    """vLLM 0.34 (``init=False`` there: derived, then OR-ed across workers): new blocks are
    zeroed before use, by the scheduler's step (not at allocation)."""

    def num_blocks_of(self, tensor: KVCacheTensor) -> int:
        """Blocks addressable in ``tensor``'s pool (HiSparse host pools have their own count)."""
        if tensor.host_resident and self.hisparse_host_num_blocks is not None:
            return self.hisparse_host_num_blocks
        return self.num_blocks


class InputDocument(_Frozen):
    """What kvplan plans from: one worker's ``KVCacheConfig`` and the runner's sharing map.

    ``shared_kv_cache_layers`` maps each KV-sharing layer to the layer whose cache it reads
    (runner-only; such layers own no tensor). ``kernel_block_sizes`` is one entry per group,
    as vLLM's ``prepare_kernel_block_sizes`` returns it (encoder-only groups have none).
    """

    format: Literal["kvplan.input/1"] = "kvplan.input/1"
    vllm_version: str | None = None
    kv_cache_config: KVCacheConfig
    shared_kv_cache_layers: dict[str, str] = items(default_factory=dict)
    kernel_block_sizes: list[int] | None = items(default=None)
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="free-form facts (model, rank, tool); not planned from"
    )

    @property
    def layout(self) -> KVCacheLayout | None:
        return self.kv_cache_config.kv_cache_layout
