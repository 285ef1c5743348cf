"""Loading the plugin through vLLM's own loader: all-or-nothing, idempotent, refusals."""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import Any

import pytest

from kvplan.integrations.vllm import plugin
from kvplan.integrations.vllm.versions import READ, Target, adapter_for, supported_range
from kvplan.schemas.errors import Code, KVPlanError
from tests.integrations.vllm.plugin.conftest import LoadPlugin

pytestmark = pytest.mark.vllm


@functools.cache
def _targets() -> tuple[Target, ...]:
    import vllm

    adapter = adapter_for(vllm.__version__)  # before any test fakes the version
    assert adapter is not None, vllm.__version__
    return adapter.targets


def _value(target: Target) -> Any:
    import importlib

    holder: Any = importlib.import_module(target.module)
    *owners, attr = target.qualname.split(".")
    for owner in owners:
        holder = getattr(holder, owner)
    return vars(holder)[attr] if owners else getattr(holder, attr)


def _wrapped(elastic: bool = False) -> dict[str, bool]:
    """Every site the plugin patches in that mode (elastic-only sites only in elastic mode)."""
    return {
        t.name: bool(getattr(_value(t), "__kvplan_wrapper__", False))
        for t in _targets()
        if t.role != READ and (elastic or not t.elastic_only)
    }


def test_disabled_patches_nothing(load_plugin: LoadPlugin) -> None:
    load_plugin(enable="0")
    assert not plugin.is_active()
    assert not any(_wrapped().values())


def test_enabled_patches_every_site_both_runners(load_plugin: LoadPlugin) -> None:
    originals = {t.name: _value(t) for t in _targets()}
    load_plugin("torch")
    assert plugin.is_active()
    assert all(_wrapped().values()), _wrapped()
    assert plugin.check_patches() == []
    for target in _targets():
        if target.role != READ and not target.elastic_only:
            assert _value(target).__wrapped__ is originals[target.name]
        if target.elastic_only:  # eager mode leaves the scheduler and workers' steps alone
            assert _value(target) is originals[target.name]
    settings = plugin.active_settings()
    assert settings is not None and settings.backend == "torch"


def test_elastic_mode_also_patches_the_scheduler_and_the_workers_step(
    load_plugin: LoadPlugin,
) -> None:
    elastic = {t.name for t in _targets() if t.elastic_only}
    assert elastic == {
        "vllm.v1.worker.gpu_worker.request_memory",
        "vllm.v1.worker.gpu_worker.Worker.determine_available_memory",
        "vllm.v1.worker.cpu_worker.CPUWorker.determine_available_memory",
        "vllm.v1.executor.abstract.Executor.__init__",
        "vllm.v1.engine.core.EngineCore._initialize_kv_caches",
        "vllm.v1.engine.core.EngineCore.shutdown",
        "vllm.v1.engine.utils.CoreEngineProcManager.shutdown",
        "vllm.v1.engine.core.EngineCoreProc._handle_client_request",
        "vllm.v1.engine.core.generate_scheduler_kv_cache_config",
        "vllm.v1.core.sched.scheduler.Scheduler.__init__",
        "vllm.v1.core.sched.scheduler.Scheduler.schedule",
        "vllm.v1.core.sched.scheduler.Scheduler.update_from_output",
        "vllm.v1.worker.gpu_worker.Worker.sample_tokens",
    }
    step = {t.name for t in _targets() if t.role == "step"}  # both modes: the rebind watch
    assert step == {"vllm.v1.worker.gpu_worker.Worker.execute_model"}
    load_plugin("host-vmm", mode="elastic")
    assert all(_wrapped(elastic=True).values()), _wrapped(elastic=True)
    assert plugin.check_patches() == []


def test_idempotent(load_plugin: LoadPlugin) -> None:
    load_plugin("torch")
    first = {t.name: _value(t) for t in _targets()}
    load_plugin("torch")  # vLLM loads general plugins in every process, maybe twice
    plugin.register()
    assert {t.name: _value(t) for t in _targets()} == first


def test_unregister_restores_the_originals(load_plugin: LoadPlugin) -> None:
    originals = {t.name: _value(t) for t in _targets()}
    load_plugin("host-vmm")
    plugin.unregister()
    assert {t.name: _value(t) for t in _targets()} == originals
    assert plugin.stats() == dict.fromkeys(plugin.stats(), 0)


def test_vllm_plugins_allowlist_without_kvplan(load_plugin: LoadPlugin) -> None:
    load_plugin("torch", allow="some_other_plugin")
    assert not plugin.is_active()
    assert not any(_wrapped().values())


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("KVPLAN_BACKEND", "meta", "KVPLAN_BACKEND='meta'"),
        ("KVPLAN_MODE", "lazy", "KVPLAN_MODE='lazy'"),
        ("KVPLAN_ENABLE", "maybe", "KVPLAN_ENABLE='maybe'"),
        ("KVPLAN_STRICT", "very", "KVPLAN_STRICT='very'"),
    ],
)
def test_bad_setting_refuses_to_start(
    env: str, value: str, needle: str, load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(KVPlanError) as info:
        if env == "KVPLAN_ENABLE":
            load_plugin("torch", enable=value)
        else:
            load_plugin(None)
    assert info.value.code is Code.INTEGRATION
    assert needle in str(info.value)
    assert not plugin.is_active()
    assert not any(_wrapped().values())


def test_elastic_torch_is_refused(load_plugin: LoadPlugin) -> None:
    with pytest.raises(KVPlanError, match="elastic"):
        load_plugin("torch", mode="elastic")
    assert not any(_wrapped().values())


def test_default_backend_needs_cuda(
    load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvplan.executor.backends import backend_class
    from kvplan.executor.backends.cuda_vmm import CudaVmmBackend

    why = backend_class("cuda-vmm").available()
    if why is None:  # this machine has cuda-python and a driver: pretend it has not
        why = "no CUDA driver library (libcuda.so.1) can be loaded"
        monkeypatch.setattr(CudaVmmBackend, "available", classmethod(lambda cls: why))
    with pytest.raises(KVPlanError) as info:
        load_plugin(None)  # KVPLAN_BACKEND unset: cuda-vmm
    assert "cuda-vmm" in str(info.value) and why in str(info.value)
    assert not any(_wrapped().values())


def test_unsupported_vllm_version(load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    _targets()  # the real table, read before the version is faked
    monkeypatch.setattr(vllm, "__version__", "0.35.1")  # past the newest release kvplan knows
    with pytest.raises(KVPlanError) as info:
        load_plugin("torch")
    assert info.value.code is Code.INTEGRATION
    assert "0.35.1" in str(info.value) and supported_range() in str(info.value)
    assert not any(_wrapped().values())


def test_changed_signature_refuses_and_patches_nothing(
    load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm
    import vllm.v1.worker.gpu.attn_utils as attn_utils

    def allocate_kv_cache(kv_cache_config: Any, device: Any) -> dict[str, Any]:
        return {}

    monkeypatch.setattr(attn_utils, "allocate_kv_cache", allocate_kv_cache)
    with pytest.raises(KVPlanError) as info:
        load_plugin("torch")
    message = str(info.value)
    assert "vllm.v1.worker.gpu.attn_utils.allocate_kv_cache" in message
    release = ".".join(vllm.__version__.split(".")[:2])  # the installed release's adapter
    assert release in message and "(kv_cache_config, device)" in message
    wrapped = _wrapped()
    assert not any(wrapped.values()), wrapped  # never half-patched


def test_missing_target_refuses(load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.v1.hisparse.binding as binding

    monkeypatch.delattr(binding, "allocate_kv_cache")
    with pytest.raises(KVPlanError, match=r"vllm\.v1\.hisparse\.binding\.allocate_kv_cache"):
        load_plugin("torch")
    assert not plugin.is_active()


def test_register_is_cheap_when_disabled() -> None:
    """With KVPLAN_ENABLE unset, importing and calling register() loads neither torch nor
    vLLM (vLLM calls it in every process, API server included)."""
    code = (
        "import sys, os\n"
        "os.environ.pop('KVPLAN_ENABLE', None)\n"
        "from kvplan.integrations.vllm.plugin import register\n"
        "register(); register()\n"
        "heavy = [m for m in ('torch', 'vllm') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
