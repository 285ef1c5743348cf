"""Fixtures: real vLLM model cases (built once per session) and the plugin loaded through
vLLM's own ``load_general_plugins()``, isolated per test (env via monkeypatch, then
``unregister()``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integrations.vllm.plugin._models import MODELS, ModelCase, build_case, init_distributed

if importlib.util.find_spec("vllm") is None:  # only the doctor's no-vLLM check can run
    collect_ignore_glob = ["test_[!n]*.py"]

_CASES: dict[str, ModelCase] = {}


@pytest.fixture(scope="session")
def dist_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("dist")
    init_distributed(store)
    return store


@pytest.fixture(scope="session")
def model_case(dist_store: Path) -> Callable[[str], ModelCase]:
    """``model_case(name)``: the model built once per session."""

    def get(name: str) -> ModelCase:
        if name not in _CASES:
            _CASES[name] = build_case(MODELS[name])
        return _CASES[name]

    return get


@pytest.fixture(autouse=True)
def _plugin_isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts and ends with the plugin unregistered and no KVPLAN_* set."""
    from kvplan.integrations.vllm import plugin

    plugin.unregister()
    for name in ("KVPLAN_ENABLE", "KVPLAN_BACKEND", "KVPLAN_MODE", "KVPLAN_DUMP_DIR",
                 "KVPLAN_STRICT", "KVPLAN_PLAN_DIR", "VLLM_PLUGINS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    yield
    plugin.unregister()


LoadPlugin = Callable[..., None]


@pytest.fixture
def load_plugin(monkeypatch: pytest.MonkeyPatch) -> LoadPlugin:
    """Set ``KVPLAN_*`` (``backend=``, ``mode=``, ``dump_dir=``, ``strict=``, ``plan_dir=``) and run
    vLLM's ``load_general_plugins()`` with ``VLLM_PLUGINS=kvplan``."""
    import vllm.plugins

    def load(
        backend: str | None = "torch",
        *,
        enable: str = "1",
        mode: str | None = None,
        dump_dir: Path | None = None,
        strict: bool = False,
        plan_dir: Path | None = None,
        allow: str | None = "kvplan",
    ) -> None:
        monkeypatch.setenv("KVPLAN_ENABLE", enable)
        settings = {
            "KVPLAN_BACKEND": backend,
            "KVPLAN_MODE": mode,
            "KVPLAN_DUMP_DIR": None if dump_dir is None else str(dump_dir),
            "KVPLAN_STRICT": "1" if strict else None,
            "KVPLAN_PLAN_DIR": None if plan_dir is None else str(plan_dir),
            "VLLM_PLUGINS": allow,
        }
        for name, value in settings.items():
            if value is not None:
                monkeypatch.setenv(name, value)
        monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)  # once per process
        vllm.plugins.load_general_plugins()

    return load
