"""``kvplan inspect`` on models whose non-KV layers only build on GPUs, and remote code.

gemma-3n-E2B-it: its vision tower needs ``timm``, its MLP computes a constant with ``.item()``
while it is built. Nemotron-3-Nano: its MoE layers
use a non-gated activation that the CPU platform refuses. Both must inspect, and their plans
must equal what vLLM's own ``allocate_kv_cache`` binds. Hymba needs its repository's code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from tests.integrations.vllm.capture._cases import Case, shrunk_config

HERE = Path(__file__).resolve().parent
HYMBA = HERE / "configs" / "nvidia__Hymba-1.5B-Base"
GEMMA3N = "google/gemma-3n-E2B-it"
NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


def _layer(name: str) -> int:
    return int(name.split("layers.")[1].split(".")[0])


def test_gemma3n_inspects_and_equals_vllm_allocation(vllm_session: None) -> None:
    from kvplan.cli.inspect_cmd import verify_result
    from kvplan.integrations.vllm.inspect import InspectOptions, inspect_model

    result = inspect_model(GEMMA3N, InspectOptions(max_model_len=4096))
    assert result.architecture == "Gemma3nForConditionalGeneration"
    assert result.attention_layers == 30
    plan = result.plan
    # 30 layers, the last 10 share the KV cache of layers 18 (sliding) and 19 (full).
    assert len(plan.views) == 20 and len(plan.aliases) == 10
    assert {_layer(alias.layer) for alias in plan.aliases} == set(range(20, 30))
    assert {_layer(alias.target) for alias in plan.aliases} == {18, 19}
    assert verify_result(result) == []


def test_a_skipped_tower_that_fails_is_dropped_and_named(vllm_session: None) -> None:
    """Without ``timm`` the vision tower cannot be built: it is dropped with a note."""
    import importlib.util

    from kvplan.integrations.vllm.inspect import InspectOptions, inspect_model

    result = inspect_model(GEMMA3N, InspectOptions(max_model_len=4096))
    towers = [note for note in result.notes if "tower" in note]
    if importlib.util.find_spec("timm") is None:
        assert any("image tower" in note and "timm" in note for note in towers), result.notes
    assert all("holds no KV cache" in note for note in towers)


def test_a_failing_tower_that_registered_attention_is_not_dropped(vllm_session: None) -> None:
    """A tower that fails after registering a KV layer fails the build, as vLLM would."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.models.interfaces import SupportsMultiModal

    from kvplan.integrations.vllm.inspect._build import skipped_towers_tolerated

    class FakeAttention(AttentionLayerBase):
        pass

    FakeAttention.__abstractmethods__ = frozenset()

    class FakeModel(SupportsMultiModal):
        pass

    skipped = SimpleNamespace(get_limit_per_prompt=lambda modality: 0)
    fake_config = SimpleNamespace(
        model_config=SimpleNamespace(get_multimodal_config=lambda: skipped)
    )
    current = VllmConfig()
    model = object.__new__(FakeModel)
    original = SupportsMultiModal.__dict__["_mark_tower_model"]

    @contextmanager
    def plain(self, vllm_config, modalities, **kwargs):  # type: ignore[no-untyped-def]
        yield

    SupportsMultiModal._mark_tower_model = plain  # type: ignore[method-assign,assignment]
    try:
        context = current.compilation_config.static_forward_context
        dropped: list[str] = []
        with set_current_vllm_config(current), skipped_towers_tolerated(dropped):
            with model._mark_tower_model(fake_config, "image"):
                raise ImportError("needs a package")
            assert dropped == ["FakeModel image tower: ImportError: needs a package"]
            with (
                pytest.raises(ImportError, match="another"),
                model._mark_tower_model(fake_config, "audio"),
            ):
                context["tower.attn"] = FakeAttention()
                raise ImportError("needs another package")
        assert len(dropped) == 1
    finally:
        SupportsMultiModal._mark_tower_model = original  # type: ignore[method-assign]
    assert SupportsMultiModal.__dict__["_mark_tower_model"] is original


def test_moe_layers_without_a_cpu_kernel_build(vllm_session: None, tmp_path: Path) -> None:
    """Nemotron-3-Nano (relu2 MoE, Mamba, attention), cut to 8 layers, equals vLLM's tensors."""
    from kvplan.cli.inspect_cmd import verify_result
    from kvplan.integrations.vllm.inspect import InspectOptions, inspect_model

    folder = shrunk_config(
        Case(NANO, layers=8, config_overrides={"hybrid_override_pattern": "MEM*EM*E"}),
        tmp_path / "nano",
    )
    result = inspect_model(str(folder), InspectOptions(max_model_len=4096))
    assert result.architecture == "NemotronHForCausalLM"
    kinds = sorted(
        group.kv_cache_spec.kind for group in result.document.kv_cache_config.kv_cache_groups
    )
    assert "FullAttentionSpec" in kinds and "MambaSpec" in kinds
    assert len(result.plan.views) == 5  # 2 attention + 3 Mamba layers
    assert verify_result(result) == []


def test_cpu_platform_is_restored_after_inspect(vllm_session: None) -> None:
    """The MoE answers are scoped to the emulation, and restored after it."""
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
    from vllm.model_executor.layers.fused_moe.oracle import unquantized as oracle

    from kvplan.integrations.vllm.inspect._emulation import cuda_platform

    inside = (FusedMoEConfig.__dict__["__post_init__"], method.select_unquantized_moe_backend)
    with cuda_platform():
        pass
    assert (FusedMoEConfig.__dict__["__post_init__"], method.select_unquantized_moe_backend) == (
        inside
    )
    # The fixture's emulation is active here; vLLM's originals are what it wraps.
    assert oracle.select_unquantized_moe_backend is not method.select_unquantized_moe_backend


def test_remote_code_files_from_auto_map() -> None:
    from kvplan.integrations.vllm.inspect import remote_code_files

    config = json.loads((HYMBA / "config.json").read_text())
    assert remote_code_files(config) == ["configuration_hymba.py", "modeling_hymba.py"]
    assert remote_code_files({"auto_map": {"AutoTokenizer": ["tok.Tok", None]}}) == []
    assert remote_code_files({"auto_map": {"AutoConfig": "org/repo--pkg.cfg.Cfg"}}) == [
        "pkg/cfg.py"
    ]
    assert remote_code_files({}) == []


def test_remote_code_model_without_the_flag_is_kvp520(vllm_session: None) -> None:
    result = CliRunner().invoke(app, ["inspect", str(HYMBA)])
    assert result.exit_code == 2, result.output
    assert "KVP520 error at " in result.output
    assert "--trust-remote-code" in result.output
    assert "Traceback" not in result.output


def test_trust_remote_code_offline_without_the_code_is_kvp521(
    vllm_session: None, tmp_path: Path
) -> None:
    result = CliRunner().invoke(app, ["inspect", str(HYMBA), "--trust-remote-code"])
    assert result.exit_code == 2, result.output
    assert "KVP521 error at " in result.output
    assert "configuration_hymba.py, modeling_hymba.py" in result.output
    assert "Traceback" not in result.output
    # A catalog model with auto_map is refused the same way (only config.json is bundled).
    catalog = CliRunner().invoke(app, ["inspect", NANO, "--trust-remote-code"])
    assert catalog.exit_code == 2 and "KVP521 error at " in catalog.output
    assert "bundled catalog holds only config.json" in catalog.output
    # With the code beside config.json, the check lets vLLM load it.
    folder = tmp_path / "hymba"
    shutil.copytree(HYMBA, folder)
    for name in ("configuration_hymba.py", "modeling_hymba.py"):
        (folder / name).write_text("")
    from kvplan.integrations.vllm.inspect import check_remote_code, resolve_model

    check_remote_code(resolve_model(str(folder)))


def test_golden_add_passes_trust_remote_code(vllm_session: None, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["golden", "add", str(tmp_path), str(HYMBA), "--trust-remote-code"]
    )
    assert result.exit_code == 2, result.output
    assert "KVP521 error at " in result.output
    assert not any(tmp_path.iterdir())
