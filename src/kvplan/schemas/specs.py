"""Per-layer KV-cache specs: one pydantic model per vLLM 0.33 ``KVCacheSpec`` subclass.

Field names, defaults and derived sizes follow ``vllm/v1/kv_cache_interface.py``. Every
model is frozen; derived geometry is exposed as properties, as vLLM does:

* ``num_heads`` — head slots ``H`` of the logical ``[B, H, N, C]`` view;
* ``num_states`` — states per block ``N`` (``block_size // tokens_per_state``, or 1);
* ``state_content_size_bytes`` — bytes of one state ``C`` (K and V packed together);
* ``page_size_bytes`` — bytes of one block of one layer, padded if the spec pads.
"""

from __future__ import annotations

import math
from enum import Enum, IntEnum, StrEnum
from fractions import Fraction
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    model_validator,
)

from kvplan.schemas.bounds import FROZEN, MAX_DIMS, OmitsLaterFields, items
from kvplan.schemas.dtypes import DType, itemsize


def _parse_fraction(value: object) -> Fraction:
    if isinstance(value, bool):
        raise ValueError("expected an int or an 'n/d' string, got a boolean")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, str):
        if not value.isascii():  # Fraction() also reads Arabic-Indic or full-width digits
            raise ValueError(f"expected an int or an 'n/d' string in ASCII digits, got {value!r}")
        try:
            return Fraction(value.strip())
        except (ValueError, ZeroDivisionError) as exc:
            raise ValueError(f"expected an int or an 'n/d' string, got {value!r}") from exc
    raise ValueError(f"expected an int or an 'n/d' string, got {type(value).__name__}")


def _dump_fraction(value: Fraction) -> int | str:
    return value.numerator if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


FractionValue = Annotated[
    Fraction,
    PlainValidator(_parse_fraction),
    PlainSerializer(_dump_fraction),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^-?\d+/\d+$"}]}),
]
"""vLLM's ``Fraction``: written as an int, or as ``"n/d"``."""


def by_name(enum_cls: type[Enum], aliases: dict[str, str] | None = None) -> Any:
    """Validator/serializer pair that writes an enum by member name (and reads name or value)."""

    def parse(value: object) -> Enum:
        if isinstance(value, enum_cls):
            return value
        if isinstance(value, Enum):
            value = value.name
        if isinstance(value, str):
            name = (aliases or {}).get(value, value)
            if name in enum_cls.__members__:
                return enum_cls[name]
            for member in enum_cls:
                if member.value == value:
                    return member
        if isinstance(value, int) and not isinstance(value, bool):
            for member in enum_cls:
                if member.value == value:
                    return member
        names = ", ".join(enum_cls.__members__)
        raise ValueError(f"unknown {enum_cls.__name__} {value!r}; expected one of: {names}")

    return [
        PlainValidator(parse),
        PlainSerializer(lambda member: member.name),
        WithJsonSchema({"type": "string", "enum": list(enum_cls.__members__)}),
    ]


class KVQuantMode(IntEnum):
    """vLLM's ``KVQuantMode``. ``CUSTOM`` is vLLM's alias of ``OCTAVE_K3V4`` (both 12)."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    NVFP4 = 5
    TURBOQUANT_K8V4 = 6
    TURBOQUANT_4BIT_NC = 7
    TURBOQUANT_K3V4_NC = 8
    TURBOQUANT_3BIT_NC = 9
    NVFP4_DS_MLA = 10
    ULTRAQUANT_4BIT = 11
    OCTAVE_K3V4 = 12
    OCTAVE_K3V3 = 13
    OCTAVE_K3V3_COMPACT = 14


class SparseCacheRole(StrEnum):
    SPARSE = "sparse"
    INDEXER = "indexer"


KVQuantModeField = Annotated[KVQuantMode, *by_name(KVQuantMode, {"CUSTOM": "OCTAVE_K3V4"})]
SparseCacheRoleField = Annotated[SparseCacheRole, *by_name(SparseCacheRole)]


class KVCacheSpecFamily(StrEnum):
    """vLLM's ``KVCacheSpecKind``: the attention family two layers must share to alias
    (``get_kv_cache_spec_kind`` in ``vllm/v1/kv_cache_interface.py``)."""

    FULL_ATTENTION = "full_attention"
    MLA_ATTENTION = "mla_attention"
    SLIDING_WINDOW = "sliding_window"
    SLIDING_WINDOW_MLA = "sliding_window_mla"
    MAMBA = "mamba"
    CHUNKED_LOCAL_ATTENTION = "chunked_local_attention"
    SINK_FULL_ATTENTION = "sink_full_attention"
    ENCODER_ONLY_ATTENTION = "encoder_only_attention"
    CROSS_ATTENTION = "cross_attention"
    UNKNOWN = "unknown"


class KVCacheSpecKind(StrEnum):
    """A document's ``kind``: the vLLM spec class it names (a ``str`` enum, so documents read
    and write the class name unchanged). Every decision that depends on the kind alone is a
    property here: :attr:`family`, :attr:`is_mamba`, :attr:`is_mla`, :attr:`is_raw_storage`,
    :attr:`is_attention`, :attr:`groups_with_full_attention`.
    """

    ATTENTION = "AttentionSpec"
    FULL_ATTENTION = "FullAttentionSpec"
    SLIDING_WINDOW = "SlidingWindowSpec"
    MLA_ATTENTION = "MLAAttentionSpec"
    HIDDEN_STATE_CACHE = "HiddenStateCacheSpec"
    RSWA = "RSWASpec"
    CHUNKED_LOCAL_ATTENTION = "ChunkedLocalAttentionSpec"
    CIRCULAR_BUFFER = "CircularBufferSpec"
    SLIDING_WINDOW_MLA = "SlidingWindowMLASpec"
    ENCODER_ONLY_ATTENTION = "EncoderOnlyAttentionSpec"
    CROSS_ATTENTION = "CrossAttentionSpec"
    SINK_FULL_ATTENTION = "SinkFullAttentionSpec"
    MAMBA = "MambaSpec"
    HISPARSE_HOT = "HiSparseHotSpec"
    HISPARSE_RESIDENT = "HiSparseResidentSpec"
    TQ_FULL_ATTENTION = "TQFullAttentionSpec"
    """Legacy documents only (vLLM 0.24's TurboQuant spec, a ``FullAttentionSpec``)."""
    UNIFORM_TYPE = "UniformTypeKVCacheSpecs"

    @classmethod
    def of(cls, name: object) -> KVCacheSpecKind | None:
        """The member named ``name`` (a class name), or None for a kind kvplan does not know."""
        return cls._value2member_map_.get(name) if isinstance(name, str) else None  # type: ignore[return-value]

    @property
    def family(self) -> KVCacheSpecFamily:
        """vLLM's ``get_kv_cache_spec_kind`` of a spec of this class (``UNKNOWN`` for
        ``UniformTypeKVCacheSpecs``, decided per instance by :func:`base_kind`)."""
        return _FAMILY.get(self, KVCacheSpecFamily.UNKNOWN)

    @property
    def is_mamba(self) -> bool:
        return self is KVCacheSpecKind.MAMBA

    @property
    def is_mla(self) -> bool:
        """One latent vector per state, no separate K and V (MLA and its subclasses)."""
        return self in _MLA

    @property
    def is_raw_storage(self) -> bool:
        """Layers keep the raw backing buffer: no per-layer view, no overlap rule."""
        return self in _RAW_STORAGE

    @property
    def is_attention(self) -> bool:
        """An ``AttentionSpec``: ``[B, H, N, C]`` pages of K and V (or an MLA latent)."""
        return not (self.is_mamba or self.is_raw_storage or self is KVCacheSpecKind.UNIFORM_TYPE)

    @property
    def groups_with_full_attention(self) -> bool:
        """vLLM registers this class with ``uniform_type_base_spec=FullAttentionSpec``
        (``register_all_kvcache_specs`` in ``vllm/v1/core/single_type_kv_cache_manager.py``)."""
        return self in _FULL_ATTENTION_BASE


_FAMILY: dict[KVCacheSpecKind, KVCacheSpecFamily] = {
    KVCacheSpecKind.SLIDING_WINDOW_MLA: KVCacheSpecFamily.SLIDING_WINDOW_MLA,
    KVCacheSpecKind.MLA_ATTENTION: KVCacheSpecFamily.MLA_ATTENTION,
    KVCacheSpecKind.HIDDEN_STATE_CACHE: KVCacheSpecFamily.MLA_ATTENTION,
    KVCacheSpecKind.SINK_FULL_ATTENTION: KVCacheSpecFamily.SINK_FULL_ATTENTION,
    KVCacheSpecKind.FULL_ATTENTION: KVCacheSpecFamily.FULL_ATTENTION,
    KVCacheSpecKind.RSWA: KVCacheSpecFamily.FULL_ATTENTION,
    KVCacheSpecKind.TQ_FULL_ATTENTION: KVCacheSpecFamily.FULL_ATTENTION,
    KVCacheSpecKind.CHUNKED_LOCAL_ATTENTION: KVCacheSpecFamily.CHUNKED_LOCAL_ATTENTION,
    KVCacheSpecKind.SLIDING_WINDOW: KVCacheSpecFamily.SLIDING_WINDOW,
    KVCacheSpecKind.MAMBA: KVCacheSpecFamily.MAMBA,
    KVCacheSpecKind.ENCODER_ONLY_ATTENTION: KVCacheSpecFamily.ENCODER_ONLY_ATTENTION,
    KVCacheSpecKind.CROSS_ATTENTION: KVCacheSpecFamily.CROSS_ATTENTION,
}
_MLA = frozenset(
    {
        KVCacheSpecKind.MLA_ATTENTION,
        KVCacheSpecKind.HIDDEN_STATE_CACHE,
        KVCacheSpecKind.SLIDING_WINDOW_MLA,
    }
)
_RAW_STORAGE = frozenset({KVCacheSpecKind.HISPARSE_HOT, KVCacheSpecKind.HISPARSE_RESIDENT})
_FULL_ATTENTION_BASE = frozenset(
    {
        KVCacheSpecKind.FULL_ATTENTION,
        KVCacheSpecKind.MLA_ATTENTION,
        KVCacheSpecKind.RSWA,
        KVCacheSpecKind.HIDDEN_STATE_CACHE,
        KVCacheSpecKind.SINK_FULL_ATTENTION,
    }
)


class MultipleOf(BaseModel):
    """vLLM's ``MultipleOf(n)``: block strides must hold whole kernel blocks of ``n`` tokens."""

    model_config = FROZEN
    multiple_of: int = Field(gt=0)


class KVCacheSpec(OmitsLaterFields):
    """Base class of every spec model, named after vLLM's: the fields every spec has."""

    model_config = FROZEN

    kind: str = ""
    block_size: int = Field(gt=0, description="tokens per block")
    dcp_sharded: bool = False
    block_stride_alignment: Annotated[int, Field(gt=0)] | MultipleOf | None = None
    is_draft: bool = False

    # -- derived geometry (override per family) ---------------------------------------
    @property
    def num_heads(self) -> int:
        raise NotImplementedError

    @property
    def tokens_per_state_value(self) -> Fraction:
        raise NotImplementedError

    @property
    def state_content_size_bytes(self) -> int:
        raise NotImplementedError

    def num_kernel_states(self, kernel_block_size: int) -> int:
        """States ``N`` in a kernel block of ``kernel_block_size`` tokens."""
        tps = self.tokens_per_state_value
        if tps > 0:
            return int(kernel_block_size // tps)
        return 1

    @property
    def num_states(self) -> int:
        return self.num_kernel_states(self.block_size)

    # -- page sizes: page_size_for() and page_size_bytes; families override the two hooks --
    def _unpadded_page(self, block_size: int) -> int:
        """Hook: bytes of one unpadded page holding ``block_size`` tokens."""
        return self.num_heads * self.num_kernel_states(block_size) * self.state_content_size_bytes

    def _padded_page(self, unpadded: int) -> int | None:
        """Hook: the padded size of an ``unpadded``-byte page, or None when not padded."""
        return None

    def page_size_for(self, block_size: int | None = None, *, padded: bool = True) -> int:
        """Bytes of one page of ``block_size`` tokens (default: the spec's ``block_size``):
        vLLM's ``copy_with_new_block_size(block_size).page_size_bytes``, or with
        ``padded=False`` its ``real_page_size_bytes`` (the page before padding)."""
        unpadded = self._unpadded_page(self.block_size if block_size is None else block_size)
        if not padded:
            return unpadded
        pad = self._padded_page(unpadded)
        return unpadded if pad is None else pad

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer (the padded page where the spec pads)."""
        return self.page_size_for()

    @property
    def padded_page_size_bytes(self) -> int | None:
        """The padded page in bytes, or None when pages are not padded (layouts differ)."""
        return self._padded_page(self.page_size_for(padded=False))

    @property
    def has_layer_views(self) -> bool:
        return True

    @property
    def view_dtype(self) -> str:
        """dtype of the bound per-layer tensor (vLLM views attention pages as ``spec.dtype``)."""
        return "int8"

    def block_stride_alignment_bytes(self) -> int:
        """Bytes the stride between physical blocks must be a multiple of."""
        alignment = self.block_stride_alignment
        if not isinstance(alignment, MultipleOf):
            return alignment or 1
        kernel = math.gcd(alignment.multiple_of, self.block_size)
        if kernel == self.block_size:
            return 1
        return self.page_size_for(kernel)


class _RawStorageSpec(KVCacheSpec):
    """A spec whose layers keep the raw backing buffer and lay it out themselves."""

    page_size: int = Field(gt=0)

    def _unpadded_page(self, block_size: int) -> int:
        return self.page_size

    @property
    def has_layer_views(self) -> bool:
        return False


class HiSparseHotSpec(_RawStorageSpec):
    """Per-request HiSparse hot cache; raw storage, no per-layer views."""

    kind: Literal["HiSparseHotSpec"] = "HiSparseHotSpec"
    blocks_per_request: int = Field(ge=0)


class HiSparseResidentSpec(_RawStorageSpec):
    """HiSparse resident pool; raw storage, no per-layer views."""

    kind: Literal["HiSparseResidentSpec"] = "HiSparseResidentSpec"


class AttentionSpec(KVCacheSpec):
    """``AttentionSpec``: ``[B, H, N, C]`` pages with K and V packed in ``C``."""

    kind: Literal["AttentionSpec"] = "AttentionSpec"
    dcp_sharded: bool = True
    max_tp_shards: int | None = Field(default=None, gt=0)
    num_kv_heads: int = Field(gt=0)
    head_size: int = Field(gt=0)
    dtype: DType
    head_size_v: int | None = Field(default=None, ge=0)
    kv_quant_mode: KVQuantModeField = KVQuantMode.NONE
    page_size_padded: int | None = Field(default=None, gt=0)
    num_head_slots: int | None = Field(default=None, gt=0)
    state_content_bytes: int | None = Field(default=None, gt=0)
    tokens_per_state: FractionValue = Fraction(1)
    kv_head_major_slots: bool = False
    """vLLM 0.34: the ``num_head_slots`` slots are grouped by KV head (``H2ND``); the view's
    geometry is the same."""

    LATER_FIELDS: ClassVar[tuple[str, ...]] = ("kv_head_major_slots",)

    @model_validator(mode="after")
    def _positive_tokens_per_state(self) -> AttentionSpec:
        if self.tokens_per_state <= 0:
            raise ValueError(f"tokens_per_state must be positive, got {self.tokens_per_state}")
        if self.tokens_per_state > self.block_size:
            raise ValueError(
                f"tokens_per_state {self.tokens_per_state} exceeds block_size {self.block_size}: "
                "a block would hold no state"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_head_size_v(cls, data: Any) -> Any:
        # vLLM's __post_init__: head_size_v=None means "same as head_size".
        if isinstance(data, dict):
            default = cls.model_fields["head_size_v"].default
            if data.get("head_size_v", default) is None and "head_size" in data:
                data = {**data, "head_size_v": data["head_size"]}
        return data

    @property
    def num_heads(self) -> int:
        return self.num_head_slots if self.num_head_slots is not None else self.num_kv_heads

    @property
    def tokens_per_state_value(self) -> Fraction:
        return self.tokens_per_state

    @property
    def state_content_size_bytes(self) -> int:
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        head_size_v = self.head_size if self.head_size_v is None else self.head_size_v
        return (self.head_size + head_size_v) * itemsize(self.dtype)

    def _padded_page(self, unpadded: int) -> int | None:
        return self.page_size_padded

    @property
    def view_dtype(self) -> str:
        return self.dtype


class FullAttentionSpec(AttentionSpec):
    kind: Literal["FullAttentionSpec"] = "FullAttentionSpec"  # type: ignore[assignment]
    sliding_window: int | None = Field(default=None, gt=0)
    attention_chunk_size: int | None = Field(default=None, gt=0)
    non_causal: bool = False


class _AlignedMLA:
    """MLA's ``_apply_alignment_padding``: pages round up to ``alignment`` bytes."""

    alignment: int | None
    page_size_padded: int | None

    def _padded_page(self, unpadded: int) -> int | None:
        if self.alignment:
            padded = -(-unpadded // self.alignment) * self.alignment
            if padded != unpadded:
                return padded
        return self.page_size_padded


class MLAAttentionSpec(_AlignedMLA, FullAttentionSpec):
    """Multi-head latent attention: one latent vector per state, ``H == 1``, no V."""

    kind: Literal["MLAAttentionSpec"] = "MLAAttentionSpec"  # type: ignore[assignment]
    cache_dtype_str: str | None = None
    topk_buffer_width: int | None = Field(default=None, ge=0)
    alignment: int | None = Field(default=None, gt=0)
    model_version: str | None = None
    cache_role: SparseCacheRoleField = SparseCacheRole.SPARSE
    is_index_group_leader: bool = False
    non_causal_multi_token_decode: bool = False
    head_size_v: int | None = Field(default=0, ge=0)
    storage_block_size: int | None = Field(
        default=None,
        gt=0,
        description=(
            "vLLM 0.30-0.31 only: the token width allocate_kv_cache views this spec's "
            "storage with, instead of the group's kernel block size"
        ),
    )

    # Written only when set: documents of releases without the field (0.29, 0.32+) keep
    # their bytes and fingerprints.
    LATER_FIELDS = (*AttentionSpec.LATER_FIELDS, "storage_block_size")


class HiddenStateCacheSpec(MLAAttentionSpec):
    kind: Literal["HiddenStateCacheSpec"] = "HiddenStateCacheSpec"  # type: ignore[assignment]


class RSWASpec(FullAttentionSpec):
    kind: Literal["RSWASpec"] = "RSWASpec"  # type: ignore[assignment]
    rswa_window: int = Field(gt=0)


class ChunkedLocalAttentionSpec(AttentionSpec):
    kind: Literal["ChunkedLocalAttentionSpec"] = "ChunkedLocalAttentionSpec"  # type: ignore[assignment]
    attention_chunk_size: int = Field(gt=0)


class SlidingWindowSpec(AttentionSpec):
    kind: Literal["SlidingWindowSpec"] = "SlidingWindowSpec"  # type: ignore[assignment]
    sliding_window: int = Field(gt=0)
    extra_retained_tokens: int = Field(default=0, ge=0)


class CircularBufferSpec(AttentionSpec):
    kind: Literal["CircularBufferSpec"] = "CircularBufferSpec"  # type: ignore[assignment]


class SlidingWindowMLASpec(_AlignedMLA, SlidingWindowSpec):
    kind: Literal["SlidingWindowMLASpec"] = "SlidingWindowMLASpec"  # type: ignore[assignment]
    cache_dtype_str: str | None = None
    alignment: int | None = Field(default=None, gt=0)
    model_version: str | None = None
    bounded_replay: bool = False
    head_size_v: int | None = Field(default=0, ge=0)
    non_causal_multi_token_decode: bool = False
    """vLLM 0.34 (windowed drafts): a group capability; no effect on the geometry."""

    LATER_FIELDS = (*AttentionSpec.LATER_FIELDS, "non_causal_multi_token_decode")


class EncoderOnlyAttentionSpec(AttentionSpec):
    """Encoder-only attention: the V1 runner adds its group; it owns no tensor."""

    kind: Literal["EncoderOnlyAttentionSpec"] = "EncoderOnlyAttentionSpec"  # type: ignore[assignment]


class CrossAttentionSpec(AttentionSpec):
    kind: Literal["CrossAttentionSpec"] = "CrossAttentionSpec"  # type: ignore[assignment]


class SinkFullAttentionSpec(FullAttentionSpec):
    kind: Literal["SinkFullAttentionSpec"] = "SinkFullAttentionSpec"  # type: ignore[assignment]
    sink_len: int | None = Field(default=None, ge=0)


class MambaSpec(KVCacheSpec):
    """Mamba/linear-attention state: an int8 ``[B, 1, 1, C]`` page the layer unpacks itself."""

    kind: Literal["MambaSpec"] = "MambaSpec"
    shapes: list[Annotated[list[Annotated[int, Field(gt=0)]], Field(max_length=MAX_DIMS)]] = Field(
        min_length=1,
        max_length=MAX_DIMS,
        description="state shapes; every dimension positive (no empty state)",
    )
    dtypes: list[DType] = Field(max_length=MAX_DIMS)
    page_size_padded: int | None = Field(default=None, gt=0)
    mamba_type: str = "MAMBA2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = Field(default=0, ge=0)
    num_prefill_checkpoint_blocks: int = Field(default=0, ge=0)
    prefill_checkpoint_alignment: int | None = Field(default=None, gt=0)
    num_heads_: int = Field(default=1, alias="num_heads", gt=0)
    tokens_per_state: int = Field(default=-1, ge=-1, description="-1: one state per block")
    tp_replicated: bool = False
    state_alignment: int = Field(default=1, gt=0)
    """vLLM 0.34: every state's bytes are rounded up to a multiple of this in the page (16
    under FlashInfer's ReplaySSM)."""

    model_config = ConfigDict(**FROZEN, populate_by_name=True)
    LATER_FIELDS: ClassVar[tuple[str, ...]] = ("state_alignment",)

    @model_validator(mode="after")
    def _shapes_match_dtypes(self) -> MambaSpec:
        if len(self.shapes) != len(self.dtypes):
            raise ValueError(
                f"shapes has {len(self.shapes)} entries but dtypes has {len(self.dtypes)}"
            )
        if self.tokens_per_state == 0:
            raise ValueError("tokens_per_state must be -1 (one state per block) or positive")
        return self

    @property
    def num_heads(self) -> int:
        return self.num_heads_

    @property
    def tokens_per_state_value(self) -> Fraction:
        return Fraction(self.tokens_per_state)

    @property
    def state_content_size_bytes(self) -> int:
        align = self.state_alignment
        return sum(
            -(-math.prod(shape) * itemsize(dtype) // align) * align
            for shape, dtype in zip(self.shapes, self.dtypes, strict=True)
        )

    def _unpadded_page(self, block_size: int) -> int:
        # vLLM's MambaSpec.page_size_bytes is the state size, whatever the block size.
        return self.state_content_size_bytes

    def _padded_page(self, unpadded: int) -> int | None:
        return self.page_size_padded


LeafSpec = Annotated[
    (
        FullAttentionSpec
        | SlidingWindowSpec
        | MLAAttentionSpec
        | HiddenStateCacheSpec
        | RSWASpec
        | ChunkedLocalAttentionSpec
        | CircularBufferSpec
        | SlidingWindowMLASpec
        | EncoderOnlyAttentionSpec
        | CrossAttentionSpec
        | SinkFullAttentionSpec
        | MambaSpec
        | HiSparseHotSpec
        | HiSparseResidentSpec
        | AttentionSpec
    ),
    Field(discriminator="kind"),
]


class UniformTypeKVCacheSpecs(KVCacheSpec):
    """One group of same-type layers with per-layer specs (block-outermost packing)."""

    kind: Literal["UniformTypeKVCacheSpecs"] = "UniformTypeKVCacheSpecs"
    kv_cache_specs: dict[str, LeafSpec] = items(
        min_length=1, description="one spec per layer; at least one"
    )

    @model_validator(mode="before")
    @classmethod
    def _dcp_from_first(cls, data: Any) -> Any:
        # vLLM's __post_init__ copies dcp_sharded from the first layer spec.
        if isinstance(data, dict):
            specs = data.get("kv_cache_specs")
            if isinstance(specs, dict) and specs:
                first = next(iter(specs.values()))
                value = first.get("dcp_sharded") if isinstance(first, dict) else None
                if value is None and isinstance(first, dict):
                    kind = first.get("kind")
                    known = KVCacheSpecKind.of(kind)
                    value = known is None or known.is_attention
                if isinstance(first, KVCacheSpec):
                    value = first.dcp_sharded
                if value is not None:
                    data = {**data, "dcp_sharded": value}
        return data

    @property
    def first_spec(self) -> KVCacheSpec:
        return next(iter(self.kv_cache_specs.values()))

    @property
    def num_heads(self) -> int:
        return self.first_spec.num_heads

    @property
    def tokens_per_state_value(self) -> Fraction:
        return self.first_spec.tokens_per_state_value

    @property
    def state_content_size_bytes(self) -> int:
        return self.first_spec.state_content_size_bytes

    @property
    def has_layer_views(self) -> bool:
        return self.first_spec.has_layer_views

    def page_size_for(self, block_size: int | None = None, *, padded: bool = True) -> int:
        """The sum of its layers' pages (each at its own block size by default)."""
        specs = self.kv_cache_specs.values()
        return sum(spec.page_size_for(block_size, padded=padded) for spec in specs)


AnySpec = Annotated[
    LeafSpec | UniformTypeKVCacheSpecs,
    Field(discriminator="kind"),
]
"""Any spec a ``KVCacheGroupSpec`` may carry, chosen by ``kind`` (the vLLM class name)."""

SPEC_KINDS: tuple[str, ...] = tuple(
    kind for kind in KVCacheSpecKind if kind is not KVCacheSpecKind.TQ_FULL_ATTENTION
)
"""The kinds a ``kvplan.input/1`` document may name (every vLLM 0.33 spec class)."""


def layer_spec(group_spec: KVCacheSpec, layer: str) -> KVCacheSpec | None:
    """The spec of ``layer`` in a group: itself, or its entry of a ``UniformTypeKVCacheSpecs``."""
    if isinstance(group_spec, UniformTypeKVCacheSpecs):
        return group_spec.kv_cache_specs.get(layer)
    return group_spec


class _HasKind(Protocol):
    @property
    def kind(self) -> str: ...


def spec_kind(spec: _HasKind) -> KVCacheSpecKind:
    """The :class:`KVCacheSpecKind` of a spec model (current or legacy)."""
    return KVCacheSpecKind(spec.kind)


def base_kind(spec: KVCacheSpec) -> KVCacheSpecFamily:
    """The attention family used for alias compatibility (vLLM's ``get_kv_cache_spec_kind``).

    A ``UniformTypeKVCacheSpecs`` of one inner family has that family; of several, it is
    full attention when every inner class groups with ``FullAttentionSpec`` (e.g. MLA and
    full attention layers merged into one group), else unknown -- vLLM 0.33's
    ``get_kv_cache_spec_kind`` in ``vllm/v1/kv_cache_interface.py``, which asks
    ``KVCacheSpecRegistry.get_uniform_type_base_spec`` for each inner spec.
    """
    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = [spec_kind(s) for s in spec.kv_cache_specs.values()]
        families = {kind.family for kind in inner}
        if len(families) == 1:
            return families.pop()
        if all(kind.groups_with_full_attention for kind in inner):
            return KVCacheSpecFamily.FULL_ATTENTION
        return KVCacheSpecFamily.UNKNOWN
    return spec_kind(spec).family
