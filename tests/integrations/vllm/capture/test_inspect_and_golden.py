"""``kvplan inspect`` (library and CLI) and ``kvplan golden`` against the real vLLM."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from tests.integrations.vllm.capture._cases import default_block_size

REPO = Path(__file__).resolve().parents[4]
GOLDEN = REPO / "examples" / "golden"
GEMMA4 = "google/gemma-4-E2B-it"


@pytest.fixture(scope="module")
def gemma4():  # type: ignore[no-untyped-def]
    from kvplan.integrations.vllm.inspect import inspect_model  # (it emulates CUDA itself)

    return inspect_model(GEMMA4)


def _layer(name: str) -> int:
    return int(name.split("layers.")[1].split(".")[0])


def test_inspect_gemma4_e2b_offline(gemma4) -> None:  # type: ignore[no-untyped-def]
    plan = gemma4.plan
    assert gemma4.model.source == "catalog"
    assert gemma4.attention_layers == 35
    assert len(plan.views) == 15 and len(plan.aliases) == 20
    layer_types = json.loads(
        (REPO / "src/kvplan/catalog/google__gemma-4-E2B-it/config.json").read_text()
    )["text_config"]["layer_types"]
    for alias in plan.aliases:
        index = _layer(alias.layer)
        assert index >= 15
        expected = 14 if layer_types[index] == "full_attention" else 13
        assert _layer(alias.target) == expected
    assert plan.summary.alias_saved_bytes > 0
    assert gemma4.capacity_tokens > 0


def test_inspect_plan_equals_vllm_allocator_on_meta(gemma4) -> None:  # type: ignore[no-untyped-def]
    from kvplan.cli.inspect_cmd import verify_result

    assert verify_result(gemma4) == []


def test_inspect_cli_json_and_human(vllm_session: None, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["inspect", GEMMA4, "--json", "--max-model-len", "4096"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["input"]["format"] == "kvplan.input/1"
    assert len(data["plan"]["aliases"]) == 20
    assert data["input"]["metadata"]["inspect"]["options"] == {"max_model_len": 4096}

    out = tmp_path / "gemma.yaml"
    result = runner.invoke(
        app, ["inspect", GEMMA4, "--gpu-memory", "24GiB", "--layout", "BLHNC", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "35 layers" in result.stdout
    assert "15 tensor-backed, 20 aliases" in result.stdout
    assert "KV sharing saves" in result.stdout
    assert out.read_text().startswith("input:")
    # the human output fits 100 columns (the default model, in full: the longest figures)
    wide = runner.invoke(app, ["inspect", GEMMA4], env={"NO_COLOR": "1", "COLUMNS": "100"})
    assert wide.exit_code == 0, wide.output
    assert max(len(line) for line in wide.stdout.splitlines()) <= 100, wide.stdout

    # -o writes what `kvplan plan -o` writes: the canonical JSON of the documents
    from kvplan.schemas.canonical import to_json

    out_json = tmp_path / "gemma.json"
    result = runner.invoke(app, ["inspect", GEMMA4, "--max-model-len", "4096", "-o", str(out_json)])
    assert result.exit_code == 0, result.output
    written = out_json.read_text()
    assert written == to_json(json.loads(written))
    assert written.replace(" ", "").count('"shape":[') > 0  # short lists stay on one line
    bad = runner.invoke(app, ["inspect", GEMMA4, "--gpu-memory", "lots"])
    assert bad.exit_code == 2 and bad.stderr.startswith("KVP020 error at --gpu-memory")


def test_what_inspect_writes_is_what_show_diff_and_validate_read(
    vllm_session: None, tmp_path: Path
) -> None:
    """A new user's next step after ``inspect -o`` (it used to be ``KVP004 ...
    kv_cache_config: required field is missing``)."""
    runner = CliRunner()
    out = tmp_path / "gemma.json"
    result = runner.invoke(app, ["inspect", GEMMA4, "--max-model-len", "4096", "-o", str(out)])
    assert result.exit_code == 0, result.output
    for args in (["show", str(out)], ["validate", str(out)], ["diff", str(out), str(out)]):
        outcome = runner.invoke(app, args)
        assert outcome.exit_code == 0, (args, outcome.stderr)
        assert "KVP0" not in outcome.stderr, outcome.stderr
    plan = json.loads(out.read_text())["plan"]
    stored = tmp_path / "plan.json"
    stored.write_text(json.dumps(plan))
    assert runner.invoke(app, ["diff", str(out), str(stored)]).exit_code == 0


def test_inspect_list_and_unknown_model(vllm_session: None) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["inspect", "--list"])
    assert listed.exit_code == 0 and GEMMA4 in listed.stdout
    missing = runner.invoke(app, ["inspect", "no-such-org/no-such-model"])
    assert missing.exit_code == 2


def test_inspect_without_vllm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvplan.integrations.vllm.environment as integration

    monkeypatch.setattr(integration, "vllm_available", lambda: False)
    result = CliRunner().invoke(app, ["inspect", GEMMA4])
    assert result.exit_code == 2
    assert "pip install 'kvplan[vllm]'" in result.output


def test_importing_kvplan_imports_neither_vllm_nor_torch() -> None:
    code = (
        "import sys, kvplan, kvplan.integrations.vllm, kvplan.cli.app, kvplan.catalog;"
        "bad = {'vllm', 'torch'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_golden_check_input_only_passes() -> None:
    result = CliRunner().invoke(app, ["golden", "check", str(GOLDEN), "--input-only"])
    assert result.exit_code == 0, result.stdout
    assert "0 drifted" in result.stdout


def test_golden_check_through_vllm_passes(vllm_session: None, tmp_path: Path) -> None:
    shutil.copytree(GOLDEN / "google__gemma-4-E2B-it", tmp_path / "google__gemma-4-E2B-it")
    result = CliRunner().invoke(app, ["golden", "check", str(tmp_path)])
    assert result.exit_code == 0, result.stdout


@pytest.mark.parametrize("input_only", [True, False])
def test_golden_check_fails_on_a_changed_plan(
    vllm_session: None, tmp_path: Path, input_only: bool
) -> None:
    folder = tmp_path / "google__gemma-4-E2B-it"
    shutil.copytree(GOLDEN / folder.name, folder)
    plan = json.loads((folder / "plan.json").read_text())
    plan["views"][0]["offset_bytes"] += 4096
    plan["aliases"] = plan["aliases"][1:]
    (folder / "plan.json").write_text(json.dumps(plan))
    args = ["golden", "check", str(tmp_path)] + (["--input-only"] if input_only else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.stdout
    assert "**drift**" in result.stdout and "offset_bytes" in result.stdout


def test_golden_update_rewrites_a_drifted_plan(tmp_path: Path) -> None:
    folder = tmp_path / "google__gemma-4-E2B-it"
    shutil.copytree(GOLDEN / folder.name, folder)
    original = (folder / "plan.json").read_text()
    (folder / "plan.json").write_text(original.replace('"offset_bytes": 0', '"offset_bytes": 8'))
    runner = CliRunner()
    assert runner.invoke(app, ["golden", "update", str(tmp_path), "--input-only"]).exit_code == 0
    assert (folder / "plan.json").read_text() == original


def test_golden_inputs_record_how_they_were_made() -> None:
    from kvplan.cli.golden_cmd import golden_dirs, options_of
    from kvplan.schemas.loading import load_input

    folders = golden_dirs(GOLDEN)
    assert len(folders) >= 10
    for folder in folders:
        model, options, rank = options_of(load_input(folder / "input.json"))
        assert model and rank == 0 and options.tp == 1


def _catalog_ids() -> list[str]:
    from kvplan.catalog import entries

    return [entry.model_id for entry in entries()]


GEMMA4_MOE = "google/gemma-4-26B-A4B"


@pytest.mark.parametrize(
    ("model", "layout"),
    [(model, layout) for model in _catalog_ids() for layout in (None, "BLHNC")],
)
def test_full_size_catalog_models_match_vllm_on_meta(
    vllm_session: None, model: str, layout: str | None
) -> None:
    """Full-size models at 72 GiB: vLLM's allocator on the meta device equals the plan."""
    from kvplan.cli.inspect_cmd import verify_result
    from kvplan.integrations.vllm.inspect import InspectOptions, inspect_model

    max_len = 131072 if "Llama-4" in model else None
    result = inspect_model(model, InspectOptions(layout=layout, max_model_len=max_len))
    assert verify_result(result) == []
    assert result.layout == (layout or "LBNHC")


def test_gemma4_moe_blhnc_block_stride_is_not_a_page_multiple(vllm_session: None) -> None:
    """With BLHNC, vLLM interleaves the layers that share a tensor inside each block: the block
    stride (16-token blocks: 327,680 B; 0.34's 64-token blocks: 1,310,720 B) is no multiple of
    layer 0's page (131,072 B; 524,288 B), and the tensor is a whole number of blocks. The
    planner once demanded page multiples here (KVP107)."""
    from kvplan.cli.inspect_cmd import verify_result
    from kvplan.integrations.vllm.inspect import InspectOptions, inspect_model

    result = inspect_model(GEMMA4_MOE, InspectOptions(layout="BLHNC"))
    assert verify_result(result) == []
    config = result.document.kv_cache_config
    block = default_block_size()
    stride, page = {16: (327_680, 131_072), 64: (1_310_720, 524_288)}[block]
    first = config.kv_cache_groups[0].kv_cache_spec
    assert first.block_size == block
    assert {s.page_size_bytes for s in first.kv_cache_specs.values()} == {page}
    strides = {t.block_stride for t in config.kv_cache_tensors}
    assert stride in strides and stride % page


def test_a_model_vllm_cannot_build_fails_cleanly(vllm_session: None, tmp_path: Path) -> None:
    from kvplan.integrations.vllm.inspect import inspect_model
    from kvplan.schemas.errors import KVPlanError

    config = json.loads((REPO / "src/kvplan/catalog/Qwen__Qwen3-8B/config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(KVPlanError) as caught:
        inspect_model(str(tmp_path))
    assert caught.value.code.value == "KVP501"
    assert "could not plan" in str(caught.value)


def test_every_catalog_model_has_a_golden_plan() -> None:
    from kvplan.catalog import entries

    assert {entry.slug for entry in entries()} <= {path.name for path in GOLDEN.iterdir()}


def test_readme_command_1_prints_kvplans_output_first(tmp_path: Path) -> None:
    """README command 1 as a new user runs it (no VLLM_* or KVPLAN_* settings, stdout and
    stderr in one stream, not a terminal): kvplan's first line comes first — nothing from
    vLLM's import before it (``Failed to import from vllm._C`` on a machine without CUDA)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "KVPLAN_"))}
    env.pop("TORCH_LOGS", None)
    env.pop("TRANSFORMERS_VERBOSITY", None)
    done = subprocess.run(
        [sys.executable, "-m", "kvplan", "inspect", GEMMA4],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env,
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == f"{GEMMA4}  (catalog, Gemma4ForConditionalGeneration)", lines[:5]
    assert not any("vllm._C" in line for line in lines), done.stdout
