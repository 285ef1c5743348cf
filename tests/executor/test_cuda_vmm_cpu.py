"""cuda-vmm without a usable GPU/driver/cuda-python: a clear KVP401, never a raw traceback."""

from __future__ import annotations

import builtins
from typing import Any

import pytest
import torch

from harness.executor import _plans as plans
from kvplan.executor import apply
from kvplan.executor.backends import cuda_vmm
from kvplan.schemas.errors import Code, KVPlanError

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")


def assert_clear_401(exc: KVPlanError, *needles: str) -> None:
    assert exc.code is Code.BACKEND_UNAVAILABLE
    text = str(exc)
    assert "cuda-vmm backend is unavailable" in text and "--backend torch" in text
    assert "Traceback" not in text and "\n" not in text
    for needle in needles:
        assert needle in text, text


def test_no_gpu_raises_401() -> None:
    with pytest.raises(KVPlanError) as e:
        apply(plans.llama_plan(), backend="cuda-vmm")
    assert_clear_401(e.value, "torch.cuda.is_available() is False")
    assert e.value.__cause__ is None or isinstance(e.value.__cause__, KVPlanError)


def test_missing_cuda_python_raises_401(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "cuda" or name.startswith("cuda."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(KVPlanError) as e:
        apply(plans.llama_plan(), backend="cuda-vmm")
    assert_clear_401(e.value, "cuda-python is not installed")


def test_driver_library_missing_raises_401(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch pretends to be fine; cuInit then cannot load libcuda: still one clean KVP401."""
    monkeypatch.setattr(cuda_vmm, "touch_torch_device", lambda device: 0)
    with pytest.raises(KVPlanError) as e:
        apply(plans.llama_plan(), backend="cuda-vmm", device="cuda:0")
    assert_clear_401(e.value, "cuInit")


def test_torch_init_failure_raises_401(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def boom() -> None:
        raise RuntimeError("Found no NVIDIA driver on your system.\nPlease check ...")

    monkeypatch.setattr(torch.cuda, "init", boom)
    with pytest.raises(KVPlanError) as e:
        apply(plans.llama_plan(), backend="cuda-vmm")
    assert_clear_401(e.value, "Found no NVIDIA driver")


def test_non_cuda_device_raises_401(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(KVPlanError) as e:
        apply(plans.llama_plan(), backend="cuda-vmm", device="cpu")
    assert_clear_401(e.value, "not a CUDA device")
