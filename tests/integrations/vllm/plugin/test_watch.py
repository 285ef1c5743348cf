"""The plugin watches its call sites and refuses instead of binding silently or wrongly."""

from __future__ import annotations

import dataclasses
import gc
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvplan.integrations.vllm import plugin
from kvplan.integrations.vllm.versions import adapter_for
from kvplan.schemas.errors import Code, KVPlanError
from tests.integrations.vllm.plugin._models import ModelCase
from tests.integrations.vllm.plugin._runners import (
    ALLOCATING_MODULE,
    CPU,
    FULL_RUNNER_CALLS,
    FULL_RUNNERS,
    HAS_V1,
    RUNNER_PATHS,
    describe,
    full_runner,
    storages,
    via_allocate,
    via_v2,
)
from tests.integrations.vllm.plugin.conftest import LoadPlugin

pytestmark = pytest.mark.vllm


def _installed_adapter() -> Any:
    import vllm

    adapter = adapter_for(vllm.__version__)
    assert adapter is not None, vllm.__version__
    return adapter


_ADAPTER = _installed_adapter()
SITES = [t for t in _ADAPTER.targets if t.patched]


@pytest.fixture
def host_vmm_2mib() -> Iterator[str]:
    """host-vmm mapping in CUDA's 2 MiB granules, registered as ``host-vmm-2mib``: a CPU
    backend whose plans are checked against 2 MiB (``KVP308``), as cuda-vmm's are."""
    from kvplan.executor.backends import BACKENDS, register_backend
    from kvplan.executor.backends.host_vmm import HostVmmBackend

    class HostVmm2MiB(HostVmmBackend):
        info = dataclasses.replace(HostVmmBackend.info, granularity_default=2 << 20)

        def __init__(self, **options: Any) -> None:
            super().__init__(granularity=2 << 20, **options)

    register_backend("host-vmm-2mib", HostVmm2MiB)
    yield "host-vmm-2mib"
    del BACKENDS["host-vmm-2mib"]


def _restore_original(monkeypatch: pytest.MonkeyPatch, module: str, qualname: str) -> None:
    """Put vLLM's original back at one site (as a later monkeypatcher might)."""
    holder: Any = importlib.import_module(module)
    *owners, attr = qualname.split(".")
    for owner in owners:
        holder = getattr(holder, owner)
    current = vars(holder)[attr] if owners else getattr(holder, attr)
    monkeypatch.setattr(holder, attr, current.__wrapped__)


@pytest.mark.parametrize("target", SITES, ids=[t.name for t in SITES])
def test_check_patches_reports_an_unwrapped_site(
    target: Any, load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every patched site, in the mode that patches it (elastic-only sites: elastic mode)."""
    if target.elastic_only:
        load_plugin("host-vmm", mode="elastic")
    else:
        load_plugin("torch")
    assert plugin.check_patches() == []
    _restore_original(monkeypatch, target.module, target.qualname)
    (problem,) = plugin.check_patches()
    assert problem.code is Code.INTEGRATION and problem.location == target.name


@pytest.mark.parametrize("path", list(RUNNER_PATHS))
def test_runner_call_that_bypasses_kvplan_fails(
    path: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With one runner's allocate_kv_cache global un-wrapped, the runner call fails:
    the binding tests above would notice a call site kvplan stopped watching."""
    case = model_case("llama")
    load_plugin("torch")
    module = ALLOCATING_MODULE[path]
    _restore_original(monkeypatch, module, "allocate_kv_cache")
    with pytest.raises(KVPlanError) as info:
        RUNNER_PATHS[path](case)
    message = str(info.value)
    assert info.value.code is Code.INTEGRATION
    assert "without allocating through kvplan" in message
    assert f"{module}.allocate_kv_cache" in message
    assert plugin.stats()["bypassed"] == 1 and plugin.stats()["bound"] == 0


def test_direct_call_through_an_unwrapped_definition_binds_nothing(
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = model_case("llama")
    load_plugin("torch")
    _restore_original(monkeypatch, "vllm.v1.worker.utils", "allocate_kv_cache")
    via_allocate(case)
    assert plugin.stats()["bound"] == 0
    assert [d.location for d in plugin.check_patches()] == [
        "vllm.v1.worker.utils.allocate_kv_cache"
    ]


def test_sharers_without_a_sharing_map_are_refused(
    model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin
) -> None:
    """allocate_kv_cache called with no runner and no current vLLM config: gemma4's 20
    sharers sit in groups without tensors and nobody says whose cache they read."""
    import vllm.v1.worker.utils as utils

    case = model_case("gemma4-e2b")
    load_plugin("torch")
    with pytest.raises(KVPlanError, match="cannot tell whose cache they read") as info:
        utils.allocate_kv_cache(case.runner_config(), CPU, case.layout, case.kernel_block_sizes)
    assert info.value.code is Code.INTEGRATION
    assert plugin.bound_caches() == []


if HAS_V1:  # the V2 runners read vLLM's own map, from the layers (below)

    def test_runner_map_missing_a_sharer_is_refused(
        model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin
    ) -> None:
        """The V1 runner's map (``runner.shared_kv_cache_layers``) lacks one sharer."""
        from tests.integrations.vllm.plugin._runners import v1_runner, via_v1

        case = model_case("gemma4-e2b")
        load_plugin("torch")
        runner = v1_runner(case)
        forgotten = sorted(case.shared)[-1]
        del runner.shared_kv_cache_layers[forgotten]
        with pytest.raises(KVPlanError) as info:
            via_v1(case, runner)
        codes = [d.code for d in info.value.diagnostics]
        assert codes[0] is Code.INTEGRATION and Code.LAYER_UNBOUND in codes
        assert forgotten in str(info.value.diagnostics)
        assert plugin.stats()["refused"] == 1 and plugin.bound_caches() == []


_SHARING_MAPS = {
    "v2": "vllm.v1.worker.gpu.attn_utils",
    "cpu": "vllm.v1.worker.cpu.attn_utils",
}
"""Per V2 path: the module whose ``get_shared_kv_cache_layers`` both vLLM's alias step and
kvplan read."""


@pytest.mark.parametrize("path", [p for p in RUNNER_PATHS if p in _SHARING_MAPS])
def test_sharing_map_missing_a_sharer_is_refused(
    path: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's alias step reads a map (``get_shared_kv_cache_layers(vllm_config)``) that lacks
    a sharer the runner's config holds: vLLM leaves that layer without a cache, and kvplan's
    check of vLLM's dict against the plan refuses, naming it (``KVP403``)."""
    case = model_case("gemma4-e2b")
    load_plugin("torch")
    module = importlib.import_module(_SHARING_MAPS[path])
    forgotten = sorted(case.shared)[-1]
    real = module.get_shared_kv_cache_layers

    def without(vllm_config: Any) -> dict[str, str]:
        return {k: v for k, v in real(vllm_config).items() if k != forgotten}

    monkeypatch.setattr(module, "get_shared_kv_cache_layers", without)
    with pytest.raises(KVPlanError) as info:
        RUNNER_PATHS[path](case)
    codes = [d.code for d in info.value.diagnostics]
    assert codes[0] is Code.INTEGRATION and Code.VERIFY_MISMATCH in codes
    (mismatch,) = [d for d in info.value.diagnostics if d.code is Code.VERIFY_MISMATCH]
    assert mismatch.location == forgotten
    assert plugin.stats()["refused"] == 1
    assert plugin.bound_caches() == []  # refused: the cache kvplan bound is closed, not kept


def test_strict_turns_warnings_into_refusals(
    model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin, host_vmm_2mib: str
) -> None:
    gemma, llama = model_case("gemma4-e2b"), model_case("llama")
    load_plugin(host_vmm_2mib, strict=True)
    with pytest.raises(KVPlanError) as info:
        via_v2(gemma)  # its pool is not a multiple of the 2 MiB VMM granularity
    assert Code.POOL_NOT_GRANULAR in [d.code for d in info.value.diagnostics]
    assert all(d.is_error for d in info.value.diagnostics)
    via_v2(llama)  # 16 MiB: no warning
    assert plugin.stats()["bound"] == 1


def test_strict_torch_backend_has_no_granularity_to_warn_about(
    model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin
) -> None:
    load_plugin("torch", strict=True)
    via_v2(model_case("gemma4-e2b"))  # exact-size torch.zeros: KVP308 does not apply
    assert plugin.stats()["bound"] == 1


def test_warnings_do_not_refuse_without_strict(
    model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin, caplog: Any, host_vmm_2mib: str
) -> None:
    load_plugin(host_vmm_2mib)
    with caplog.at_level("WARNING", logger="vllm.kvplan"):
        via_v2(model_case("gemma4-e2b"))
    assert "KVP308" in caplog.text
    assert plugin.stats()["bound"] == 1


def test_hisparse_is_refused(
    model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm.v1.hisparse.binding as binding

    case = model_case("llama")
    load_plugin("torch")
    with pytest.raises(KVPlanError, match="HiSparse"):
        binding.allocate_kv_cache(case.runner_config(), CPU, case.layout, [16])
    monkeypatch.setattr(case.vllm_config.attention_config, "hisparse_config", object())
    with pytest.raises(KVPlanError, match="HiSparse") as info:
        via_v2(case)
    assert info.value.code is Code.INTEGRATION
    assert plugin.stats()["bound"] == 0


class _Pool:
    """A stand-in for vLLM's CuMem / connector memory-pool context."""

    def __init__(self) -> None:
        self.entered = 0

    def __enter__(self) -> _Pool:
        self.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _call_in_pool(path: str, case: ModelCase, pool: _Pool) -> Any:
    """The runner path's tensor call with ``kv_cache_allocation_context=pool``; its owner."""
    if path == "v1":
        from tests.integrations.vllm.plugin._runners import v1_runner

        runner = v1_runner(case)
        runner.initialize_kv_cache_tensors(
            case.runner_config(), case.kernel_block_sizes, kv_cache_allocation_context=pool
        )
        return runner
    module = importlib.import_module(
        "vllm.v1.worker.gpu.model_runner"
        if path == "v2"
        else "vllm.v1.worker.cpu.standalone_model_runner"
    )
    module.init_kv_cache(
        case.forward_context, case.runner_config(), CPU, list(case.kernel_block_sizes),
        case.vllm_config, kv_cache_allocation_context=pool,
    )  # fmt: skip
    return None


@pytest.mark.parametrize("path", list(RUNNER_PATHS))
@pytest.mark.parametrize("backend", ["torch", "host-vmm"])
def test_memory_pool_context(
    backend: str, path: str, model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin
) -> None:
    case = model_case("llama")
    load_plugin(backend)
    pool = _Pool()
    if backend == "torch":  # allocates inside the pool, like vanilla vLLM
        owner = _call_in_pool(path, case, pool)
        assert pool.entered == 1 and plugin.stats()["bound"] == 1
        del owner
    else:
        with pytest.raises(KVPlanError, match="memory pool"):
            _call_in_pool(path, case, pool)
        assert plugin.stats()["bound"] == 0


@pytest.mark.parametrize("kind", list(FULL_RUNNERS))
def test_runner_initialize_kv_cache_profiling_then_serving(
    kind: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runner's real ``initialize_kv_cache``: a profiling call (vLLM allocates; kvplan plans
    and checks), then the real config (kvplan binds). The cache lives with the runner."""
    case = model_case("gemma4-e2b")
    vanilla = full_runner(kind, case, monkeypatch)
    vanilla.initialize_kv_cache(case.engine_config)

    load_plugin("host-vmm")
    runner = full_runner(kind, case, monkeypatch)
    runner.initialize_kv_cache(case.profiling_config(), is_profiling=True)
    assert plugin.stats()["profiling"] == 1 and plugin.bound_caches() == []
    runner.kv_caches.clear()  # vLLM's _cleanup_profiling_kv_cache does this

    runner.initialize_kv_cache(case.engine_config)
    (cache,) = plugin.bound_caches()
    assert plugin.stats()["bound"] == 1
    assert [describe({"x": t})["x"][:4] for t in runner.kv_caches] == [
        describe({"x": t})["x"][:4] for t in vanilla.kv_caches
    ]
    assert storages(dict(enumerate(runner.kv_caches))) == {
        cache.pools[next(iter(cache.pools))].untyped_storage().data_ptr()
    }

    runner.kv_caches.clear()
    runner.initialize_kv_cache(case.engine_config)  # re-initialised: the old cache is freed
    assert cache.closed
    (second,) = plugin.bound_caches()

    del runner
    gc.collect()
    assert second.closed and plugin.bound_caches() == []


@pytest.mark.parametrize("kind", list(FULL_RUNNERS))
def test_runner_initialize_kv_cache_bypass_fails(
    kind: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = model_case("llama")
    load_plugin("torch")
    runner = full_runner(kind, case, monkeypatch)
    for module, qualname in FULL_RUNNER_CALLS[kind]:
        _restore_original(monkeypatch, module, qualname)
    with pytest.raises(KVPlanError, match="without allocating through kvplan") as info:
        runner.initialize_kv_cache(case.engine_config)
    assert f"{type(runner).__name__}.initialize_kv_cache" in str(info.value)


def test_unowned_caches_are_closed_by_unregister(
    model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin
) -> None:
    load_plugin("host-vmm")
    via_v2(model_case("llama"))  # no runner object: kept until release
    (cache,) = plugin.bound_caches()
    plugin.unregister()
    assert cache.closed


@pytest.mark.parametrize("failure", ["driver", "unexpected"])
def test_binding_failure_refuses_with_a_reason(
    failure: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kvplan.executor
    from kvplan.schemas.errors import error

    def apply(*args: Any, **kwargs: Any) -> Any:
        if failure == "driver":
            raise KVPlanError(error(Code.DRIVER_CALL_FAILED, "pools.kv", "cuMemMap failed"))
        raise RuntimeError("CUDA out of memory")

    load_plugin("torch")
    monkeypatch.setattr(kvplan.executor, "apply", apply)
    with pytest.raises(KVPlanError) as info:
        via_v2(model_case("llama"))
    codes = [d.code for d in info.value.diagnostics]
    assert codes[0] is Code.INTEGRATION
    expected = "cuMemMap failed" if failure == "driver" else "RuntimeError"
    assert expected in str(info.value)
    assert (Code.DRIVER_CALL_FAILED in codes) is (failure == "driver")
    assert plugin.stats()["refused"] == 1
