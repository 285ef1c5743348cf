"""``kvplan doctor`` with the real vLLM, and as a new user without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.integrations.vllm.versions import adapter_for
from tests.integrations.vllm.plugin._runners import (
    ALLOCATING_MODULE,
    HAS_CPU_RUNNER,
    HAS_V1,
    RUNNER_PATHS,
    import_runners,
)

pytestmark = pytest.mark.vllm

cli = CliRunner()


@pytest.fixture
def doctor_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The doctor quiets vLLM through env vars: set them here so they are undone after."""
    for name, value in (("VLLM_LOGGING_LEVEL", "ERROR"), ("TRANSFORMERS_VERBOSITY", "error"),
                        ("TORCH_LOGS", "-all")):  # fmt: skip
        monkeypatch.setenv(name, value)
    return monkeypatch


def _doctor(*args: str) -> tuple[int, Any]:
    result = cli.invoke(app, ["doctor", *args])
    return result.exit_code, result.stdout


def test_ready_when_enabled_with_an_available_backend(doctor_env: pytest.MonkeyPatch) -> None:
    import vllm

    doctor_env.setenv("KVPLAN_ENABLE", "1")
    doctor_env.setenv("KVPLAN_BACKEND", "torch")
    code, out = _doctor("--json")
    report = json.loads(out)
    assert code == 0, out
    assert report["usable"] and report["verdict"].startswith("ready:")
    assert report["vllm"] == {**report["vllm"], "installed": True, "version": vllm.__version__}
    assert report["plugin"]["visible"] and report["plugin"]["allowed"]
    assert report["plugin"]["enabled"]
    assert report["backend"] == {**report["backend"], "name": "torch", "available": True}
    declared = adapter_for(vllm.__version__).targets  # type: ignore[union-attr]
    assert len(report["targets"]) == len(declared) and all(t["ok"] for t in report["targets"])
    sites = {t["target"] for t in report["targets"] if t["patched"]}
    expected = {
        "vllm.v1.worker.utils.allocate_kv_cache",
        "vllm.v1.worker.gpu.attn_utils.allocate_kv_cache",
        "vllm.v1.hisparse.binding.allocate_kv_cache",
        "vllm.v1.worker.gpu.model_runner.init_kv_cache",
    }
    if HAS_V1:  # up to 0.33
        expected.add("vllm.v1.worker.gpu_model_runner.allocate_kv_cache")
    if HAS_CPU_RUNNER:  # 0.34 on: the CPU build's sites
        expected |= {
            "vllm.v1.worker.cpu.attn_utils.allocate_kv_cache",
            "vllm.v1.worker.cpu.attn_utils.init_kv_cache",
            "vllm.v1.worker.cpu.standalone_model_runner.init_kv_cache",
        }
    assert expected <= sites


def test_text_report_disabled_by_default(doctor_env: pytest.MonkeyPatch) -> None:
    import vllm

    from kvplan.executor.backends import backend_class

    adapter = adapter_for(vllm.__version__)
    assert adapter is not None
    code, out = _doctor()
    assert "enabled         no (set KVPLAN_ENABLE=1)" in out
    assert "cuda-vmm" in out and f"patch targets ({adapter.name} adapter)" in out
    if backend_class("cuda-vmm").available() is None:
        assert code == 0 and "ready, but disabled" in out
    else:  # enabling would fail: say so now
        assert code == 2 and "KVPLAN_BACKEND" in out and "not usable" in out


def test_allowlist_without_kvplan_is_a_problem(doctor_env: pytest.MonkeyPatch) -> None:
    doctor_env.setenv("KVPLAN_ENABLE", "1")
    doctor_env.setenv("KVPLAN_BACKEND", "torch")
    doctor_env.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    code, out = _doctor("--json")
    report = json.loads(out)
    assert code == 2 and not report["plugin"]["allowed"]
    assert [p["location"] for p in report["problems"]] == ["VLLM_PLUGINS"]


@pytest.mark.parametrize("path", list(RUNNER_PATHS))
def test_changed_target_is_reported(path: str, doctor_env: pytest.MonkeyPatch) -> None:
    """Each runner's allocate_kv_cache global, changed: doctor names it and its signature."""
    import importlib

    module = ALLOCATING_MODULE[path]
    import_runners()  # before the stand-in is in place

    def allocate_kv_cache(kv_cache_config: Any) -> None:
        return None

    doctor_env.setenv("KVPLAN_BACKEND", "torch")
    doctor_env.setattr(importlib.import_module(module), "allocate_kv_cache", allocate_kv_cache)
    code, out = _doctor()
    assert code == 2
    assert f"BAD patch {module}.allocate_kv_cache" in out
    assert "has signature (kv_cache_config)" in out


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KVPLAN_", "VLLM_"))}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env}
    )


def test_new_user_with_vllm() -> None:
    """A fresh process with no KVPLAN_* or VLLM_* variables (the CPU platform is chosen
    by the doctor itself when there is no GPU)."""
    done = _run(
        "import sys; sys.argv = ['kvplan', 'doctor', '--json']\n"
        "from kvplan.cli import main; main()\n",
        KVPLAN_BACKEND="torch",
        KVPLAN_ENABLE="1",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["usable"] and all(t["ok"] for t in report["targets"])


def test_text_report_names_the_supported_range_and_installed_version(
    doctor_env: pytest.MonkeyPatch,
) -> None:
    import vllm

    from kvplan.integrations.vllm.versions import supported_range

    doctor_env.setenv("KVPLAN_ENABLE", "1")
    doctor_env.setenv("KVPLAN_BACKEND", "host-vmm")
    code, out = _doctor()
    assert code == 0, out
    assert f"supports        vLLM {supported_range()}" in out
    assert f"vLLM            {vllm.__version__} installed" in out
    assert "host-vmm: available, the CPU twin of CUDA VMM" in out and "verdict: ready:" in out


def test_host_vmm_is_not_claimed_without_memfd(doctor_env: pytest.MonkeyPatch) -> None:
    def no_memfd(name: str, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    doctor_env.setenv("KVPLAN_ENABLE", "1")
    doctor_env.setenv("KVPLAN_BACKEND", "host-vmm")
    doctor_env.setattr(os, "memfd_create", no_memfd)
    code, out = _doctor("--json")
    report = json.loads(out)
    assert code == 2 and not report["usable"]
    assert report["backend"]["available"] is False
    assert "memfd_create" in report["backend"]["detail"]


def test_release_whose_functions_differ_is_reported_with_the_difference(
    doctor_env: pytest.MonkeyPatch,
) -> None:
    """The installed release's code reported as 0.31: the 0.30–0.31 adapter expects
    init_kv_cache without attn_groups, so doctor names that function and its signature
    instead of guessing."""
    import vllm

    doctor_env.setenv("KVPLAN_BACKEND", "torch")
    doctor_env.setattr(vllm, "__version__", "0.31.0")
    code, out = _doctor("--json")
    report = json.loads(out)
    assert code == 2 and report["vllm"]["supported_range"] == "0.29–0.34"
    assert report["adapter"] == "vllm-0.30-0.31"
    problems = {p["location"]: p["message"] for p in report["problems"]}
    assert "attn_groups" in problems["vllm.v1.worker.gpu.attn_utils.init_kv_cache"]
