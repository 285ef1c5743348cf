"""``harness.vllm_cache``: vLLM's model-class cache filled in one process holds what vLLM's
own per-class subprocess writes, byte for byte, and a second warm-up into the same cache
returns before importing vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import vllm_cache

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LLAMA = "LlamaForCausalLM"
FILE = "vllm-model_executor-models-llama-LlamaForCausalLM.json"

_VLLMS_OWN = """
from vllm.model_executor.models.registry import ModelRegistry
assert ModelRegistry._try_inspect_model_cls("LlamaForCausalLM") is not None
"""


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "VLLM_CACHE_ROOT": str(root)}


def test_the_warmed_cache_is_what_vllm_writes_itself_and_warms_once(tmp_path: Path) -> None:
    warmed = vllm_cache.warm(
        sys.executable, [LLAMA, "NoSuchArchitecture"], env=_env(tmp_path / "warmed")
    )
    assert (warmed.root, warmed.already) == (tmp_path / "warmed", False)
    assert (warmed.cached, warmed.failed) == ([LLAMA], [])  # an unknown class is passed over
    assert "1 classes" in warmed.describe()
    # vLLM's own way: a cache miss inspects the class in a subprocess and writes the file
    own = tmp_path / "own"
    subprocess.run(
        [sys.executable, "-c", _VLLMS_OWN], env=_env(own), check=True, capture_output=True
    )
    written = (tmp_path / "warmed" / "modelinfos" / FILE).read_bytes()
    assert written == (own / "modelinfos" / FILE).read_bytes()
    assert json.loads(written)["modelinfo"]  # (vLLM's format: the class's _ModelInfo)

    again = vllm_cache.warm(
        sys.executable, [LLAMA, "NoSuchArchitecture"], env=_env(tmp_path / "warmed")
    )
    assert again.already and again.cached == [] and "already warm" in again.describe()
    marker = json.loads((tmp_path / "warmed" / vllm_cache.MARKER).read_text())
    assert marker["architectures"] == [LLAMA, "NoSuchArchitecture"]


def test_a_failed_warm_up_says_why() -> None:
    with pytest.raises(RuntimeError, match=r"failed \(exit 1\):\nboom"):
        vllm_cache.parse(1, "", "boom\n")
    with pytest.raises(RuntimeError, match="exit 0"):
        vllm_cache.parse(0, "no json here\n", "")


def test_the_suite_warms_every_bundled_model_and_the_engines_models() -> None:
    found = vllm_cache.suite_architectures()
    for name in ("LlamaForCausalLM", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
                 "Gemma3nForCausalLM", "JambaForCausalLM", "Qwen3NextForCausalLM"):  # fmt: skip
        assert name in found
    assert found == sorted(set(found))
