"""``benchmarks/gpu_elastic.py`` runs clean on the CPU (host-vmm, small sizes), so its one run on
a GPU does not die of a bug the CPU could have shown: every check, the subprocesses included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.executor.backends.host_vmm import HostVmmBackend

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_elastic.py"
CHECKS = {"environment", "kernels", "poison", "group", "map_in_step", "beside"}


@pytest.mark.skipif(HostVmmBackend.available() is not None, reason="host-vmm needs Linux memfd")
def test_every_check_passes_on_the_cpu(tmp_path: Path) -> None:
    args = [sys.executable, str(SCRIPT), "--backend", "host-vmm", "--device", "cpu"]
    proc = subprocess.run(
        [*args, "--churn-seconds", "1.5"],
        env={**os.environ, "OUT": str(tmp_path)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "gpu_elastic.json").read_text())
    checks = result["checks"]
    assert set(checks) == CHECKS
    assert {name: c["status"] for name, c in checks.items()} == dict.fromkeys(CHECKS, "ok")
    assert result["failed"] == []
    assert (tmp_path / "gpu_elastic_run.log").is_file()
    kernels = checks["kernels"]["counts"]
    assert kernels["released_then_remapped_read_zero"] > 0 and kernels["sdpa_calls"] > 0
    assert checks["poison"]["fault"]["signal"] == "SIGSEGV"
    assert checks["group"]["over_budget"] == []
    assert checks["group"]["beyond_free_memory"] == "skipped on cpu"
    assert set(checks["map_in_step"]["ratios"]) == {"sequential", "strided"}
    assert set(checks["beside"]["median_over_compute"]) == {"in_step", "beside"}
