"""``--html OUT`` on show, diff, inspect and golden check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.render._pictures import GEMMA, gemma_plan
from kvplan.cli import app
from kvplan.schemas.loading import load_input, load_plan
from tests.render.test_render import names_in

runner = CliRunner()
GOLDEN = GEMMA.parents[3] / "examples" / "golden"
"""The golden examples (``golden check`` re-plans them); the pictures draw ``GEMMA``, a fixed
copy of vLLM 0.33's plan."""


def test_show_html_writes_the_page_and_still_prints_tables(tmp_path: Path) -> None:
    out = tmp_path / "plan.html"
    result = runner.invoke(app, ["show", str(GEMMA / "plan.json"), "--html", str(out)])
    assert result.exit_code == 0, result.output
    assert "views" in result.stdout and f"wrote {out}" in result.stderr
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and names_in(page, gemma_plan()) == []


def test_show_html_plans_an_input_document(tmp_path: Path) -> None:
    out = tmp_path / "input.html"
    result = runner.invoke(app, ["show", str(GEMMA / "input.json"), "--html", str(out)])
    assert result.exit_code == 0, result.output
    assert "sharers (own 0 B)" in out.read_text(encoding="utf-8")


def test_diff_html_writes_the_page_and_keeps_the_exit_code(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    data = json.loads((GEMMA / "plan.json").read_text())
    data["views"][1]["offset_bytes"] += 256
    other.write_text(json.dumps(data))
    out = tmp_path / "diff.html"
    result = runner.invoke(app, ["diff", str(GEMMA / "plan.json"), str(other), "--html", str(out)])
    assert result.exit_code == 1, result.output
    page = out.read_text(encoding="utf-8")
    assert "1 change(s)" in page and "offset_bytes" in page


def test_golden_check_html_writes_one_page_per_drifted_model(tmp_path: Path) -> None:
    root = tmp_path / "golden"
    for name in ("google__gemma-4-E2B-it", "Qwen__Qwen3-8B"):
        shutil.copytree(GOLDEN / name, root / name)
    drifted = root / "google__gemma-4-E2B-it" / "plan.json"
    data = json.loads(drifted.read_text())
    data["aliases"] = data["aliases"][1:]
    drifted.write_text(json.dumps(data))
    pages = tmp_path / "pages"
    result = runner.invoke(
        app, ["golden", "check", str(root), "--input-only", "--html", str(pages)]
    )
    assert result.exit_code == 1, result.output
    assert sorted(p.name for p in pages.iterdir()) == ["google__gemma-4-E2B-it.html"]
    page = (pages / "google__gemma-4-E2B-it.html").read_text(encoding="utf-8")
    assert "stored plan.json" in page and "regenerated" in page and "1 added" in page


def test_inspect_html_draws_the_inspected_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvplan.cli.inspect_cmd as inspect_cmd

    result_stub = SimpleNamespace(
        document=load_input(GEMMA / "input.json"),
        plan=load_plan(GEMMA / "plan.json"),
        model=SimpleNamespace(name="google/gemma-4-E2B-it"),
        notes=[],
        seconds=0.0,
    )

    def fake_run_inspect(model: str, options: Any, *, quiet: bool) -> Any:
        return result_stub

    monkeypatch.setattr(inspect_cmd, "run_inspect", fake_run_inspect)
    out = tmp_path / "inspect.html"
    result = runner.invoke(app, ["inspect", "google/gemma-4-E2B-it", "--json", "--html", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    assert "google/gemma-4-E2B-it" in page and names_in(page, result_stub.plan) == []
