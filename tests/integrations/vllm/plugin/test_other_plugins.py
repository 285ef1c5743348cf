"""kvplan among other plugins: a function another plugin wrapped first is refused (``KVP506``),
never silently replaced; KV caches rebound after kvplan's check are noticed (``KVP507``).

The runners are vLLM's real ``initialize_kv_cache`` of each runner the installed release has
whole (``_runners.FULL_RUNNERS``: V1 up to 0.33, the standalone CPU runner from 0.34); the other
"plugin" here is the test's own wrapper around vLLM's function, as another package's plugin
would install it. ``tests/engine/test_other_plugins.py`` does the same with a real second
plugin package loaded by vLLM in a real engine.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import pytest

from kvplan.integrations.vllm import plugin
from kvplan.integrations.vllm.pipeline import _watch
from kvplan.integrations.vllm.versions import adapter_for, resolve
from kvplan.integrations.vllm.versions._provenance import foreign_layer
from kvplan.schemas.errors import Code, KVPlanError
from tests.integrations.vllm.plugin._models import ModelCase
from tests.integrations.vllm.plugin._runners import FULL_RUNNERS, full_runner
from tests.integrations.vllm.plugin.conftest import LoadPlugin


def _other_plugins_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)  # copies vLLM's name, module and signature: only the code is ours
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wrapper.calls += 1  # type: ignore[attr-defined]
        return fn(*args, **kwargs)

    wrapper.calls = 0  # type: ignore[attr-defined]
    return wrapper


def test_vllms_own_functions_are_recognised() -> None:
    import vllm.v1.worker.gpu_worker as worker
    import vllm.v1.worker.utils as utils

    assert foreign_layer(utils.allocate_kv_cache, "allocate_kv_cache") is None
    # decorated by vLLM with torch.inference_mode(): torch's layer is the release's too
    step = vars(worker.Worker)["execute_model"]
    assert foreign_layer(step, "execute_model") is None
    import vllm

    for target in adapter_for(vllm.__version__).targets:  # type: ignore[union-attr]
        found = resolve(target)
        assert found.ok and found.foreign is None, found.problem


def test_a_wrapper_from_another_package_is_foreign() -> None:
    import vllm.v1.worker.utils as utils

    wrapped = _other_plugins_wrapper(utils.allocate_kv_cache)
    found = foreign_layer(wrapped, "allocate_kv_cache")
    assert found is not None
    assert found.module == __name__ and found.name.endswith("wrapper")
    plain = foreign_layer(lambda *a: None, "allocate_kv_cache")
    assert plain is not None and plain.module == __name__


def test_kvplan_refuses_to_drop_another_plugins_wrapper(
    load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    import vllm
    import vllm.v1.worker.utils as utils

    from kvplan.integrations.vllm.versions import adapter_for

    adapter = adapter_for(vllm.__version__)
    assert adapter is not None
    for target in adapter.targets:  # the modules that import allocate_kv_cache by name keep
        try:  # vLLM's own, whichever test imported them first
            importlib.import_module(target.module)
        except Exception:  # a target the release lacks is the preflight's to report
            continue
    original = utils.allocate_kv_cache
    monkeypatch.setattr(utils, "allocate_kv_cache", _other_plugins_wrapper(original))
    with pytest.raises(KVPlanError) as refused:
        load_plugin("torch")
    codes = [d.code for d in refused.value.diagnostics]
    assert codes[0] is Code.INTEGRATION and Code.FOREIGN_WRAPPER in codes
    text = "\n".join(d.render() for d in refused.value.diagnostics)
    assert f"from {__name__}" in text and "vllm.v1.worker.utils.allocate_kv_cache" in text
    assert not plugin.is_active()
    assert getattr(utils.allocate_kv_cache, "__wrapped__", None) is original  # left alone


def _runtime() -> Any:
    state = plugin._STATE
    assert state is not None
    return state.runtime


def _bound_runner(
    kind: str, case: ModelCase, load_plugin: LoadPlugin, mp: Any, strict: bool
) -> Any:
    load_plugin("host-vmm", strict=strict)
    runner = full_runner(kind, case, mp)
    runner.initialize_kv_cache(case.engine_config)
    assert plugin.stats()["bound"] == 1
    return runner


def _rebind(runner: Any) -> tuple[str, str]:
    """What the other plugin does after kvplan's check: one KV-owning layer of the forward
    context is re-pointed at another layer's cache."""
    forward = runner.compilation_config.static_forward_context
    (cache,) = plugin.bound_caches()
    owners = [v.layer for v in cache.plan.views]
    victim, source = owners[-1], owners[0]
    forward[victim].kv_cache = forward[source].kv_cache
    return victim, source


@pytest.mark.parametrize("kind", list(FULL_RUNNERS))
@pytest.mark.parametrize("strict", [True, False])
def test_a_layer_rebound_after_the_check_is_noticed_at_the_first_step(
    kind: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    strict: bool,
) -> None:
    runner = _bound_runner(kind, model_case("llama"), load_plugin, monkeypatch, strict)
    runtime = _runtime()
    runtime.check_step(runner)  # untouched: nothing to say
    watch = runtime._watches[id(runner)]
    watch.next_check = 0.0
    victim, _ = _rebind(runner)
    if strict:
        from vllm.v1.worker.gpu_worker import Worker

        worker = object.__new__(Worker)
        worker.model_runner = runner
        with pytest.raises(KVPlanError) as refused:  # through vLLM's wrapped step entry
            Worker.execute_model(worker, None)
        codes = [d.code for d in refused.value.diagnostics]
        assert codes[0] is Code.INTEGRATION and Code.CACHE_REBOUND in codes
        assert victim in refused.value.diagnostics[0].message
        return
    with caplog.at_level(logging.WARNING, logger="vllm.kvplan"):
        runtime.check_step(runner)
        watch.next_check = 0.0
        runtime.check_step(runner)  # warned once
    warnings = [r for r in caplog.records if "KVP507" in r.getMessage()]
    assert len(warnings) == 1 and victim in warnings[0].getMessage()


@pytest.mark.parametrize("kind", list(FULL_RUNNERS))
def test_between_checks_a_step_pays_one_clock_read(
    kind: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner = _bound_runner(kind, model_case("llama"), load_plugin, monkeypatch, True)
    runtime = _runtime()
    runtime.check_step(runner)  # the first step: compared
    _rebind(runner)
    runtime.check_step(runner)  # within the period: not compared yet
    monkeypatch.setattr(_watch.time, "monotonic", lambda: 1e12)
    with pytest.raises(KVPlanError):
        runtime.check_step(runner)


_BINDS = {
    "v1": ("vllm.v1.worker.gpu_model_runner", "bind_kv_cache"),
    "cpu": ("vllm.v1.worker.cpu.attn_utils", "bind_kv_cache_to_layers"),
}
"""Per full runner: the module global its ``initialize_kv_cache`` binds the layers with."""


@pytest.mark.parametrize("kind", list(FULL_RUNNERS))
def test_a_layer_bound_elsewhere_by_vllms_runner_is_refused_at_once(
    kind: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Something inside the runner's own initialize_kv_cache binds a layer to another
    layer's memory: kvplan's dict check passes (vLLM's dict is right), the layers are not."""
    import importlib

    case = model_case("llama")
    module, name = _BINDS[kind]
    holder = importlib.import_module(module)
    real = getattr(holder, name)

    def crossed(kv_caches: dict[str, Any], forward_context: Any, *args: Any, **kw: Any) -> Any:
        real(kv_caches, forward_context, *args, **kw)
        names = list(kv_caches)
        forward_context[names[-1]].kv_cache = kv_caches[names[0]]

    monkeypatch.setattr(holder, name, crossed)
    load_plugin("host-vmm", strict=True)
    runner = full_runner(kind, case, monkeypatch)
    with pytest.raises(KVPlanError) as refused:
        runner.initialize_kv_cache(case.engine_config)
    assert Code.CACHE_REBOUND in [d.code for d in refused.value.diagnostics]
