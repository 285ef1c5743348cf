"""The offline commands as a user runs them: exit codes, streams, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness import _builders as b
from kvplan.cli import app

ROOT = Path(__file__).resolve().parents[2]
BAD = sorted((ROOT / "tests" / "data" / "bad").iterdir())
runner = CliRunner()


@pytest.fixture
def gemma(tmp_path: Path) -> Path:
    path = tmp_path / "gemma.input.json"
    path.write_text(json.dumps(b.gemma4_e2b()))
    return path


def test_there_are_at_least_25_bad_documents() -> None:
    assert len(BAD) >= 25


@pytest.mark.parametrize("path", BAD, ids=[p.name for p in BAD])
def test_bad_document_fails_with_its_code_and_exit_2(path: Path) -> None:
    code = path.name.split("-")[0]
    for command in (["validate", str(path)], ["plan", str(path)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        first = result.stderr.strip().splitlines()[0]
        assert first.startswith(code), first
        assert result.stdout == ""


def test_plan_prints_canonical_json_and_writes_yaml(gemma: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(gemma)])
    assert result.exit_code == 0
    plan = json.loads(result.stdout)
    assert plan["format"] == "kvplan.plan/1" and len(plan["aliases"]) == 20
    out = tmp_path / "plan.yaml"
    assert runner.invoke(app, ["plan", str(gemma), "-o", str(out)]).exit_code == 0
    assert out.read_text().startswith("format: kvplan.plan/1")


def test_validate_json_reports_valid(gemma: Path) -> None:
    result = runner.invoke(app, ["validate", str(gemma), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["valid"] is True


def test_show_renders_tables_and_json(gemma: Path) -> None:
    result = runner.invoke(app, ["show", str(gemma)], env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0
    assert "aliases" in result.stdout and "model.layers.<layer>.self_attn.attn" in result.stdout
    assert any(line.split("│")[1].strip() == "34" for line in _rows(result.stdout))
    assert "\x1b[" not in result.stdout
    data = json.loads(runner.invoke(app, ["show", str(gemma), "--json"]).stdout)
    assert data["summary"]["aliased_layers"] == 20


def test_diff_exit_codes_and_formats(gemma: Path, tmp_path: Path) -> None:
    same = runner.invoke(app, ["diff", str(gemma), str(gemma)])
    assert same.exit_code == 0
    other = tmp_path / "other.json"
    doc = b.gemma4_e2b(num_blocks=65)
    doc["shared_kv_cache_layers"].pop(b.name(34))
    other.write_text(json.dumps(doc))
    diff = runner.invoke(app, ["diff", str(gemma), str(other), "--format", "json"])
    assert diff.exit_code == 1
    changes = json.loads(diff.stdout)["changes"]
    assert {"section": "aliases", "key": b.name(34), "change": "removed"}.items() <= changes[
        -1
    ].items() or any(
        c["section"] == "aliases" and c["key"] == b.name(34) and c["change"] == "removed"
        for c in changes
    )
    assert any(c["section"] == "source" and c["field"] == "num_blocks" for c in changes)
    md = runner.invoke(app, ["diff", str(gemma), str(other), "--format", "markdown"])
    assert md.exit_code == 1 and "| section |" in md.stdout
    missing = runner.invoke(app, ["diff", str(gemma), str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "KVP002" in missing.stderr


def test_schema_commands_match_committed_files() -> None:
    for which, name in (
        ("input", "kvplan.input.schema.json"),
        ("legacy", "kvplan.input-legacy.schema.json"),
        ("plan", "kvplan.plan.schema.json"),
    ):
        result = runner.invoke(app, ["schema", which])
        assert result.exit_code == 0
        committed = (ROOT / "schemas" / name).read_text()
        assert json.loads(result.stdout) == json.loads(committed), (
            f"schemas/{name} is stale: run `kvplan schema {which} > schemas/{name}`"
        )


def test_import_and_plan_command_do_not_import_torch_or_vllm(gemma: Path) -> None:
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['kvplan', 'plan', {str(gemma)!r}]\n"
        "try:\n    runpy.run_module('kvplan', run_name='__main__')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "bad = [m for m in ('torch', 'vllm') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["format"] == "kvplan.plan/1"


def test_console_script_reports_bad_input_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = subprocess.run(
        [sys.executable, "-m", "kvplan", "plan", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("KVP001") and "Traceback" not in proc.stderr


def test_every_code_is_documented() -> None:
    from kvplan.schemas.errors import Code

    text = (ROOT / "docs" / "reference" / "codes.md").read_text()
    missing = [c.value for c in Code if f"`{c.value}`" not in text]
    assert not missing, f"run python tools/gen_reference.py; missing: {missing}"


def test_unknown_schema_name_is_a_coded_error_listing_the_known_names() -> None:
    result = runner.invoke(app, ["schema", "plans"])
    assert result.exit_code == 2
    assert result.stderr.startswith("KVP021") and "input, legacy, plan" in result.stderr


def test_inspect_and_golden_add_take_the_same_inspect_options() -> None:
    from dataclasses import fields

    import typer.main

    from kvplan.cli._inspect_flags import InspectFlags

    root = typer.main.get_command(app)
    inspect_cmd = root.commands["inspect"]  # type: ignore[attr-defined]
    add_cmd = root.commands["golden"].commands["add"]  # type: ignore[attr-defined]
    shared = {f.name for f in fields(InspectFlags)}
    for command in (inspect_cmd, add_cmd):
        assert shared <= {p.name for p in command.params}
    bad = runner.invoke(app, ["golden", "add", "g", "some/model", "--gpu-memory", "0"])
    assert bad.exit_code == 2 and bad.stderr.startswith("KVP020 error at --gpu-memory")


def test_every_inspect_flag_read_from_text_is_refused_under_its_own_option_name() -> None:
    """The flags the CLI parses (sizes, numbers, counts) name the option a user typed when
    the text is bad, and every other flag reaches :class:`InspectOptions` as typed."""
    from kvplan.cli._inspect_flags import _PARSERS, InspectFlags
    from kvplan.schemas.errors import KVPlanError

    for name in _PARSERS:
        flag = "--" + name.replace("_", "-")
        with pytest.raises(KVPlanError) as caught:
            InspectFlags(**{name: "x"}).options()  # type: ignore[arg-type]
        assert caught.value.diagnostics[0].location == flag
        result = runner.invoke(app, ["inspect", "some/model", flag, "x"])
        assert result.exit_code == 2 and f"error at {flag}:" in result.stderr
    options = InspectFlags(no_hybrid=True, layout="LBNHC", tp="2").options()
    assert options.disable_hybrid_kv_cache_manager and options.layout == "LBNHC"
    assert options.tp == 2


GOLDEN = Path(__file__).resolve().parents[2] / "examples" / "golden"
E2B, E4B = (GOLDEN / f"google__gemma-4-{m}-it" / "plan.json" for m in ("E2B", "E4B"))


def _rows(text: str) -> list[str]:
    """The body rows of every rich table in ``text``."""
    return [line for line in text.splitlines() if line.startswith("│")]


def test_show_of_gemma4_e2b_reads_at_100_columns() -> None:
    """One row per view (layer as the part of its name that differs, kind short, shape and
    stride one word each), every line within 100 columns, nothing cut."""
    plan = json.loads(E2B.read_text())
    result = runner.invoke(app, ["show", str(E2B)], env={"NO_COLOR": "1", "COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert "views by group (layer = language_model.model.layers.<layer>.self_attn.attn)" in lines
    cells = [[c.strip() for c in row.split("│")[1:-1]] for row in _rows(result.stdout)]
    views = [c for c in cells if len(c) == 7]
    assert len(views) == len(plan["views"]) == 15
    assert not any("…" in cell for row in cells for cell in row)
    by_layer = {row[1]: row for row in views}
    full = {v["layer"].split(".")[3]: v for v in plan["views"]}
    for layer, view in full.items():
        group, _, kind, dtype, shape, stride, offset = by_layer[layer]
        assert (int(group), kind, dtype, int(offset)) == (
            view["group"], view["kind"].removesuffix("Spec"), view["dtype"], view["offset_bytes"]
        )  # fmt: skip
        assert shape == "×".join(map(str, view["shape"]))
        assert stride == "×".join(map(str, view["stride"]))
    aliases = [c for c in cells if len(c) == 2]
    assert len(aliases) == len(plan["aliases"]) == 20


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_diff_of_two_gemma4_plans_reads_at_100_columns(fmt: str) -> None:
    result = runner.invoke(
        app, ["diff", str(E2B), str(E4B), "-f", fmt], env={"NO_COLOR": "1", "COLUMNS": "100"}
    )
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert "…" not in result.stdout
    assert "language_model.model.layers.<layer>.self_attn.attn" in lines[0]
    if fmt == "text":
        assert "~ views[0].shape: 218453×1×128×512 -> 81920×2×128×512" in lines
        assert "~ views[5].kind: SlidingWindowSpec -> FullAttentionSpec" in lines
    else:
        assert "| views | `0` | changed | shape | `218453×1×128×512` | `81920×2×128×512` |" in lines
    # the JSON keeps every name whole
    data = json.loads(runner.invoke(app, ["diff", str(E2B), str(E4B), "-f", "json"]).stdout)
    assert "language_model.model.layers.0.self_attn.attn" in {c["key"] for c in data["changes"]}
