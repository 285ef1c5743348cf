"""The legacy document through the CLI: plan options, validate, show, diff against 0.33."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness import _builders as b
from kvplan.cli import app
from tests.planner.legacy._helpers import LEGACY

runner = CliRunner()
GEMMA = str(LEGACY / "gemma-4-e2b.json")


def plan_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.mark.parametrize(
    "options, layout, pools",
    [
        ([], "vanilla/NHD", 3),
        (["--strategy", "vanilla"], "vanilla/NHD", 3),
        (["--strategy", "kvcached"], "kvcached/noncontiguous", 3),
        (["--strategy", "kvcached", "--pool-layout", "contiguous"], "kvcached/contiguous", 1),
    ],
)
def test_plan_strategy_options(options: list[str], layout: str, pools: int) -> None:
    plan = plan_json(GEMMA, *options)
    assert plan["source"]["layout"] == layout and len(plan["pools"]) == pools
    assert len(plan["aliases"]) == 20


def test_virtual_capacity_option() -> None:
    plan = plan_json(GEMMA, "--strategy", "kvcached", "--virtual-capacity", str(64 << 20))
    assert {p["size_bytes"] for p in plan["pools"]} == {64 << 20}
    small = runner.invoke(app, ["plan", GEMMA, "--strategy", "kvcached", "--virtual-capacity", "1"])
    assert small.exit_code == 2 and small.stderr.startswith("KVP607")


def test_bad_option_values_and_options_on_a_033_document(tmp_path: Path) -> None:
    bad = runner.invoke(app, ["plan", GEMMA, "--pool-layout", "sideways"])
    assert bad.exit_code == 2 and bad.stderr.startswith("KVP008") and bad.stdout == ""
    modern = tmp_path / "in.json"
    modern.write_text(json.dumps(b.llama()))
    wrong = runner.invoke(app, ["plan", str(modern), "--strategy", "kvcached"])
    assert wrong.exit_code == 2 and wrong.stderr.startswith("KVP003")


def test_validate_and_show_legacy_documents() -> None:
    ok = runner.invoke(app, ["validate", GEMMA, "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["valid"] is True
    shown = runner.invoke(app, ["show", GEMMA], env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert shown.exit_code == 0 and "tensor_2" in shown.stdout and "aliases" in shown.stdout


def gemma_033(tmp_path: Path) -> Path:
    """vLLM 0.33's gemma-4-E2B input (the core builder), with the real model's layer names."""
    text = json.dumps(b.gemma4_e2b(num_blocks=341)).replace(
        '"model.layers.', '"language_model.model.layers.'
    )
    path = tmp_path / "gemma-033.input.json"
    path.write_text(text)
    return path


def test_diff_between_the_024_and_033_plans(tmp_path: Path) -> None:
    new = gemma_033(tmp_path)
    result = runner.invoke(app, ["diff", GEMMA, str(new), "--format", "json"])
    assert result.exit_code == 1, result.output
    changes = json.loads(result.stdout)["changes"]
    kinds = {(c["section"], c["change"]) for c in changes}
    assert ("pools", "removed") in kinds and ("pools", "added") in kinds
    assert not any(c["section"] == "aliases" for c in changes)  # same 20 sharers, same targets
    layout = next(c for c in changes if c["section"] == "source" and c["field"] == "layout")
    assert (layout["old"], layout["new"]) == ("vanilla/NHD", "LBNHC")
    view = [c for c in changes if c["key"] == "language_model.model.layers.13.self_attn.attn"]
    assert {c["field"] for c in view} >= {"pool", "shape", "stride", "offset_bytes"}


def test_legacy_planning_imports_neither_torch_nor_vllm() -> None:
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['kvplan', 'plan', {GEMMA!r}, '--strategy', 'kvcached']\n"
        "try:\n    runpy.run_module('kvplan', run_name='__main__')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "bad = [m for m in ('torch', 'vllm') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["source"]["layout"] == "kvcached/noncontiguous"
