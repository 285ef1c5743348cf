"""The legacy input document ``kvplan.input-legacy/1``: vLLM 0.22–0.28's KV-cache binding facts.

vLLM up to 0.28 (the ``shared_by`` form; see :data:`LEGACY_VLLM_RELEASES`) describes KV
memory as ``KVCacheTensor(size, shared_by, offset, block_stride)`` — one allocation per
tensor, shared by one layer of each group — and the
runner shapes each layer's tensor with its attention backend's ``get_kv_cache_shape`` and
``get_kv_cache_stride_order``. This document carries that ``KVCacheConfig`` (0.24 field
names), the runner's attention groups with what their backend reported, the kernel block
sizes, the runner-only layer set and the KV-sharing map, and the binding options
(``vanilla`` or ``kvcached``). Spec geometry follows ``0.24: v1/kv_cache_interface.py``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from kvplan.schemas._validation import diagnostics_from_validation
from kvplan.schemas.bounds import FROZEN, MAX_DIMS, Dims, items
from kvplan.schemas.dtypes import DType, itemsize
from kvplan.schemas.errors import Code, KVPlanError, error
from kvplan.schemas.specs import KVCacheSpecKind, by_name
from kvplan.units import VMM_GRANULARITY

LEGACY_INPUT_FORMAT = "kvplan.input-legacy/1"
FP8_DS_MLA_TOKEN_BYTES = 656
"""Bytes per token of DeepSeek V3.2's ``fp8_ds_mla`` cache: 512 fp8 NoPE values, 4 float32
scales, 64 bf16 RoPE values (vLLM's ``v1/attention/backends/mla/flashmla_sparse.py``)."""
FP8_DS_MLA_V4_TOKEN_BYTES = 584
"""Bytes per token of DeepSeek V4's ``fp8_ds_mla`` cache: 448 fp8 NoPE values, 64 bf16 RoPE
values, 7 ue8m0 scales and a pad byte (same file)."""

PER_TOKEN_HEAD_SCALE_BYTES = 4
"""0.24 budgets one float32 scale per token, head and K/V in the page."""


@dataclass(frozen=True)
class LegacyRelease:
    """One vLLM release of the ``shared_by`` form and how it differs from 0.24's binding.

    kvplan's legacy planner reproduces 0.24; a document naming another release is planned
    when the document stays inside what that release binds the same way, and refused
    (``KVP609``/``KVP610``) where it does not. Facts from ``tools/vllm_versions.py``
    (``docs/versions.md``).
    """

    minor: str
    packed_tensors: bool = True
    """``KVCacheTensor`` has ``offset``/``block_stride`` (0.24+); before, no packing."""
    relayout_mixed_attention: bool = False
    """0.25+: attention groups with different block dims are restrided without Mamba too."""
    mamba_state_views: bool = True
    """≤0.26: one view per Mamba state; 0.27+: one raw ``(blocks, 1, 1, page)`` view."""
    state_content_pages: bool = False
    """0.28: page = head slots × storage block × ``state_content_bytes``; per-token-head
    scales and fp8_ds_mla are no longer budgeted by the 0.24 formulas."""


LEGACY_REFERENCE_RELEASE = "0.24"
"""The release kvplan's legacy planner reproduces; a document without ``vllm_version``."""

LEGACY_VLLM_RELEASES: dict[str, LegacyRelease] = {
    r.minor: r
    for r in (
        LegacyRelease("0.22", packed_tensors=False),
        LegacyRelease("0.23", packed_tensors=False),
        LegacyRelease("0.24"),
        LegacyRelease("0.25", relayout_mixed_attention=True),
        LegacyRelease("0.26", relayout_mixed_attention=True),
        LegacyRelease("0.27", relayout_mixed_attention=True, mamba_state_views=False),
        LegacyRelease(
            "0.28", relayout_mixed_attention=True, mamba_state_views=False, state_content_pages=True
        ),
    )
}
"""Every vLLM release whose ``KVCacheTensor`` is the ``shared_by`` form (0.29+ use placement
with ``layers``/``layer_stride``: plan those from ``kvplan.input/1``). The one list of the
releases a ``kvplan.input-legacy/1`` document may name."""


def release_minor(version: str) -> str:
    """``0.25.1`` / ``v0.28.0rc1.dev3+g12`` → ``0.25`` (unchanged when not a version)."""
    match = re.match(r"\s*v?([0-9]+)\.([0-9]+)", version, re.ASCII)
    return f"{match.group(1)}.{match.group(2)}" if match else version


def legacy_release(version: str | None) -> LegacyRelease | None:
    """The release a document's ``vllm_version`` names (None: 0.24), or None if not accepted."""
    minor = LEGACY_REFERENCE_RELEASE if version is None else release_minor(version)
    return LEGACY_VLLM_RELEASES.get(minor)


def legacy_release_accepted(version: str | None) -> bool:
    return legacy_release(version) is not None


class LegacyKVQuantMode(IntEnum):
    """vLLM 0.24's ``KVQuantMode`` (its own numbering; written by name)."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    NVFP4 = 4

    @property
    def is_per_token_head(self) -> bool:
        return self in (LegacyKVQuantMode.INT8_PER_TOKEN_HEAD, LegacyKVQuantMode.FP8_PER_TOKEN_HEAD)


QuantField = Annotated[LegacyKVQuantMode, *by_name(LegacyKVQuantMode)]


class _Frozen(BaseModel):
    model_config = FROZEN


def _nvfp4_dim(head_size: int) -> int:
    return head_size // 2 + head_size // 16


LATER_RELEASE_FIELDS = frozenset(
    {
        "head_size_v",
        "num_head_slots",
        "state_content_bytes",
        "non_causal_multi_token_decode",
        "extra_retained_tokens",
    }
)
"""Spec fields 0.25–0.28 added; written back only when the document gave them."""


class LegacySpec(_Frozen):
    """0.24's ``KVCacheSpec``: ``block_size`` and a ``page_size_bytes``."""

    kind: str = ""
    block_size: int = Field(gt=0, description="tokens per block")

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        unset = (LATER_RELEASE_FIELDS & set(data)) - self.model_fields_set
        return {k: v for k, v in data.items() if k not in unset}

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError

    @property
    def is_attention(self) -> bool:
        return False


class LegacyAttentionSpec(LegacySpec):
    """0.24's ``AttentionSpec``: page ``2*bs*H*hs*itemsize`` (+ per-token-head scale bytes)."""

    kind: Literal["AttentionSpec"] = "AttentionSpec"
    num_kv_heads: int = Field(gt=0)
    head_size: int = Field(gt=0)
    dtype: DType
    kv_quant_mode: QuantField = LegacyKVQuantMode.NONE
    page_size_padded: int | None = Field(default=None, gt=0)
    indexes_kv_by_block_stride: bool = False
    head_size_v: int | None = Field(default=None, ge=0, description="0.28+ on every spec")
    num_head_slots: int | None = Field(default=None, gt=0, description="0.28+; refused if set")
    state_content_bytes: int | None = Field(default=None, gt=0, description="0.28+; refused if set")

    @property
    def is_attention(self) -> bool:
        return True

    @property
    def real_page_size_bytes(self) -> int:
        dim = _nvfp4_dim(self.head_size) if self.kv_quant_mode is LegacyKVQuantMode.NVFP4 else None
        per_head = 2 * (dim if dim is not None else self.head_size)
        return self.block_size * self.num_kv_heads * per_head * itemsize(self.dtype)

    @property
    def unpadded_page_size_bytes(self) -> int:
        page = self.real_page_size_bytes
        if self.kv_quant_mode.is_per_token_head:
            page += 2 * self.block_size * self.num_kv_heads * PER_TOKEN_HEAD_SCALE_BYTES
        return page

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.unpadded_page_size_bytes


class _WithHeadSizeV(LegacyAttentionSpec):
    """Full/sliding attention: ``C = head_size + head_size_v`` (``head_size_v`` defaults)."""

    head_size_v: int | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _default_head_size_v(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("head_size_v") is None and "head_size" in data:
            data = {**data, "head_size_v": data["head_size"]}
        return data

    @property
    def real_page_size_bytes(self) -> int:
        hs_v = self.head_size_v or self.head_size
        if self.kv_quant_mode is LegacyKVQuantMode.NVFP4:
            last = _nvfp4_dim(self.head_size) + _nvfp4_dim(hs_v)
        else:
            last = self.head_size + hs_v
        return self.block_size * self.num_kv_heads * last * itemsize(self.dtype)


class LegacyFullAttentionSpec(_WithHeadSizeV):
    kind: Literal["FullAttentionSpec"] = "FullAttentionSpec"  # type: ignore[assignment]
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    non_causal: bool = False


class LegacySinkFullAttentionSpec(LegacyFullAttentionSpec):
    kind: Literal["SinkFullAttentionSpec"] = "SinkFullAttentionSpec"  # type: ignore[assignment]
    sink_len: int | None = None


class LegacyTQFullAttentionSpec(LegacyFullAttentionSpec):
    """TurboQuant (0.24 only). Parsed so it can be refused by name (KVP604)."""

    kind: Literal["TQFullAttentionSpec"] = "TQFullAttentionSpec"  # type: ignore[assignment]
    tq_slot_size: int = 0

    @property
    def real_page_size_bytes(self) -> int:
        if self.tq_slot_size > 0:
            return self.block_size * self.num_kv_heads * self.tq_slot_size
        return super().real_page_size_bytes


class LegacySlidingWindowSpec(_WithHeadSizeV):
    kind: Literal["SlidingWindowSpec"] = "SlidingWindowSpec"  # type: ignore[assignment]
    sliding_window: int = Field(gt=0)
    extra_retained_tokens: int = Field(default=0, ge=0, description="0.28+; not memory")


class LegacyChunkedLocalAttentionSpec(LegacyAttentionSpec):
    kind: Literal["ChunkedLocalAttentionSpec"] = "ChunkedLocalAttentionSpec"  # type: ignore[assignment]
    attention_chunk_size: int = Field(gt=0)


class LegacyEncoderOnlyAttentionSpec(LegacyAttentionSpec):
    """The V1 runner's appended encoder-only group: runner-only layers, no tensor."""

    kind: Literal["EncoderOnlyAttentionSpec"] = "EncoderOnlyAttentionSpec"  # type: ignore[assignment]


class LegacyCrossAttentionSpec(LegacyAttentionSpec):
    kind: Literal["CrossAttentionSpec"] = "CrossAttentionSpec"  # type: ignore[assignment]


class _MLAPage:
    """0.24 MLA page: ``storage_block_size * H * hs * itemsize`` (or fp8_ds_mla bytes)."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str
    cache_dtype_str: str | None
    compress_ratio: int
    model_version: str | None
    alignment: int | None
    page_size_padded: int | None

    @property
    def storage_block_size(self) -> int:
        return self.block_size // self.compress_ratio

    @property
    def real_page_size_bytes(self) -> int:
        return self._mla_real()

    @property
    def page_size_bytes(self) -> int:
        return self._mla_page()

    def _mla_real(self) -> int:
        storage = self.storage_block_size
        if self.cache_dtype_str == "fp8_ds_mla":
            if self.model_version == "deepseek_v4":
                return storage * FP8_DS_MLA_V4_TOKEN_BYTES
            return self.block_size * FP8_DS_MLA_TOKEN_BYTES
        return storage * self.num_kv_heads * self.head_size * itemsize(self.dtype)

    def _mla_page(self) -> int:
        real = self._mla_real()
        if self.alignment:
            padded = -(-real // self.alignment) * self.alignment
            if padded != real:
                return padded
        return self.page_size_padded if self.page_size_padded is not None else real


class LegacyMLAAttentionSpec(_MLAPage, LegacyFullAttentionSpec):
    kind: Literal["MLAAttentionSpec"] = "MLAAttentionSpec"  # type: ignore[assignment]
    head_size_v: int | None = Field(default=None, ge=0)
    """0.28 MLA writes 0 (no V part); the MLA page does not use it."""
    cache_dtype_str: str | None = None
    alignment: int | None = Field(default=None, gt=0)
    compress_ratio: int = Field(default=1, gt=0)
    model_version: str | None = None
    non_causal_multi_token_decode: bool = Field(default=False, description="0.27+; not memory")


class LegacyHiddenStateCacheSpec(LegacyMLAAttentionSpec):
    kind: Literal["HiddenStateCacheSpec"] = "HiddenStateCacheSpec"  # type: ignore[assignment]


class LegacySlidingWindowMLASpec(_MLAPage, LegacySlidingWindowSpec):
    """DeepSeek V4's sliding MLA (0.24). Parsed so it can be refused by name (KVP604)."""

    kind: Literal["SlidingWindowMLASpec"] = "SlidingWindowMLASpec"  # type: ignore[assignment]
    head_size_v: int | None = Field(default=None, ge=0)
    cache_dtype_str: str | None = None
    alignment: int | None = Field(default=None, gt=0)
    compress_ratio: int = Field(default=1, gt=0)
    model_version: str | None = None


class LegacyMambaSpec(LegacySpec):
    """0.24's ``MambaSpec``: states ``shapes``/``dtypes`` packed in one (padded) page."""

    kind: Literal["MambaSpec"] = "MambaSpec"
    shapes: list[Annotated[list[Annotated[int, Field(gt=0)]], Field(max_length=MAX_DIMS)]] = Field(
        min_length=1, max_length=MAX_DIMS, description="state shapes; every dimension positive"
    )
    dtypes: list[DType] = Field(max_length=MAX_DIMS)
    page_size_padded: int | None = Field(default=None, gt=0)
    mamba_type: str = "MAMBA2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _shapes_match_dtypes(self) -> LegacyMambaSpec:
        if len(self.shapes) != len(self.dtypes):
            raise ValueError(
                f"shapes has {len(self.shapes)} entries but dtypes has {len(self.dtypes)}"
            )
        return self

    @property
    def state_bytes(self) -> list[int]:
        """Bytes of each state in one page, in order."""
        return [math.prod(s) * itemsize(d) for s, d in zip(self.shapes, self.dtypes, strict=True)]

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return sum(self.state_bytes)


LegacyLeafSpec = Annotated[
    (
        LegacyFullAttentionSpec
        | LegacySlidingWindowSpec
        | LegacyMLAAttentionSpec
        | LegacyHiddenStateCacheSpec
        | LegacySlidingWindowMLASpec
        | LegacyChunkedLocalAttentionSpec
        | LegacyTQFullAttentionSpec
        | LegacyEncoderOnlyAttentionSpec
        | LegacyCrossAttentionSpec
        | LegacySinkFullAttentionSpec
        | LegacyMambaSpec
        | LegacyAttentionSpec
    ),
    Field(discriminator="kind"),
]


class LegacyUniformTypeKVCacheSpecs(LegacySpec):
    """One group of same-type layers with per-layer specs (each layer its own tensor)."""

    kind: Literal["UniformTypeKVCacheSpecs"] = "UniformTypeKVCacheSpecs"
    kv_cache_specs: dict[str, LegacyLeafSpec] = items(min_length=1)

    @property
    def page_size_bytes(self) -> int:
        return sum(spec.page_size_bytes for spec in self.kv_cache_specs.values())


LegacyAnySpec = Annotated[
    LegacyLeafSpec | LegacyUniformTypeKVCacheSpecs,
    Field(discriminator="kind"),
]

_NOT_IN_LEGACY = frozenset(
    {
        KVCacheSpecKind.RSWA,
        KVCacheSpecKind.CIRCULAR_BUFFER,
        KVCacheSpecKind.HISPARSE_HOT,
        KVCacheSpecKind.HISPARSE_RESIDENT,
    }
)
LEGACY_SPEC_KINDS: tuple[str, ...] = tuple(k for k in KVCacheSpecKind if k not in _NOT_IN_LEGACY)
"""The kinds a ``kvplan.input-legacy/1`` document may name (vLLM 0.24's spec classes)."""


class LegacyKVCacheTensor(_Frozen):
    """0.24's ``KVCacheTensor``: one allocation of ``size`` bytes shared by ``shared_by``.

    ``block_stride > 0`` marks a packed tensor: every packed tensor aliases one backing,
    and layer pages sit at ``offset`` inside each ``block_stride``-byte block.
    """

    size: int = Field(gt=0, description="bytes of the allocation")
    shared_by: list[str] = items(description="one layer per group shares this tensor")
    offset: int = Field(default=0, ge=0)
    block_stride: int = Field(default=0, ge=0, description="0 = not packed")


class LegacyKVCacheGroupSpec(_Frozen):
    layer_names: list[str] = items()
    kv_cache_spec: LegacyAnySpec
    is_eagle_group: bool = False


class LegacyKVCacheConfig(_Frozen):
    """0.24's ``KVCacheConfig`` (scheduler/worker form, or the runner's after the append)."""

    num_blocks: int = Field(gt=0)
    kv_cache_tensors: list[LegacyKVCacheTensor] = items()
    kv_cache_groups: list[LegacyKVCacheGroupSpec] = items()


class AttentionGroupInfo(_Frozen):
    """One of the runner's ``AttentionGroup``s and what its backend class reported.

    ``kv_cache_shape`` is ``backend.get_kv_cache_shape(num_blocks * ratio, kernel_block_size,
    num_kv_heads, head_size, cache_dtype_str=...)`` exactly as the runner calls it
    (``ratio = block_size // kernel_block_size``); ``stride_order`` is
    ``backend.get_kv_cache_stride_order()``; ``block_dim`` is
    ``backend.get_kv_cache_block_dim(...)``. All three are null for Mamba groups.
    """

    kv_cache_group_id: int = Field(ge=0)
    backend: str = Field(description="attention backend class name")
    layer_names: list[str] = items()
    kv_cache_shape: Dims | None = None
    stride_order: Dims | None = None
    block_dim: int | None = Field(default=None, ge=0)


Strategy = Literal["vanilla", "kvcached"]
PoolLayout = Literal["noncontiguous", "contiguous", "per-layer"]


class BindingOptions(_Frozen):
    """How the runner binds: vanilla vLLM 0.24, or kvcached with its pool layout.

    CLI options and ``plan_legacy`` arguments override these.
    """

    strategy: Strategy = "vanilla"
    pool_layout: PoolLayout = Field(
        default="noncontiguous",
        description="kvcached's KVCACHED_CONTIGUOUS_LAYOUT, or per-layer (its v0.8 binding)",
    )
    virtual_capacity_bytes: int | None = Field(
        default=None, gt=0, description="address space each kvcached pool reserves"
    )
    page_size_bytes: int = Field(
        default=VMM_GRANULARITY, gt=0, description="kvcached's physical page (PAGE_SIZE)"
    )


class LegacyInputDocument(_Frozen):
    """What kvplan plans a vLLM 0.22–0.28 binding from (one worker).

    ``runner_only_attn_layers``: the V1 runner's set (KV sharers, encoder-only layers); a
    group layer in it owns no tensor. ``shared_kv_cache_layers``: sharer → target.
    ``scheduler_num_layers``: the pool count the engine core's kvcached block pool was built
    with (``num_layers``), checked against the worker side when given.
    """

    format: Literal["kvplan.input-legacy/1"] = "kvplan.input-legacy/1"
    vllm_version: str | None = None
    kv_cache_config: LegacyKVCacheConfig
    attn_groups: list[AttentionGroupInfo] = items(default_factory=list)
    kernel_block_sizes: list[int] | None = items(default=None)
    runner_only_attn_layers: list[str] = items(default_factory=list)
    shared_kv_cache_layers: dict[str, str] = items(default_factory=dict)
    cache_dtype: str = Field(default="auto", description="cache_config.cache_dtype")
    kv_cache_layout: str | None = Field(default=None, description="get_kv_cache_layout(): NHD/HND")
    scheduler_num_layers: int | None = Field(default=None, gt=0)
    binding: BindingOptions = Field(default_factory=BindingOptions)
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="free-form facts (model, tool); not planned from"
    )


def parse_legacy(data: Any, source: str = "<input>") -> LegacyInputDocument:
    """Validate a ``kvplan.input-legacy/1`` mapping; ``KVPlanError`` with KVP codes if bad."""
    if not isinstance(data, dict):
        raise KVPlanError(
            error(
                Code.SCHEMA,
                source,
                f"expected a {LEGACY_INPUT_FORMAT} document (a mapping), got {type(data).__name__}",
                "see docs/formats.md",
            )
        )
    for where, kind in _spec_kinds(data):
        if kind not in LEGACY_SPEC_KINDS:
            raise KVPlanError(
                error(
                    Code.UNKNOWN_SPEC_KIND,
                    where,
                    f"unknown spec kind {kind!r}; vLLM 0.24 specs kvplan knows: "
                    + ", ".join(LEGACY_SPEC_KINDS),
                    "use a vLLM 0.24 KVCacheSpec class name",
                )
            )
    try:
        return LegacyInputDocument.model_validate(data)
    except ValidationError as exc:
        raise KVPlanError(diagnostics_from_validation(exc, source, data)) from None


def _spec_kinds(data: dict[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    cfg = data.get("kv_cache_config")
    groups = cfg.get("kv_cache_groups") if isinstance(cfg, dict) else None
    for g, group in enumerate(groups if isinstance(groups, list) else []):
        spec = group.get("kv_cache_spec") if isinstance(group, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
            continue
        where = f"kv_cache_config.kv_cache_groups[{g}].kv_cache_spec"
        out.append((where, spec["kind"]))
        inner = spec.get("kv_cache_specs")
        for name, sub in inner.items() if isinstance(inner, dict) else []:
            if isinstance(sub, dict) and isinstance(sub.get("kind"), str):
                out.append((f"{where}.kv_cache_specs.{name}", sub["kind"]))
    return out


def layer_spec(spec: LegacySpec, layer: str) -> LegacySpec | None:
    """``layer``'s spec in a group: the group spec, or its ``UniformTypeKVCacheSpecs`` entry."""
    if isinstance(spec, LegacyUniformTypeKVCacheSpecs):
        return spec.kv_cache_specs.get(layer)
    return spec
