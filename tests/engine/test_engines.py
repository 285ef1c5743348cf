"""Real vLLM 0.32 engines with kvplan binding the KV cache give vanilla's greedy tokens.

One driver process per model runs every engine (see ``cases``): kvplan on the torch and
host-vmm backends, eager and elastic, strict; vanilla; and bindings broken on purpose, which
must change the tokens (so equal tokens mean something). Weights are dummy, re-drawn at a
realistic scale from one seed, identical in every engine of a model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import kvplan
from tests.engine.cases import KVPLAN_VARIANTS, MODEL_CASES, PROMPTS, SHARED
from tests.engine.harness import EngineRun

Runs = Callable[[str], EngineRun]
MODELS = list(MODEL_CASES)
KVPLAN = [name for name, _, _ in KVPLAN_VARIANTS]


@pytest.mark.parametrize("model", MODELS)
def test_kvplan_gives_vanillas_tokens(model: str, engine_run: Runs) -> None:
    run = engine_run(model)
    vanilla = run.tokens("vanilla")
    assert len(vanilla) == len(PROMPTS) and all(len(t) == 6 for t in vanilla)
    for name in KVPLAN:
        assert run.tokens(name) == vanilla, f"{model} {name}"


@pytest.mark.parametrize("model", MODELS)
def test_shared_prefix_came_from_the_cache(model: str, engine_run: Runs) -> None:
    """The second prompt's first blocks were served by prefix caching, in every engine."""
    run = engine_run(model)
    for name in ["vanilla", *KVPLAN]:
        cached = run.variants[name]["cached_tokens"]
        assert cached[0] == 0, (model, name)
        assert 0 < cached[1] < len(SHARED), (model, name, cached)


@pytest.mark.parametrize("model", MODELS)
def test_plugin_really_bound(model: str, engine_run: Runs) -> None:
    run = engine_run(model)
    first = run.variants[KVPLAN[0]]
    assert first["activated_by"] == "vllm-entry-point"  # vLLM's loader found the entry point
    for name in KVPLAN:
        variant = run.variants[name]
        assert variant["active"], name
        assert variant["stats"]["bound"] == 1, (name, variant["stats"])
        assert variant["stats"]["refused"] == variant["stats"]["bypassed"] == 0, name
        assert variant["redrawn_parameters"] > 0
    vanilla = run.variants["vanilla"]
    assert not vanilla["active"] and vanilla["stats"]["bound"] == 0
    kvplan_engines = len(KVPLAN) + len(MODEL_CASES[model].breakages)
    assert run.log.count(" runner bound ") == kvplan_engines
    for _, backend, mode in KVPLAN_VARIANTS:
        assert f"with {backend} ({mode})" in run.log


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("model", MODELS)
def test_dumps_validate_and_replan_to_the_same_plan(
    model: str, engine_run: Runs, tmp_path: Path
) -> None:
    run = engine_run(model)
    dumps = [run.workdir / f"dump-{name}" for name in KVPLAN]
    first = dumps[0]
    assert sorted(p.name for p in first.iterdir()) == ["rank0.input.json", "rank0.plan.json"]
    checked = _cli("validate", str(first / "rank0.plan.json"))
    assert checked.returncode == 0, checked.stderr
    replanned = tmp_path / "plan.json"
    made = _cli("plan", str(first / "rank0.input.json"), "-o", str(replanned))
    assert made.returncode == 0, made.stderr
    assert json.loads(replanned.read_text()) == json.loads((first / "rank0.plan.json").read_text())
    plan = kvplan.load_plan(first / "rank0.plan.json")
    for other in dumps[1:]:  # every backend and mode bound the same plan
        assert kvplan.load_plan(other / "rank0.plan.json") == plan, other.name
    if model.startswith("gemma"):
        assert plan.aliases, "KV sharing must show as aliases"


@pytest.mark.parametrize(
    ("model", "breakage"),
    [(m, b) for m, case in MODEL_CASES.items() for b in case.breakages],
)
def test_a_broken_binding_changes_the_tokens(model: str, breakage: str, engine_run: Runs) -> None:
    """Negative control: equal tokens above are evidence only if a wrong binding shows."""
    run = engine_run(model)
    assert run.variants[breakage]["stats"]["bound"] == 1
    assert run.tokens(breakage) != run.tokens("vanilla"), f"{model}: {breakage} went unnoticed"
