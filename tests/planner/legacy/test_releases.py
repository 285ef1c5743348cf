"""Which vLLM releases a legacy document may name, and what each release refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.planner.legacy import build_legacy_plan, plan_legacy
from kvplan.schemas.canonical import to_data
from kvplan.schemas.legacy import (
    LEGACY_REFERENCE_RELEASE,
    LEGACY_VLLM_RELEASES,
    legacy_release,
    legacy_release_accepted,
    parse_legacy,
)
from tests.planner.legacy._helpers import ROOT, load, raw

runner = CliRunner()


def with_version(name: str, version: str | None, **edits: Any) -> dict[str, Any]:
    data = raw(name)
    data["vllm_version"] = version
    data.update(edits)
    return data


def codes(data: dict[str, Any]) -> list[str]:
    _, problems = build_legacy_plan(parse_legacy(data))
    return [d.code for d in problems if d.is_error]


def plan_cli(tmp_path: Path, data: dict[str, Any]) -> Any:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(data))
    return runner.invoke(app, ["plan", str(path)])


def test_release_numbers_map_to_their_minor() -> None:
    assert legacy_release("0.25.1") is LEGACY_VLLM_RELEASES["0.25"]
    assert legacy_release("v0.28.0rc1.dev3+g1234") is LEGACY_VLLM_RELEASES["0.28"]
    assert legacy_release(None) is LEGACY_VLLM_RELEASES[LEGACY_REFERENCE_RELEASE]
    assert not legacy_release_accepted("0.29.0")
    assert not legacy_release_accepted("0.21.0")
    assert not legacy_release_accepted("nightly")


@pytest.mark.parametrize("version", ["0.22.1", "0.23.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0"])
def test_an_attention_model_plans_as_0_24_binds_it(version: str) -> None:
    reference = plan_legacy(load("llama-3.1-8b"))
    plan = plan_legacy(parse_legacy(with_version("llama-3.1-8b", version)))
    assert plan.source.vllm_version == version
    assert to_data(plan)["pools"] == to_data(reference)["pools"]
    assert to_data(plan)["views"] == to_data(reference)["views"]
    assert plan.fingerprint != reference.fingerprint


def test_an_accepted_release_through_the_cli(tmp_path: Path) -> None:
    result = plan_cli(tmp_path, with_version("gemma-4-e2b", "0.26.0"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["source"]["vllm_version"] == "0.26.0"


@pytest.mark.parametrize("version", ["0.29.0", "0.33.0", "0.21.0", "latest"])
def test_a_placement_or_unknown_release_is_refused(tmp_path: Path, version: str) -> None:
    result = plan_cli(tmp_path, with_version("llama-3.1-8b", version))
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("KVP608 error at vllm_version")
    assert "0.22–0.28" in result.stderr and "Traceback" not in result.output


def test_0_22_has_no_packed_tensors() -> None:
    data = with_version("llama-3.1-8b", "0.22.1")
    data["kv_cache_config"]["kv_cache_tensors"][0]["offset"] = 64
    assert codes(data) == ["KVP609"]


def test_fields_0_28_added_are_refused_in_earlier_releases_and_unmodelled_in_0_28() -> None:
    data = with_version("llama-3.1-8b", "0.26.0")
    data["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]["num_head_slots"] = 16
    assert codes(data) == ["KVP609"]
    data["vllm_version"] = "0.28.0"
    assert codes(data) == ["KVP610"]


def test_0_28_captures_with_neutral_new_fields_plan_and_round_trip() -> None:
    data = with_version("deepseek-v2-lite-mla", "0.28.0")
    spec = data["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]
    spec.update(head_size_v=0, num_head_slots=None, state_content_bytes=None)
    spec["non_causal_multi_token_decode"] = False
    doc = parse_legacy(data)
    assert to_data(doc) == data
    reference = plan_legacy(load("deepseek-v2-lite-mla"))
    assert to_data(plan_legacy(doc))["views"] == to_data(reference)["views"]


def test_0_28_refuses_per_token_head_scales() -> None:
    data = with_version("llama-3.1-8b", "0.28.0")
    data["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]["kv_quant_mode"] = (
        "FP8_PER_TOKEN_HEAD"
    )
    assert codes(data) == ["KVP610"]


@pytest.mark.parametrize("version, ok", [("0.26.0", True), ("0.27.1", False), ("0.28.0", False)])
def test_mamba_views_are_0_24s_until_0_27(version: str, ok: bool) -> None:
    found = codes(with_version("jamba-v0.1-hybrid", version))
    assert set(found) == (set() if ok else {"KVP610"})


@pytest.mark.parametrize("version, ok", [("0.24.0", True), ("0.25.1", False)])
def test_mixed_block_dims_restride_from_0_25(version: str, ok: bool) -> None:
    data = with_version("gemma-3-1b", version)
    data["attn_groups"][0]["block_dim"] = 1
    found = codes(data)
    assert ("KVP610" not in found) if ok else found == ["KVP610"]


def test_versions_page_lists_the_releases_kvplan_accepts() -> None:
    """docs/versions.md is generated from kvplan; regenerate it when the releases change."""
    text = (ROOT / "docs" / "versions.md").read_text()
    summary = re.finditer(r"^\| (0\.\d+)\.\d+ \| \w+ \|.*\| legacy: .*$", text, re.M)
    rows = {m.group(1): m.group(0) for m in summary}
    assert set(rows) == {f"0.{n}" for n in range(22, 35)}
    legacy = {minor for minor, row in rows.items() if "| legacy: accepted |" in row}
    assert legacy == set(LEGACY_VLLM_RELEASES)
    shared_by = {minor for minor, row in rows.items() if row.split("|")[2].strip() == "shared_by"}
    assert shared_by == legacy
