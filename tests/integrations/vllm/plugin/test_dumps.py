"""``KVPLAN_DUMP_DIR``: each rank's input document and plan, readable by the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvplan
from kvplan.cli import app
from kvplan.integrations.vllm import plugin, to_vllm
from kvplan.schemas.errors import KVPlanError
from tests.integrations.vllm.plugin._models import ModelCase
from tests.integrations.vllm.plugin._runners import (
    FULL_RUNNERS,
    RUNNER_PATHS,
    full_runner,
    via_v2,
)
from tests.integrations.vllm.plugin.conftest import LoadPlugin

pytestmark = pytest.mark.vllm

cli = CliRunner()


def test_dumps_round_trip_through_show_and_diff(
    model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin, tmp_path: Path
) -> None:
    case = model_case("gemma4-e2b")
    first, *others = RUNNER_PATHS  # V1 up to 0.33, else V2; then the others
    first_dir = tmp_path / first
    load_plugin("torch", dump_dir=first_dir)
    _kv, runner = RUNNER_PATHS[first](case)
    (cache,) = plugin.bound_caches()
    assert sorted(p.name for p in first_dir.iterdir()) == ["rank0.input.json", "rank0.plan.json"]

    plan_path, input_path = first_dir / "rank0.plan.json", first_dir / "rank0.input.json"
    assert kvplan.load_plan(plan_path) == cache.plan
    document = kvplan.load_input(input_path)
    assert kvplan.plan(document) == cache.plan
    assert to_vllm(document) == case.engine_config  # the worker's config, losslessly
    assert document.shared_kv_cache_layers == case.shared

    shown = cli.invoke(app, ["show", str(plan_path)])
    assert shown.exit_code == 0, shown.output
    assert "aliases" in shown.stdout and "language_model.model.layers.<layer>" in shown.stdout
    assert "│ 34    │" in shown.stdout  # a sharer, by the part of its name that differs
    as_json = cli.invoke(app, ["show", "--json", str(plan_path)])
    assert json.loads(as_json.stdout)["fingerprint"] == cache.plan.fingerprint

    same = cli.invoke(app, ["diff", str(input_path), str(plan_path)])
    assert same.exit_code == 0, same.output

    assert others
    for other in others:
        plugin.unregister()
        load_plugin("torch", dump_dir=tmp_path / other)
        _kv, owner = RUNNER_PATHS[other](case)
        both = cli.invoke(app, ["diff", str(plan_path), str(tmp_path / other / "rank0.plan.json")])
        assert both.exit_code == 0, (other, both.output)  # every runner: the same plan
        del owner
    del runner


def test_diff_of_two_models_reports_changes(
    model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin, tmp_path: Path
) -> None:
    for name in ("llama", "mla"):
        load_plugin("torch", dump_dir=tmp_path / name)
        via_v2(model_case(name))
        plugin.unregister()
    result = cli.invoke(
        app,
        [
            "diff",
            str(tmp_path / "llama" / "rank0.plan.json"),
            str(tmp_path / "mla" / "rank0.plan.json"),
        ],
    )
    assert result.exit_code == 1, result.output
    assert result.stdout.strip()


@pytest.mark.parametrize("kind", list(FULL_RUNNERS))
def test_profiling_is_dumped_separately(
    kind: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    case = model_case("llama")
    load_plugin("torch", dump_dir=tmp_path)
    runner = full_runner(kind, case, monkeypatch)
    runner.initialize_kv_cache(case.profiling_config(), is_profiling=True)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["rank0.profiling.input.json", "rank0.profiling.plan.json"]
    profiling = kvplan.load_input(tmp_path / "rank0.profiling.input.json")
    assert profiling.metadata["phase"] == "profiling"
    assert profiling.layout is not None  # planned with the runner's layout argument


def test_unwritable_dump_dir_refuses_to_start(load_plugin: LoadPlugin, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(KVPlanError, match="KVPLAN_DUMP_DIR"):
        load_plugin("torch", dump_dir=blocker / "dumps")
    assert not plugin.is_active()
