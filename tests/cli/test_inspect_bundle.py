"""What ``kvplan inspect -o`` writes (the ``{"input", "plan"}`` bundle) is what ``show``,
``diff``, ``validate`` and ``apply`` read next: its plan, once the plan is its input's.

The bundle here is built by ``inspect_cmd.bundle`` from a golden model (no vLLM); the same
path through a real ``kvplan inspect`` run is in
``tests/integrations/vllm/capture/test_inspect_and_golden.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.cli.inspect_cmd import bundle
from kvplan.schemas.loading import dump, load_any, load_input, load_plan
from tests.hostile._generators import GOLDEN

runner = CliRunner()
MODEL = GOLDEN / "google__gemma-4-E2B-it"


@pytest.fixture
def written(tmp_path: Path) -> Path:
    path = tmp_path / "gemma.json"
    dump(bundle(load_input(MODEL / "input.json"), load_plan(MODEL / "plan.json")), path)
    return path


def test_show_diff_validate_and_apply_read_the_bundle_as_its_plan(written: Path) -> None:
    assert load_any(written) == load_plan(MODEL / "plan.json")
    show = runner.invoke(app, ["show", str(written)])
    assert show.exit_code == 0, show.stderr
    assert "KVP004" not in show.stderr and "views" in show.stdout
    diff = runner.invoke(app, ["diff", str(written), str(MODEL / "plan.json")])
    assert diff.exit_code == 0 and "identical" in diff.stdout.lower(), diff.stdout
    valid = runner.invoke(app, ["validate", str(written)])
    assert valid.exit_code == 0 and "valid" in valid.stderr, valid.stderr
    applied = runner.invoke(app, ["apply", str(written), "--backend", "meta", "--json"])
    assert applied.exit_code == 0, applied.stderr
    assert json.loads(applied.stdout)["verify"]["ok"]


def test_a_yaml_bundle_is_read_too(tmp_path: Path) -> None:
    path = tmp_path / "gemma.yaml"
    dump(bundle(load_input(MODEL / "input.json"), load_plan(MODEL / "plan.json")), path)
    assert runner.invoke(app, ["show", str(path)]).exit_code == 0


def test_an_edited_bundle_is_kvp027(tmp_path: Path, written: Path) -> None:
    data = json.loads(written.read_text())
    data["input"]["kv_cache_config"]["num_blocks"] += 1
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    result = runner.invoke(app, ["show", str(edited)])
    assert result.exit_code == 2
    assert result.stderr.startswith("KVP027") and "kvplan inspect" in result.stderr


def test_a_bundle_with_a_bad_half_names_the_half(tmp_path: Path, written: Path) -> None:
    data = json.loads(written.read_text())
    del data["plan"]["views"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("KVP004 error at plan.views: required field is missing")
