"""Version adapters: discovery, the supported range, per-release refusals, and the plugin's
rank and host-vmm checks."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvplan.integrations.vllm import plugin, versions
from kvplan.integrations.vllm.versions import adapter_for, all_adapters, supported_range
from kvplan.schemas.errors import Code, KVPlanError
from tests.plugin._models import ModelCase
from tests.plugin._runners import via_v1, via_v2
from tests.plugin.conftest import LoadPlugin

pytestmark = pytest.mark.vllm


def test_registry_api() -> None:
    (adapter,) = all_adapters()
    assert adapter.releases == ("0.32", "0.33") and adapter.form == "placement"
    assert adapter_for("0.33.0") is adapter and adapter_for("0.32.1rc1.dev4+g12") is adapter
    for unsupported in ("0.28.0", "0.31.0", "0.34.0", "garbage"):
        assert adapter_for(unsupported) is None
    assert supported_range() == "0.32–0.33"
    runners = {t.name: t.runner for t in adapter.targets if t.role in ("runner", "tensors")}
    assert runners["vllm.v1.worker.gpu_model_runner.GPUModelRunner.initialize_kv_cache"] == "V1"
    assert runners["vllm.v1.worker.gpu.model_runner.GPUModelRunner.initialize_kv_cache"] == "V2"
    assert all(t.handler is not None for t in adapter.targets if t.patched)


@pytest.fixture
def extra_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A second folder on the versions package's path, discovery cache cleared around it."""
    monkeypatch.setattr(versions, "__path__", [*versions.__path__, str(tmp_path)])
    versions._discover.cache_clear()
    yield tmp_path
    versions._discover.cache_clear()


def test_a_new_release_is_one_new_module(extra_module: Path) -> None:
    (extra_module / "v0_34.py").write_text(
        textwrap.dedent(
            """
            import dataclasses
            from kvplan.integrations.vllm.versions.v0_33 import ADAPTER as _PREVIOUS
            ADAPTER = dataclasses.replace(_PREVIOUS, name="vllm-0.34", releases=("0.34",))
            """
        )
    )
    assert [a.name for a in all_adapters()] == ["vllm-0.32-0.33", "vllm-0.34"]
    adapter = adapter_for("0.34.2")
    assert adapter is not None and adapter.name == "vllm-0.34"
    assert supported_range() == "0.32–0.34"


def test_two_modules_claiming_a_release_is_an_error(extra_module: Path) -> None:
    (extra_module / "v0_33_again.py").write_text(
        "from kvplan.integrations.vllm.versions.v0_33 import ADAPTER\n"
    )
    with pytest.raises(RuntimeError, match="claimed by both"):
        all_adapters()


@pytest.mark.parametrize(
    ("version", "function", "needle"),
    [
        ("0.31.0", "vllm.v1.worker.utils.allocate_kv_cache", "storage_block_size"),
        ("0.30.1", "vllm.v1.worker.gpu.attn_utils.init_kv_cache", "attn_groups"),
        ("0.29.0", "vllm.v1.worker.utils.allocate_kv_cache", "num_blocks_of"),
    ],
)
def test_known_release_with_other_functions_is_refused_with_the_difference(
    version: str,
    function: str,
    needle: str,
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vllm

    monkeypatch.setattr(vllm, "__version__", version)
    with pytest.raises(KVPlanError) as info:
        load_plugin("torch")
    assert info.value.code is Code.INTEGRATION
    locations = [d.location for d in info.value.diagnostics[1:]]
    assert function in locations
    message = str(info.value)
    assert version in message and needle in message and "0.32–0.33" in message
    assert not plugin.is_active()


def test_release_0_32_binds_with_the_same_adapter(
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """0.32's wrapped functions are 0.33's: the plugin starts, and the document records
    the release it was captured from."""
    import kvplan
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.32.0")
    load_plugin("torch", dump_dir=tmp_path)
    _kv, runner = via_v1(model_case("llama"))
    assert plugin.stats()["bound"] == 1
    document = kvplan.load_input(tmp_path / "rank0.input.json")
    assert document.vllm_version == "0.32.0"
    assert kvplan.load_plan(tmp_path / "rank0.plan.json").source.vllm_version == "0.32.0"
    del runner


def test_a_runner_function_that_stops_calling_what_kvplan_relies_on_is_refused(
    load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def initialize_kv_cache_tensors(
        self: Any,
        kv_cache_config: Any,
        kernel_block_sizes: Any,
        kv_cache_allocation_context: Any = None,
    ) -> dict[str, Any]:
        return {}

    monkeypatch.setattr(GPUModelRunner, "initialize_kv_cache_tensors", initialize_kv_cache_tensors)
    with pytest.raises(KVPlanError) as info:
        load_plugin("torch")
    assert "no longer calls allocate_kv_cache, shared_kv_cache_layers" in str(info.value)
    assert not plugin.is_active()


def test_unreadable_rank_refuses_instead_of_guessing(
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    import torch.distributed as dist

    case = model_case("llama")
    assert dist.is_initialized()

    def broken_rank(group: Any = None) -> int:
        raise RuntimeError("the default process group is being torn down")

    monkeypatch.setattr(dist, "get_rank", broken_rank)
    load_plugin("torch", dump_dir=tmp_path)
    with pytest.raises(KVPlanError) as info:
        via_v2(case)
    codes = [d.code for d in info.value.diagnostics]
    assert codes[0] is Code.INTEGRATION and Code.RANK_UNKNOWN in codes
    assert "rank?" in str(info.value) and "torn down" in str(info.value)
    assert plugin.stats()["bound"] == 0 and list(tmp_path.iterdir()) == []


def test_host_vmm_needs_a_working_memfd(
    load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from kvplan.integrations.vllm._patch_settings import backend_status

    assert backend_status("host-vmm")[0]

    def no_memfd(name: str, flags: int = 0) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    usable, why = backend_status("host-vmm")
    assert not usable and "memfd_create" in why and "not permitted" in why
    with pytest.raises(KVPlanError, match="memfd_create"):
        load_plugin("host-vmm")
    assert not plugin.is_active()
