"""Real-vLLM tests: every test here is marked ``vllm`` and shares one vLLM session.

Needs ``VLLM_TARGET_DEVICE=cpu`` and ``HF_HUB_OFFLINE=1`` (set here when unset, before vLLM
is imported). Models are built once per session and cached by case name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:  # a missing vLLM fails the run: these tests are never skipped
    import vllm  # noqa: F401
except ImportError as exc:  # pragma: no cover - CI installs the vllm extra
    raise pytest.UsageError(
        "tests/integrations/vllm/capture needs the real vLLM: pip install -e '.[all]'"
    ) from exc

from tests.integrations.vllm.capture._cases import CASES, Built, build_case

_BUILT: dict[str, Built] = {}
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture
def vllm_session() -> Iterator[None]:
    """The CPU platform answering as CUDA would, for the test. Never for longer: the
    emulation wraps functions the plugin wraps too (vLLM 0.34's
    ``VllmConfig._resolve_extensible_kv_cache``), and a plugin test on the same xdist worker
    would find them wrapped by another hand."""
    from kvplan.integrations.vllm.inspect._emulation import cuda_platform

    with cuda_platform():
        yield


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Built]:
    """``built(name)``: the case planned by vLLM (under the CUDA emulation), once per
    session."""
    from kvplan.integrations.vllm.inspect._emulation import cuda_platform

    def get(name: str) -> Built:
        if name not in _BUILT:
            with cuda_platform():
                _BUILT[name] = build_case(CASES[name], tmp_path_factory.mktemp(name))
        return _BUILT[name]

    return get
