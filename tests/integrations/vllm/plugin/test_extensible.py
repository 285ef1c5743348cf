"""vLLM 0.34's extensible KV cache beside kvplan: one decision per setting and mode.

vLLM turns its extensible KV cache on by default on CUDA (it reserves address space and maps
physical pages itself, a second manager of the memory kvplan binds). With kvplan's plugin on:
left at its default, it is turned off and a start-up line says so; asked for
(``--enable-extensible-kv-cache``), the engine is refused with ``KVP508``, in eager and in
elastic mode; turned off by the user, nothing changes and nothing is said. The configs are
vLLM's own (``EngineArgs.create_engine_config`` under kvplan's CUDA emulation, where the
plugin is loaded by vLLM itself), and an allocation that still brings vLLM's allocator is
refused, never bound behind vLLM's back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvplan.schemas.errors import KVPlanError
from tests.integrations.vllm.plugin._models import ModelCase
from tests.integrations.vllm.plugin._runners import via_v2

pytestmark = pytest.mark.vllm

MODES = {"eager": "torch", "elastic": "host-vmm"}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def kvplan_log() -> Iterator[list[str]]:
    """What kvplan's logger says during the test, read from ``vllm.kvplan`` itself. vLLM 0.34's
    ``create_engine_config`` configures vLLM's loggers the first time a process builds a config
    (``propagate=False`` on ``vllm``; ``dictConfig`` resets its children's handlers), so one
    config is built first and the handler attached after."""
    _config(False)  # vLLM's logging configured now, not in the middle of the test
    logger = logging.getLogger("vllm.kvplan")
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


LINE = "extensible KV cache is off: kvplan binds"


def _config(requested: bool | None) -> Any:
    """vLLM's engine config of a catalog model, decided as on a GPU."""
    from kvplan.catalog import lookup
    from kvplan.integrations.vllm.inspect._build import BuildOptions, make_vllm_config
    from kvplan.integrations.vllm.inspect._emulation import cuda_platform

    entry = lookup("meta-llama/Llama-3.1-8B-Instruct")
    assert entry is not None
    options = BuildOptions(
        model=str(entry.path), max_model_len=2048, enable_extensible_kv_cache=requested
    )
    with cuda_platform():
        return make_vllm_config(options)


def test_vanilla_vllm_turns_it_on_by_default() -> None:
    """The control: without kvplan, vLLM 0.34 on a GPU resolves the default to on."""
    assert _config(None).cache_config.enable_extensible_kv_cache is True
    assert _config(False).cache_config.enable_extensible_kv_cache is False


@pytest.mark.parametrize("mode", list(MODES))
def test_default_is_turned_off_with_a_line(
    mode: str, load_plugin: Callable[..., None], kvplan_log: list[str]
) -> None:
    load_plugin(MODES[mode], mode=mode)
    config = _config(None)
    assert config.cache_config.enable_extensible_kv_cache is False
    lines = [line for line in kvplan_log if LINE in line]
    assert len(lines) == 1, kvplan_log
    assert f"KVPLAN_MODE={mode}" in lines[0]
    assert "--no-enable-extensible-kv-cache" in lines[0]


@pytest.mark.parametrize("mode", list(MODES))
def test_explicitly_on_is_refused(mode: str, load_plugin: Callable[..., None]) -> None:
    load_plugin(MODES[mode], mode=mode)
    with pytest.raises(Exception) as raised:
        _config(True)
    text = str(raised.value)
    assert "KVP508" in text, text
    assert "--enable-extensible-kv-cache" in text and f"KVPLAN_MODE={mode}" in text
    assert "drop --enable-extensible-kv-cache" in text
    if mode == "elastic":
        assert "two managers of one physical memory" in text


@pytest.mark.parametrize("mode", list(MODES))
def test_explicitly_off_says_nothing(
    mode: str, load_plugin: Callable[..., None], kvplan_log: list[str]
) -> None:
    load_plugin(MODES[mode], mode=mode)
    config = _config(False)
    assert config.cache_config.enable_extensible_kv_cache is False
    assert not any(LINE in line for line in kvplan_log), kvplan_log  # same capture as above


@pytest.mark.parametrize("mode", list(MODES))
def test_the_binding_of_a_config_with_it_off_is_kvplans_and_verified(
    mode: str, model_case: Callable[[str], ModelCase], load_plugin: Callable[..., None]
) -> None:
    """With it off (the default under kvplan), the V2 runner's ``init_kv_cache`` binds
    kvplan's plan and vLLM's dict is checked against it (vanilla's views, kvplan's memory)."""
    from kvplan.integrations.vllm import plugin

    case = model_case("llama")
    vanilla, _ = via_v2(case)
    load_plugin(MODES[mode], mode=mode)
    ours, _ = via_v2(case)
    assert _shapes(ours) == _shapes(vanilla)
    (cache,) = plugin.bound_caches()
    assert cache.mode == mode
    counts = plugin.stats()
    assert counts["bound"] == 1 and counts["refused"] == 0 and counts["bypassed"] == 0


@pytest.mark.parametrize("mode", list(MODES))
def test_an_allocation_that_brings_vllms_allocator_is_refused(
    mode: str, model_case: Callable[[str], ModelCase], load_plugin: Callable[..., None]
) -> None:
    """Should anything turn the extensible cache on after kvplan's start-up check, its
    allocator reaches ``init_kv_cache``: refused with ``KVP508``, nothing bound."""
    from kvplan.integrations.vllm import plugin

    case = model_case("llama")
    load_plugin(MODES[mode], mode=mode)

    def allocate(size: int) -> Any:
        raise AssertionError("vLLM's allocator must not be called")

    with pytest.raises(KVPlanError) as raised:
        via_v2(case, allocate=allocate)
    assert raised.value.diagnostics[0].code.value in ("KVP501", "KVP508")
    assert any(d.code.value == "KVP508" for d in raised.value.diagnostics)
    assert not plugin.bound_caches()
    assert plugin.stats()["refused"] == 1


def _shapes(kv: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    return {name: (tuple(t.shape), tuple(t.stride())) for name, t in sorted(kv.items())}


def test_inspect_beside_an_enabled_plugin_shows_the_plugins_binding(tmp_path: Any) -> None:
    """``kvplan inspect`` with ``KVPLAN_ENABLE=1`` in the environment: vLLM loads kvplan's
    plugin while inspect builds the config under its CUDA emulation, and the plugin wraps
    vLLM's own resolution (not the emulation's wrapper, which is kvplan's): the binding shown
    is the one the plugin makes, with the extensible cache off."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "KVPLAN_ENABLE": "1", "KVPLAN_BACKEND": "torch"}
    env.pop("VLLM_PLUGINS", None)
    done = subprocess.run(
        [sys.executable, "-m", "kvplan", "inspect", "meta-llama/Llama-3.1-8B-Instruct",
         "--max-model-len", "2048", "--json"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "KVP506" not in done.stderr
    assert "vLLM's extensible KV cache: off" in done.stderr
    assert json.loads(done.stdout)["plan"]["source"]["num_blocks"] > 0
