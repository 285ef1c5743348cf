"""``KVPLAN_PLAN_DIR``: a worker binds only the plan that was reviewed."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from kvplan.integrations.vllm import plugin
from kvplan.integrations.vllm.pipeline._reviewed import slug
from kvplan.schemas.errors import Code, KVPlanError
from tests.integrations.vllm.plugin._models import ModelCase
from tests.integrations.vllm.plugin._runners import (
    FULL_RUNNERS,
    RUNNER_PATHS,
    full_runner,
    via_v2,
)
from tests.integrations.vllm.plugin.conftest import LoadPlugin

pytestmark = pytest.mark.vllm


def _reviewed(
    case: ModelCase, load_plugin: LoadPlugin, tmp_path: Path, name: str = "plan.json"
) -> Path:
    """A golden directory holding the plan this worker makes: DIR/<org>__<name>/<name>."""
    dumps = tmp_path / "dumps"
    load_plugin("torch", dump_dir=dumps)
    via_v2(case)
    plugin.unregister()
    folder = tmp_path / "golden" / slug(case.vllm_config.model_config.model)
    folder.mkdir(parents=True)
    shutil.copy(dumps / "rank0.plan.json", folder / name)
    shutil.copy(dumps / "rank0.input.json", folder / "input.json")
    return folder


@pytest.mark.parametrize("name", ["plan.json", "rank0.plan.json"])
def test_the_reviewed_plan_binds(
    name: str, model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin, tmp_path: Path
) -> None:
    """Reviewed from a V2 dump; bound by another runner (V1 up to 0.33, else the CPU
    build's), then by V2 again from the model's own folder."""
    case = model_case("llama")
    folder = _reviewed(case, load_plugin, tmp_path, name)
    load_plugin("torch", plan_dir=folder.parent)
    other = next(path for path in RUNNER_PATHS if path != "v2")
    _kv, runner = RUNNER_PATHS[other](case)
    assert plugin.stats()["bound"] == 1
    del runner
    plugin.unregister()
    load_plugin("torch", plan_dir=folder)  # one model's folder works too
    via_v2(case)
    assert plugin.stats()["bound"] == 1


def _edit(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _more_blocks(plan: dict) -> None:
    plan["source"]["num_blocks"] += 1


def _other_dtype(plan: dict) -> None:
    plan["views"][0]["dtype"] = "float32" if plan["views"][0]["dtype"] != "float32" else "bfloat16"


@pytest.mark.parametrize(
    ("change", "needle"),
    [(_more_blocks, "source `` changed num_blocks"), (_other_dtype, "changed dtype")],
    ids=["num_blocks", "dtype"],
)
def test_a_different_live_plan_refuses_with_the_diff(
    change: Callable[[dict], None],
    needle: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    case = model_case("llama")
    folder = _reviewed(case, load_plugin, tmp_path)
    _edit(folder / "plan.json", change)
    load_plugin("torch", plan_dir=tmp_path / "golden")
    with pytest.raises(KVPlanError) as info:
        via_v2(case)
    codes = [d.code for d in info.value.diagnostics]
    assert codes[0] is Code.INTEGRATION and Code.REVIEWED_PLAN_DIFFERS in codes
    message = "\n".join(d.render() for d in info.value.diagnostics)
    assert "differs from the reviewed plan" in message and needle in message, message
    # the whole `kvplan diff` markdown goes to vLLM's log, one table row per line
    assert "| section | key | change | field | old | new |" in caplog.text
    assert needle.split()[-1] in caplog.text
    assert plugin.stats()["bound"] == 0 and plugin.bound_caches() == []


def test_missing_reviewed_plan_refuses(
    model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin, tmp_path: Path
) -> None:
    case = model_case("llama")
    (tmp_path / "golden").mkdir()
    with pytest.raises(KVPlanError) as info:  # no reviewed plan at all: refused at start
        load_plugin("torch", plan_dir=tmp_path / "golden")
    assert Code.REVIEWED_PLAN_MISSING in [d.code for d in info.value.diagnostics]
    assert "holds no reviewed plan" in str(info.value) and not plugin.is_active()
    _another_models_plan(tmp_path / "golden")
    load_plugin("torch", plan_dir=tmp_path / "golden")
    with pytest.raises(KVPlanError) as info:
        via_v2(case)
    assert Code.REVIEWED_PLAN_MISSING in [d.code for d in info.value.diagnostics]
    assert "rank0.plan.json does not exist" in str(info.value)


def _another_models_plan(golden: Path) -> None:
    """A golden tree that reviewed another model only (so this one's plan is missing)."""
    (golden / "other__model").mkdir(parents=True)
    (golden / "other__model" / "plan.json").write_text("{}")


def test_plan_dir_that_is_not_a_directory_refuses_to_start(
    load_plugin: LoadPlugin, tmp_path: Path
) -> None:
    with pytest.raises(KVPlanError) as info:
        load_plugin("torch", plan_dir=tmp_path / "nowhere")
    assert Code.REVIEWED_PLAN_MISSING in [d.code for d in info.value.diagnostics]
    assert not plugin.is_active()


@pytest.mark.parametrize("kind", list(FULL_RUNNERS))
def test_profiling_is_not_checked_against_the_reviewed_plan(
    kind: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    case = model_case("llama")
    _another_models_plan(tmp_path / "golden")
    load_plugin("torch", plan_dir=tmp_path / "golden")
    runner = full_runner(kind, case, monkeypatch)
    runner.initialize_kv_cache(case.profiling_config(), is_profiling=True)
    assert plugin.stats()["profiling"] == 1
