"""The release artifacts: the sdist and the wheel built from it are complete, and the wheel
installed into a clean venv (kvplan's four dependencies only, from uv's cache) plans and
shows a golden example with the bundled catalog inside. Also: one version, everywhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

import kvplan

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = "examples/golden/google__gemma-4-E2B-it/input.json"


def runtime_closure() -> list[str]:
    """kvplan's runtime dependencies and theirs, pinned to the versions installed here (so uv
    finds them in its cache, offline)."""
    from importlib.metadata import distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo = [Requirement(r) for r in distribution("kvplan").requires or []]
    todo = [r for r in todo if r.marker is None]  # extras carry a marker
    seen: dict[str, str] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen[name] = version(name)
        for raw in distribution(name).requires or []:
            sub = Requirement(raw)
            if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                todo.append(sub)
    return [f"{name}=={v}" for name, v in sorted(seen.items())]


def run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPLAN_", "VIRTUAL_ENV"))}
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert kvplan.__version__ == "0.2.0"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{kvplan.__version__}] - " in changelog
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{kvplan.__version__}]")


def test_the_installed_metadata_reads_the_same_version() -> None:
    """pyproject.toml's dynamic version is ``kvplan.__version__`` (``kvplan --version`` and
    ``kvplan doctor`` print it: tests/cli/test_version.py)."""
    assert version("kvplan") == kvplan.__version__


@pytest.mark.slow
def test_built_wheel_installs_and_works_in_a_clean_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    tree = tmp_path / "tree"  # a copy: the build writes egg-info and build/ beside its source
    skip = (".*", "build", "dist", "*.egg-info", "__pycache__", "site")
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*skip))
    # the sdist, then the wheel from the sdist: what the sdist lacks, the wheel lacks too; with
    # this venv's setuptools (offline; its bdist_wheel needs no `wheel` package)
    run(
        sys.executable,
        "-m",
        "build",
        "--no-isolation",
        "--skip-dependency-check",
        "--outdir",
        dist,
        tree,
    )
    (wheel,) = dist.glob("kvplan-*.whl")
    (sdist,) = dist.glob("kvplan-*.tar.gz")
    assert wheel.name == f"kvplan-{kvplan.__version__}-py3-none-any.whl"

    names = zipfile.ZipFile(wheel).namelist()
    models = {
        n.split("/")[2] for n in names if n.startswith("kvplan/catalog/") and n.count("/") == 3
    }
    catalog = ROOT / "src" / "kvplan" / "catalog"
    assert models == {p.name for p in catalog.iterdir() if (p / "config.json").is_file()}
    assert "google__gemma-4-E2B-it" in models
    assert "kvplan/py.typed" in names
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
        top = members[0].split("/")[0]
        tar.extractall(tmp_path / "src", filter="data")
    for path in (GOLDEN, "README.md", "CHANGELOG.md", "schemas/kvplan.plan.schema.json"):
        assert f"{top}/{path}" in members, path
    unpacked = tmp_path / "src" / top

    venv = tmp_path / "venv"
    uv = (sys.executable, "-m", "uv")
    run(*uv, "venv", "--python", sys.executable, venv)
    pins = runtime_closure()
    assert any(p.startswith("pydantic==") for p in pins) and len(pins) >= 4
    run(*uv, "pip", "install", "-p", venv, "--offline", *pins)
    run(*uv, "pip", "install", "-p", venv, "--no-deps", "--offline", wheel)
    kv = venv / "bin" / "kvplan"

    assert run(kv, "--version").stdout.strip() == f"kvplan {kvplan.__version__}"
    plan = run(kv, "plan", GOLDEN, cwd=unpacked).stdout
    assert json.loads(plan)["format"] == "kvplan.plan/1"
    (tmp_path / "plan.json").write_text(plan)
    assert "model.layers" in run(kv, "show", tmp_path / "plan.json").stdout
    committed = json.loads((unpacked / GOLDEN).with_name("plan.json").read_text())
    assert json.loads(plan) == committed  # the installed kvplan plans as the source tree does
    code = (
        "import kvplan, kvplan.catalog as c, pathlib; "
        "print(pathlib.Path(c.__file__).parent / 'google__gemma-4-E2B-it' / 'config.json')"
    )
    config = run(venv / "bin" / "python", "-c", code, cwd=tmp_path).stdout.strip()
    assert Path(config).is_file() and str(venv) in config
