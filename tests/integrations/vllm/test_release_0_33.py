"""The in-process vLLM tests also pass on vLLM 0.33, the last release with the V1 runner.

The suite's venv holds the ``vllm`` extra's release (0.34: the V2 runners only); the tests
below run in a venv of vLLM 0.33.0 the session builds (``harness.vllm_venv``:
``.venv-vllm-0.33/``, or the venv ``KVPLAN_VLLM_VENV_0_33`` names), in one pytest of its own
(no xdist there): the differential suite and the capture tests (0.33's engine-core planning
and ``allocate_kv_cache``), and the plugin tests whose runner paths are computed from the
installed release (``tests/integrations/vllm/plugin/_runners.py``), so that there they drive
the V1 runner beside the V2 one. Every test must pass; none may be skipped.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.engine.harness import engine_env
from harness.vllm_venv import VllmVenvError, ensure_vllm_venv
from tests._junit import ROOT, outcomes, without_xdist

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SUITES = (
    "tests/integrations/vllm/capture/test_differential.py",
    "tests/integrations/vllm/capture/test_capture.py",
    "tests/integrations/vllm/plugin/test_binding.py",
    "tests/integrations/vllm/plugin/test_watch.py",
    "tests/integrations/vllm/plugin/test_other_plugins.py",
    "tests/integrations/vllm/plugin/test_dumps.py",
)
"""What runs on 0.33: every file here that drives a runner the installed release has."""
V1_TESTS = (
    "test_runner_map_missing_a_sharer_is_refused",
    "test_same_kv_caches_as_vanilla[llama-v1-torch]",
    "test_runner_call_that_bypasses_kvplan_fails[v1]",
    "test_runner_initialize_kv_cache_profiling_then_serving[v1]",
    "test_a_layer_bound_elsewhere_by_vllms_runner_is_refused_at_once[v1]",
    "test_profiling_is_dumped_separately[v1]",
)
"""Tests that exist only where the V1 runner does: seen passing, they show the run was 0.33's."""


@pytest.fixture(scope="session")
def vllm_0_33_python(pytestconfig: pytest.Config) -> Path:
    """vLLM 0.33.0's venv python (built, completed or reused). A venv that cannot be built
    fails the test with uv's output tail."""
    terminal = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")

    def report(message: str) -> None:
        if terminal is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                terminal.write_line(message)

    try:
        return ensure_vllm_venv("0.33", report)
    except VllmVenvError as exc:
        pytest.fail(f"the vLLM 0.33 venv could not be built: {exc}", pytrace=False)


def _run(python: Path, report: Path) -> subprocess.CompletedProcess[str]:
    env = engine_env()  # no KVPLAN_*/VLLM_* of this process; the CPU platform, offline
    return subprocess.run(
        [
            str(python), "-m", "pytest", *SUITES, "-q", "-p", "no:cacheprovider",
            f"--junitxml={report}", "-o", without_xdist(),
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1100, check=False,
    )  # fmt: skip


def test_in_process_suite_passes_on_vllm_0_33(
    vllm_0_33_python: Path, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    version = subprocess.run(
        [str(vllm_0_33_python), "-c", "import vllm; print(vllm.__version__)"],
        env=engine_env(), capture_output=True, text=True, timeout=300, check=True,
    ).stdout.split()[-1]  # fmt: skip
    assert version == "0.33.0"
    report = tmp_path / "junit.xml"
    started = time.perf_counter()
    done = _run(vllm_0_33_python, report)
    record_property("seconds", round(time.perf_counter() - started))
    lines = (done.stdout + done.stderr).splitlines()
    tail = "\n".join([*[line for line in lines if line.startswith("E ")][:30], "...", *lines[-15:]])
    assert done.returncode == 0, tail
    ran = outcomes(report, with_module=True)
    failed = {name: text[-1500:] for name, (status, text) in ran.items() if status != "passed"}
    assert not failed, failed  # failed, errored or skipped
    files = {name.split("::")[0] for name in ran}
    assert files == {path.removesuffix(".py").replace("/", ".") for path in SUITES}, files
    names = {name.split("::")[1] for name in ran}
    assert set(V1_TESTS) <= names, sorted(set(V1_TESTS) - names)
    assert len(ran) >= 140, len(ran)  # 142 when written
