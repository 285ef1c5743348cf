"""``benchmarks/bench_vmm_gpu.py``: refuses loudly without CUDA; tiny run on a GPU (``-m gpu``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tests._scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_vmm_gpu.py"


def load() -> ModuleType:
    return load_benchmark("bench_vmm_gpu")  # importable: no CUDA call at import


def test_without_cuda_it_fails_loudly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        bench.main(["--chunks", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "cannot run" in err and "torch.cuda.is_available() is False" in err


def _fake_result(bench: ModuleType) -> dict[str, Any]:
    stat = {"mean": 10.0, "p50": 9.0, "p99": 30.0, "n": 8}
    arm = {"median_ms": 100.0, "ms_per_gib": 50.0, "x_torch_zeros": 2.0, "samples_ms": []}
    return {
        "date": "2026-01-01",
        "environment": {
            "gpu": "NVIDIA H200",
            "driver": "13.0",
            "torch": "2.11",
            "cuda_bindings": "13.3.1",
        },
        "churn": {
            "chunks": 4,
            "rounds": 2,
            "calls_us": {op: stat for op in bench.OPS},
            "map_per_2mib_us": stat,
            "unmap_per_2mib_us": stat,
        },
        "executor": {"ensure_mapped_us": stat, "release_blocks_us": stat},
        "eager": {"bytes": 2 << 30, "repeats": 3, "arms": {"torch.zeros": arm, "2 MiB": arm}},
        "scratch": {"bytes": 2 << 30, "median_ms": 4.0, "ms_per_gib": 2.0},
    }


def test_docs_section_is_replaced_between_markers(tmp_path: Path) -> None:
    bench = load()
    section = bench.markdown(_fake_result(bench))
    assert "| `cuMemSetAccess` | 10.0 | 9.0 | 30.0 | 36.00 | 60.0 |" in section
    assert "| `cuMemRelease` | 10.0 | 9.0 | 30.0 | – | 23.0 |" in section
    assert "| 2 MiB | 100.0 | 50.0 | 2.00 |" in section
    docs = tmp_path / "performance.md"
    docs.write_text("# Performance\n\nintro\n")
    bench.write_docs(section, docs)
    bench.write_docs(section.replace("NVIDIA H200", "NVIDIA B200"), docs)
    text = docs.read_text()
    assert text.startswith("# Performance\n\nintro\n\n")
    assert text.count(bench.START) == 1 and text.count("## CUDA VMM costs") == 1
    assert "NVIDIA B200" in text and "NVIDIA H200" not in text


def test_committed_docs_hold_the_section_markers() -> None:
    text = (ROOT / "docs" / "performance.md").read_text()
    bench = load()
    assert text.count(bench.START) == 1 and text.count(bench.END) == 1


@pytest.mark.gpu
def test_tiny_run_on_a_gpu(tmp_path: Path) -> None:
    """The whole script with tiny sizes: every section measured, the docs writer works."""
    docs = tmp_path / "performance.md"
    docs.write_text("# Performance\n")
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHONPATH=path)  # keep carried wheels
    args = ["--chunks", "8", "--rounds", "2", "--eager-gib", "0.25", "--repeats", "2"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--write-docs", "--docs", str(docs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "out" / "bench_vmm_gpu.json").read_text())
    calls = result["churn"]["calls_us"]
    assert all(calls[op]["n"] == 16 and calls[op]["mean"] > 0 for op in calls)
    assert result["executor"]["ensure_mapped_us"]["n"] == 16
    arms = result["eager"]["arms"]
    assert set(arms) == {"torch.zeros", "2 MiB", "128 MiB (default)"}
    assert all(a["median_ms"] > 0 for a in arms.values())
    assert result["scratch"]["ms_per_gib"] > 0
    assert "## CUDA VMM costs" in docs.read_text() and "kvcached" in proc.stdout
