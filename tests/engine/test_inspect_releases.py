"""``kvplan inspect`` and ``kvplan golden`` under every release the engine suite runs: each
release's engine venv builds the models with that release's own engine-core planning (the
version adapter's ``EngineCorePlanning``), and ``--verify`` checks every plan against that
release's ``allocate_kv_cache`` (on the meta device).

The bundled ``google/gemma-4-E2B-it`` (with its vision and audio towers) is inspected where
vLLM can configure it in the CPU build; on 0.31 and 0.32 vanilla vLLM cannot (its module
imports transformers' gemma-4 processor, which imports torchvision; see
``test_differential.test_left_out_cases_fail_in_vanilla_vllm``), so kvplan refuses with
``KVP501`` there, and gemma-4's text model is inspected instead.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness import vllm_cache
from harness.engine.cases import RELEASE_CASES
from harness.engine.harness import ARCHITECTURES, engine_env
from tests.engine.conftest import EnginePython
from tests.integrations.vllm.capture._cases import CASES, shrunk_config

RELEASES = list(RELEASE_CASES)
GEMMA4 = "google/gemma-4-E2B-it"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def _kvplan(
    python: Path, *args: str, cwd: Path, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = engine_env()
    env.update(extra or {})
    return subprocess.run(
        [str(python), "-m", "kvplan", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip


def _inspected(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def _towers_configurable(release: str) -> bool:
    return all(word != "gemma4-e2b" for word, _ in RELEASE_CASES[release].differential_left_out)


@pytest.mark.parametrize("release", RELEASES)
def test_inspect_gemma4_on_each_release(
    release: str, engine_python_of: EnginePython, tmp_path: Path
) -> None:
    python = engine_python_of(release)
    text = shrunk_config(CASES["gemma4-text"], tmp_path / "gemma4-text")
    found = _inspected(
        _kvplan(python, "inspect", str(text), "--max-model-len", "4096", "--json", "--verify",
                cwd=tmp_path)
    )  # fmt: skip
    assert found["input"]["vllm_version"] == f"{release}.0"
    plan = found["plan"]
    assert len(plan["views"]) == 15 and len(plan["aliases"]) == 20  # 35 layers, KV sharing
    assert {a["target"] for a in plan["aliases"]} == {
        "model.layers.13.self_attn.attn",
        "model.layers.14.self_attn.attn",
    }
    bundled = _kvplan(
        python, "inspect", GEMMA4, "--max-model-len", "4096", "--json", "--verify", cwd=tmp_path
    )
    if _towers_configurable(release):
        with_towers = _inspected(bundled)["plan"]
        assert len(with_towers["views"]) == 15 and len(with_towers["aliases"]) == 20
        strip = len("language_model.")
        assert sorted(v["layer"][strip:] for v in with_towers["views"]) == sorted(
            v["layer"] for v in plan["views"]
        )
    else:
        assert bundled.returncode == 2, bundled.stdout[-2000:]
        assert f"KVP501 error at {GEMMA4}: vLLM could not plan this model" in bundled.stderr
        assert "Gemma4ForConditionalGeneration" in bundled.stderr
        assert "Traceback" not in bundled.stderr.split("KVP501", 1)[1]


@pytest.mark.parametrize("release", RELEASES)
def test_golden_add_then_check_on_each_release(
    release: str, engine_python_of: EnginePython, tmp_path: Path
) -> None:
    python = engine_python_of(release)
    golden = tmp_path / "golden"
    added = _kvplan(python, "golden", "add", str(golden), LLAMA, "--max-model-len", "4096",
                    cwd=tmp_path)  # fmt: skip
    assert added.returncode == 0, added.stderr[-3000:]
    stored = json.loads(next(golden.glob("*/input.json")).read_text())
    assert stored["vllm_version"] == f"{release}.0"
    checked = _kvplan(python, "golden", "check", str(golden), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    assert "1 identical, 0 drifted, 0 failed" in checked.stdout


@pytest.mark.parametrize("release", RELEASES)
def test_doctor_says_what_each_release_serves(
    release: str, engine_python_of: EnginePython, tmp_path: Path
) -> None:
    """``kvplan doctor`` asks the adapter the plugin asks: every release serves elastic mode
    on host-vmm (the engine tests then serve it there), with that release's own targets."""
    settings = {"KVPLAN_ENABLE": "1", "KVPLAN_BACKEND": "host-vmm", "KVPLAN_MODE": "elastic"}
    done = _kvplan(engine_python_of(release), "doctor", "--json", cwd=tmp_path, extra=settings)
    report = _inspected(done)
    assert report["usable"] is True, report["problems"]
    assert report["verdict"].endswith("(host-vmm, elastic)"), report["verdict"]
    adapters = {"0.29": "vllm-0.29", "0.30": "vllm-0.30-0.31", "0.31": "vllm-0.30-0.31"}
    assert report["adapter"] == adapters.get(release, "vllm-0.32-0.33")
    assert report["vllm"]["version"] == f"{release}.0"
    targets = {t["target"]: t for t in report["targets"]}
    missing = [name for name, t in targets.items() if not t["exists"]]
    assert missing == []
    for elastic in ("Scheduler.update_from_output", "Worker.sample_tokens", "request_memory"):
        assert any(name.endswith(elastic) for name in targets), elastic


def test_each_release_keeps_a_vllm_cache_of_its_own(engine_python_of: EnginePython) -> None:
    """vLLM's cache of what it learnt of a model class has one file per class whatever the
    release: shared, each release found the last one's stale and imported vLLM again in a
    subprocess. Each engine venv's processes get their own (``harness.VLLM_CACHE_PTH``),
    unless the caller set one, filled for the suite's models when the venv was built
    (``harness.vllm_cache``: one process, not one subprocess per class)."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CACHE_ROOT"}
    show = "import os; print(os.environ['VLLM_CACHE_ROOT'])"
    roots = {}
    for release in RELEASES:
        python = engine_python_of(release)
        done = subprocess.run(
            [str(python), "-c", show], env=env, capture_output=True, text=True, check=True
        )
        roots[release] = Path(done.stdout.strip())
        assert roots[release] == python.parent.parent / "vllm-cache", roots
        marker = json.loads((roots[release] / vllm_cache.MARKER).read_text())
        assert marker == {"vllm": f"{release}.0", "architectures": ARCHITECTURES}
        for model in ("llama-LlamaForCausalLM", "gemma4-Gemma4ForCausalLM"):
            assert (
                roots[release] / "modelinfos" / f"vllm-model_executor-models-{model}.json"
            ).is_file()
    assert len(set(roots.values())) == len(RELEASES), roots
    chosen = subprocess.run(
        [str(python), "-c", show], env={**env, "VLLM_CACHE_ROOT": "/chosen"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert chosen.stdout.strip() == "/chosen"
