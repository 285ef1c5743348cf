"""``kvplan apply``: loads a plan, applies, verifies, reports; exit 0 / 2, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from harness.executor import _plans as plans
from kvplan.cli import apply_cmd
from kvplan.cli.apply_cmd import parse_blocks
from kvplan.schemas.errors import KVPlanError
from kvplan.units import parse_size


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Test root (keeps ``apply`` a subcommand)."""

    apply_cmd.register(app)
    return app


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "gemma.plan.json"
    path.write_text(plans.gemma_plan(num_blocks=64).model_dump_json(indent=2))
    return path


def run(app: typer.Typer, *args: str) -> object:
    return CliRunner().invoke(app, list(args))


def test_json_output(app: typer.Typer, plan_file: Path) -> None:
    res = run(app, "apply", str(plan_file), "--backend", "host-vmm", "--json")
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    data = json.loads(res.stdout)  # type: ignore[attr-defined]
    assert data["backend"] == "host-vmm" and data["mode"] == "eager"
    assert data["verify"] == {"ok": True, "diagnostics": []}
    assert data["mapped_bytes"] == data["reserved_bytes"] == 3 << 20
    assert data["plan"]["views"] == 15 and data["plan"]["aliases"] == 20
    assert {"reserve", "map", "wrap", "views", "total", "verify", "close"} <= set(
        data["timings_ms"]
    )


def test_table_output_and_yaml(app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plans.llama_plan(num_blocks=16).model_dump(mode="json")))
    res = run(app, "apply", str(path), "-b", "torch", "--device", "cpu")
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    out = res.stdout  # type: ignore[attr-defined]
    assert "kvplan apply (torch, eager)" in out and "total (ms)" in out and "verify" in out


def test_elastic_with_blocks(app: typer.Typer, plan_file: Path) -> None:
    args = ["apply", str(plan_file), "-b", "host-vmm", "--mode", "elastic", "--json"]
    res = run(app, *args, "--blocks", "0-3,9", "--chunk-size", "64KiB")
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    data = json.loads(res.stdout)  # type: ignore[attr-defined]
    assert data["mapped_blocks"] == 5 and data["chunk_bytes"] == 64 << 10
    assert data["mapped_bytes"] == 2 * 3 * (64 << 10)  # blocks 0-3 and 9: 2 chunks x 3 slots
    assert "ensure_mapped" in data["timings_ms"]


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--backend", "cuda-vmm"], "KVP401"),
        (["--backend", "torch", "--mode", "elastic"], "KVP401"),
        (["--backend", "meta", "--chunk-size", "lots"], "KVP020"),
        (["--backend", "host-vmm", "--mode", "elastic", "--blocks", "0-999"], "KVP404"),
        (["--backend", "meta", "--blocks", "x"], "KVP004"),
    ],
)
def test_errors_exit_2(app: typer.Typer, plan_file: Path, args: list[str], code: str) -> None:
    res = run(app, "apply", str(plan_file), *args)
    assert res.exit_code == 2
    assert code in res.stderr and "Traceback" not in res.output  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "text", "code"),
    [
        ("bad.json", "{not json", "KVP001"),
        ("bad.yaml", "a: [1, 2", "KVP001"),
        ("wrong.json", '{"format": "kvplan.plan/1"}', "KVP004"),
    ],
)
def test_bad_files(app: typer.Typer, tmp_path: Path, name: str, text: str, code: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    res = run(app, "apply", str(path), "--backend", "meta")
    assert res.exit_code == 2 and code in res.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in res.output  # type: ignore[attr-defined]


def test_missing_file(app: typer.Typer, tmp_path: Path) -> None:
    res = run(app, "apply", str(tmp_path / "nope.json"), "--backend", "meta")
    assert res.exit_code == 2 and "KVP002" in res.stderr  # type: ignore[attr-defined]


def test_verify_failure_exits_2(
    app: typer.Typer, plan_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvplan import executor
    from kvplan.schemas.errors import Code, error

    monkeypatch.setattr(
        executor, "verify", lambda *a, **k: [error(Code.VERIFY_MISMATCH, "x.stride", "bad")]
    )
    res = run(app, "apply", str(plan_file), "--backend", "meta", "--json")
    assert res.exit_code == 2
    assert json.loads(res.stdout)["verify"]["ok"] is False  # type: ignore[attr-defined]
    assert "KVP403" in res.stderr  # type: ignore[attr-defined]


def test_parsers() -> None:
    assert parse_size("2MiB") == parse_size("2M") == 2 << 20
    assert parse_size("4096") == 4096 and parse_size("1.5KiB") == 1536 and parse_size("1KB") == 1000
    assert parse_blocks("0-2, 7") == [0, 1, 2, 7]
    for bad in ("", "0", "2XB", "-1"):
        with pytest.raises(KVPlanError):
            parse_size(bad)


def test_real_cli_registers_apply_without_torch() -> None:
    code = (
        "import sys; from typer.main import get_command; from kvplan.cli import app;"
        "cmd = get_command(app); assert 'apply' in cmd.commands, cmd.commands;"
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
