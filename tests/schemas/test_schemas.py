"""Input-document encoding rules and derived spec geometry (vLLM 0.33 formulas)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from harness import _builders as b
from kvplan.schemas import (
    FullAttentionSpec,
    KVPlanError,
    MambaSpec,
    MLAAttentionSpec,
    UniformTypeKVCacheSpecs,
)
from kvplan.schemas.canonical import to_json
from kvplan.schemas.loading import parse_input, parse_text


def test_head_size_v_defaults_to_head_size_but_mla_defaults_to_zero() -> None:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=32, dtype="bfloat16")
    assert spec.head_size_v == 32
    assert spec.page_size_bytes == 2 * 16 * (32 + 32) * 2
    mla = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype="bfloat16")
    assert mla.head_size_v == 0
    assert mla.page_size_bytes == 64 * 576 * 2  # 73728, vLLM's DeepSeek-V2 page


def test_dtype_accepts_torch_prefix_and_dumps_without_it() -> None:
    spec = FullAttentionSpec.model_validate(
        {"block_size": 16, "num_kv_heads": 1, "head_size": 8, "dtype": "torch.float8_e4m3fn"}
    )
    assert spec.dtype == "float8_e4m3fn"
    assert '"float8_e4m3fn"' in spec.model_dump_json()


def test_fraction_tokens_per_state_parses_and_dumps_as_n_over_d() -> None:
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16", tokens_per_state="1/4"
    )  # type: ignore[arg-type]
    assert spec.tokens_per_state == Fraction(1, 4)
    assert spec.num_states == 64  # Whisper block pooling: 4 states per token
    assert spec.model_dump(mode="json")["tokens_per_state"] == "1/4"
    whole = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")
    assert whole.model_dump(mode="json")["tokens_per_state"] == 1


def test_inline_per_token_head_scales_widen_the_state() -> None:
    # TritonAttention int8_per_token_head: C = (32 + 32) * 1 + 2 * 4 bytes = 72
    spec = FullAttentionSpec(
        block_size=16,
        num_kv_heads=2,
        head_size=32,
        dtype="int8",
        kv_quant_mode="INT8_PER_TOKEN_HEAD",
        state_content_bytes=72,
    )
    assert spec.page_size_bytes == 2304
    assert spec.model_dump(mode="json")["kv_quant_mode"] == "INT8_PER_TOKEN_HEAD"


def test_custom_quant_mode_is_vllms_alias_of_octave_k3v4() -> None:
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=8, dtype="uint8", kv_quant_mode="CUSTOM"
    )  # type: ignore[arg-type]
    assert spec.model_dump(mode="json")["kv_quant_mode"] == "OCTAVE_K3V4"


def test_mla_alignment_pads_the_page() -> None:
    spec = MLAAttentionSpec(
        block_size=64,
        num_kv_heads=1,
        head_size=656,
        dtype="uint8",
        state_content_bytes=656,
        alignment=576,
    )
    assert spec.page_size_for(padded=False) == 64 * 656
    assert spec.page_size_bytes == -(-64 * 656 // 576) * 576


def test_mamba_page_is_state_bytes_or_padding() -> None:
    spec = MambaSpec(block_size=272, shapes=[[3, 4352], [64, 874]], dtypes=["bfloat16"] * 2)
    assert spec.page_size_bytes == 137984
    padded = spec.model_copy(update={"page_size_padded": 139264})
    assert padded.page_size_bytes == 139264
    assert padded.num_heads == 1 and padded.num_states == 1
    assert (
        MambaSpec.model_validate(
            {"block_size": 16, "shapes": [[4]], "dtypes": ["int8"], "num_heads": 1}
        ).num_heads
        == 1
    )


def test_uniform_type_specs_sum_pages_and_take_dcp_from_first() -> None:
    doc = parse_input(b.gemma4_e2b("BLHNC"))
    spec = doc.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    assert isinstance(spec, UniformTypeKVCacheSpecs)
    assert spec.page_size_bytes == 6 * 16384  # reference: page=98304
    assert spec.dcp_sharded is True


def test_multiple_of_alignment_is_a_kernel_block_page() -> None:
    spec = FullAttentionSpec(
        block_size=32,
        num_kv_heads=1,
        head_size=256,
        dtype="bfloat16",
        block_stride_alignment={"multiple_of": 16},
    )  # type: ignore[arg-type]
    assert spec.block_stride_alignment_bytes() == 16 * 512 * 2
    assert spec.model_dump(mode="json")["block_stride_alignment"] == {"multiple_of": 16}


def test_nhd_and_hnd_are_layout_aliases() -> None:
    for alias, canon in (("NHD", "LBNHC"), ("HND", "LBHNC")):
        doc = b.llama(2, layout="LBNHC")
        doc["kv_cache_config"]["kv_cache_layout"] = alias
        assert parse_input(doc).kv_cache_config.kv_cache_layout.name == canon  # type: ignore[union-attr]


def test_unknown_kind_names_the_kind_and_its_field() -> None:
    doc = b.llama(2)
    doc["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]["kind"] = "WarpSpec"
    with pytest.raises(KVPlanError) as info:
        parse_input(doc)
    diag = info.value.diagnostics[0]
    assert diag.code.value == "KVP005"
    assert "WarpSpec" in diag.message
    assert diag.location == "kv_cache_config.kv_cache_groups[0].kv_cache_spec"


def test_yaml_and_json_give_the_same_document() -> None:
    import yaml

    doc = b.gemma4_e2b()
    from_yaml = parse_input(parse_text(yaml.safe_dump(doc), "doc.yaml"))
    assert from_yaml == parse_input(doc)


def test_canonical_json_round_trip_is_byte_identical() -> None:
    doc = parse_input(b.gemma4_e2b("BLHNC"))
    text = to_json(doc)
    again = parse_input(parse_text(text, "x.json"))
    assert to_json(again) == text


def test_spec_kinds_are_one_enum_that_names_every_model() -> None:
    from typing import get_args

    from kvplan.schemas.legacy import LEGACY_SPEC_KINDS, LegacyAnySpec
    from kvplan.schemas.specs import SPEC_KINDS, AnySpec, KVCacheSpecKind

    def kinds(union: object) -> set[str]:
        found: set[str] = set()
        for member in get_args(get_args(union)[0]):
            if hasattr(member, "model_fields"):
                found.add(member.model_fields["kind"].default)
            else:
                found |= kinds(member)
        return found

    assert kinds(AnySpec) == set(SPEC_KINDS)
    assert kinds(LegacyAnySpec) == set(LEGACY_SPEC_KINDS)
    assert set(SPEC_KINDS) | set(LEGACY_SPEC_KINDS) == {k.value for k in KVCacheSpecKind}
    assert KVCacheSpecKind("MambaSpec").is_mamba
    assert KVCacheSpecKind.HISPARSE_HOT.is_raw_storage
    assert not KVCacheSpecKind.HISPARSE_HOT.is_attention
    assert KVCacheSpecKind.SLIDING_WINDOW_MLA.is_mla
    assert KVCacheSpecKind.of("NoSuchSpec") is None


def test_base_kind_of_mixed_uniform_group_is_full_attention_as_in_vllm() -> None:
    # vLLM 0.33 get_kv_cache_spec_kind: mixed inner kinds that all group with
    # FullAttentionSpec (MLA, RSWA, sink...) are full attention; any other mix is unknown.
    from kvplan.schemas.specs import KVCacheSpecFamily, SlidingWindowSpec, base_kind

    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=32, dtype="bfloat16")
    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16")
    swa = SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=32, dtype="bfloat16", sliding_window=128
    )
    assert base_kind(mla) is KVCacheSpecFamily.MLA_ATTENTION
    mixed = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full, "b": mla})
    assert base_kind(mixed) is KVCacheSpecFamily.FULL_ATTENTION
    same = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": mla, "b": mla})
    assert base_kind(same) is KVCacheSpecFamily.MLA_ATTENTION
    other = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full, "b": swa})
    assert base_kind(other) is KVCacheSpecFamily.UNKNOWN


def test_findings_carry_errors_and_warnings_and_raise_only_for_errors() -> None:
    from kvplan.schemas.errors import Code, Findings, error, warning

    found = Findings(
        [
            warning(Code.POOL_NOT_GRANULAR, "pools.kv", "pool is 3 bytes", "round it"),
            error(Code.ALIAS_SELF, "aliases.a", "layer aliases itself", "remove the alias."),
        ]
    )
    assert [d.code for d in found.errors] == [Code.ALIAS_SELF]
    assert [d.code for d in found.warnings] == [Code.POOL_NOT_GRANULAR]
    assert not found.ok and Findings(found.warnings).ok
    Findings(found.warnings).raise_for_errors()  # warnings alone do not raise
    with pytest.raises(KVPlanError) as raised:
        Findings(found.warnings).raise_for_errors(strict=True)
    assert raised.value.code == Code.POOL_NOT_GRANULAR
    with pytest.raises(KVPlanError) as raised:
        found.raise_for_errors()
    assert raised.value.diagnostics == found.errors
    # one message style, errors first: "<CODE> <severity> at <where>: <what>. Fix: <do>."
    assert found.render().splitlines() == [
        "KVP205 error at aliases.a: layer aliases itself. Fix: remove the alias.",
        "KVP308 warning at pools.kv: pool is 3 bytes. Fix: round it.",
    ]
