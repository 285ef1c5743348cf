"""``KVPLAN_PLAN_DIR`` in a real engine: the reviewed plan starts and gives vanilla's tokens; an
engine whose live plan differs (a float32 KV cache instead of the CPU build's default bfloat16)
refuses to start, with the diff."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from harness.engine._models import write_model
from harness.engine.cases import BATCHES, ENGINE_ARGS, PROMPTS
from harness.engine.harness import EngineRun, Variant, kvplan_env, run_engines


def test_engine_binds_only_the_reviewed_plan(
    engine_python: Path, engine_run: Callable[[str], EngineRun], tmp_path: Path
) -> None:
    first = engine_run("llama")  # vanilla's tokens, and the plan the torch engine dumped
    reviewed = tmp_path / "reviewed"
    reviewed.mkdir()
    shutil.copy(first.workdir / "dump-torch-eager" / "rank0.plan.json", reviewed)
    env = kvplan_env("torch", "eager", KVPLAN_PLAN_DIR=str(reviewed))
    run = run_engines(
        engine_python,
        write_model("llama", tmp_path / "model"),
        [
            Variant("reviewed", env),
            Variant("other-dtype", env, engine={"dtype": "float32"}, expect_refusal=True),
        ],
        tmp_path / "work",
        prompts=PROMPTS,
        batches=BATCHES,
        engine=ENGINE_ARGS,
        max_tokens=6,
    )
    assert run.tokens("reviewed") == first.tokens("vanilla")
    assert run.variants["reviewed"]["stats"]["bound"] == 1
    refused = run.variants["other-dtype"]
    assert refused["refused"], refused
    assert "KVP503" in refused["error"] and "changed dtype" in refused["error"], refused["error"]
    assert refused["stats"]["bound"] == 0
    # the whole `kvplan diff` markdown is in the engine's log
    assert "| section | key | change | field | old | new |" in run.log
