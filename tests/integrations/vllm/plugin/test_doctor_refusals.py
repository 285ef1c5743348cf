"""``kvplan doctor`` never says ready where the plugin refuses (issue 28): one validation of
every ``KVPLAN_*`` setting (``plugin._preflight.read_mode``), run by both. Each setting below
used to pass the doctor (exit 0) while the engine refused it or ignored it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

pytestmark = pytest.mark.vllm

cli = CliRunner()

EAGER = {"KVPLAN_ENABLE": "1", "KVPLAN_BACKEND": "torch"}
ELASTIC = {"KVPLAN_ENABLE": "1", "KVPLAN_BACKEND": "host-vmm", "KVPLAN_MODE": "elastic"}

CASES: dict[str, tuple[dict[str, str], Callable[[Path], dict[str, str]], str]] = {
    "memory limit -1 (eager)": (EAGER, lambda _: {"KVPLAN_MEMORY_LIMIT": "-1"}, "KVP501"),
    "memory limit lots (eager)": (EAGER, lambda _: {"KVPLAN_MEMORY_LIMIT": "lots"}, "KVP501"),
    "cache limit 2PiB (elastic)": (ELASTIC, lambda _: {"KVPLAN_CACHE_LIMIT": "2PiB"}, "KVP501"),
    "reserve 2PiB (elastic)": (ELASTIC, lambda _: {"KVPLAN_RESERVE": "2PiB"}, "KVP501"),
    "busy reserve some (elastic)": (ELASTIC, lambda _: {"KVPLAN_BUSY_RESERVE": "some"}, "KVP501"),
    "busy ahead often (elastic)": (ELASTIC, lambda _: {"KVPLAN_BUSY_AHEAD": "often"}, "KVP501"),
    "host-vmm latency profile fast (elastic)": (
        ELASTIC,
        lambda _: {"KVPLAN_HOST_VMM_LATENCY": "fast"},
        "KVP401",
    ),
    "plan dir /proc": (EAGER, lambda _: {"KVPLAN_PLAN_DIR": "/proc"}, "KVP504"),
    "plan dir empty": (EAGER, lambda tmp: {"KVPLAN_PLAN_DIR": str(tmp)}, "KVP504"),
    "VLLM_PLUGINS without kvplan": (
        {"KVPLAN_BACKEND": "torch"},
        lambda _: {"VLLM_PLUGINS": "other"},
        "KVP501",
    ),
}


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name, value in (("VLLM_LOGGING_LEVEL", "ERROR"), ("TRANSFORMERS_VERBOSITY", "error"),
                        ("TORCH_LOGS", "-all")):  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in [n for n in os.environ if n.startswith("KVPLAN_")]:  # each case sets its own
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _doctor(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = cli.invoke(app, ["doctor", "--json"])
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("case", list(CASES))
def test_doctor_refuses_every_setting_the_plugin_refuses(
    quiet: pytest.MonkeyPatch, tmp_path: Path, case: str
) -> None:
    from kvplan.integrations.vllm.plugin import preflight

    base, bad, code = CASES[case]
    exit_code, report = _doctor(quiet, base)
    assert exit_code == 0, report["problems"]  # the same setup without the bad setting is ready
    extra = bad(tmp_path)
    exit_code, report = _doctor(quiet, extra)
    errors = [p for p in report["problems"] if p["severity"] == "error"]
    assert exit_code == 2 and not report["usable"], report["verdict"]
    assert report["verdict"].startswith("not usable")
    assert [p["code"] for p in errors] == [code], errors
    assert errors[0]["location"] == next(iter(extra))
    if "VLLM_PLUGINS" not in extra:  # vLLM does not load a plugin it does not list
        found = preflight({**base, **extra})
        assert [p.code.value for p in found.problems if p.is_error] == [code]


@pytest.mark.parametrize(
    ("setup", "budget", "code"),
    [
        ("missing", None, "KVP540"),  # the engine refuses it too: a typo must start no group
        ("missing", "64MiB", "KVP540"),  # a join needs the directory (kvplan limit makes it)
        ("no ledger", None, "KVP544"),
        ("no ledger", "64MiB", None),  # the first join creates the ledger
        ("open to others", "64MiB", "KVP540"),
    ],
)
def test_doctor_runs_the_groups_own_start_up_checks(
    quiet: pytest.MonkeyPatch, tmp_path: Path, setup: str, budget: str | None, code: str | None
) -> None:
    """``KVPLAN_GROUP`` is checked as the engine checks it when the plugin registers: the
    doctor's verdict and exit status are the engine's (it used to say "ready")."""
    from kvplan.integrations.vllm.plugin import preflight

    group = tmp_path / "group"
    if setup != "missing":
        group.mkdir(mode=0o700)
    if setup == "open to others":
        group.chmod(0o777)
    env = {**ELASTIC, "KVPLAN_GROUP": str(group), "KVPLAN_ENGINE_NAME": "llama"}
    if budget is not None:
        env["KVPLAN_GROUP_BUDGET"] = budget
    exit_code, report = _doctor(quiet, env)
    errors = [p for p in report["problems"] if p["severity"] == "error"]
    if code is None:
        assert exit_code == 0 and errors == [], errors
        assert not (group / "ledger.json").exists()  # the doctor creates nothing
        return
    assert exit_code == 2 and report["verdict"].startswith("not usable"), report["verdict"]
    assert [p["code"] for p in errors] == [code], errors
    assert str(group) in errors[0]["location"]
    assert [p.code.value for p in preflight(env).problems if p.is_error] == [code]
    assert not group.exists() or list(group.iterdir()) == []


def test_an_unavailable_backends_advice_fits_the_mode(quiet: pytest.MonkeyPatch) -> None:
    """Elastic mode is never told to use torch (which refuses it): the fix names a backend
    that serves elastic mode here."""
    from kvplan.executor.backends import backend_class

    if backend_class("cuda-vmm").available() is None:
        pytest.skip("cuda-vmm is available here")
    for mode, wanted, unwanted in (("eager", "torch", None), ("elastic", "host-vmm", "torch")):
        env = {"KVPLAN_ENABLE": "1", "KVPLAN_BACKEND": "cuda-vmm", "KVPLAN_MODE": mode}
        exit_code, report = _doctor(quiet, env)
        (problem,) = [p for p in report["problems"] if p["location"] == "KVPLAN_BACKEND"]
        assert exit_code == 2 and wanted in problem["hint"], problem
        assert unwanted is None or unwanted not in problem["hint"], problem
