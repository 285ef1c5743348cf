"""``kvplan doctor`` as a new user without vLLM (runs without vLLM installed, too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KVPLAN_", "VLLM_"))}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env}
    )


def _without_vllm(*argv: str) -> str:
    """A program running ``kvplan ARGV`` as if vLLM were not installed."""
    return (
        "import sys\n"
        "sys.modules['vllm'] = None  # as if vLLM were not installed\n"
        f"sys.argv = {['kvplan', *argv]!r}\n"
        "from kvplan.cli import main\n"
        "main()\n"
    )


def test_doctor_without_vllm() -> None:
    """A new user without vLLM: a clear report, exit 2, no traceback."""
    code = _without_vllm("doctor")
    done = _run(code, KVPLAN_BACKEND="torch")
    assert done.returncode == 2, done.stderr
    assert "vLLM            not installed: pip install 'kvplan[vllm]'" in done.stdout
    assert "verdict: not usable: vLLM is not installed" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    as_json = _run(_without_vllm("doctor", "--json"), KVPLAN_BACKEND="torch")
    report = json.loads(as_json.stdout)
    assert report["vllm"]["installed"] is False and report["usable"] is False
    assert report["targets"] == []


def test_doctor_without_vllm_cannot_read_vllm_arguments() -> None:
    """``kvplan doctor -- VLLM_ARGS`` without vLLM: the arguments are vLLM's to read, so the
    doctor says it cannot, exit 2, no traceback."""
    code = _without_vllm("doctor", "--json", "--", "--enable-sleep-mode")
    done = _run(code, KVPLAN_BACKEND="torch")
    assert done.returncode == 2, done.stderr
    report = json.loads(done.stdout)
    assert report["vllm_args"] == ["--enable-sleep-mode"] and report["features"] == []
    problems = {p["location"]: p for p in report["problems"]}
    assert problems["vLLM arguments"]["code"] == "KVP501"
    assert "cannot be read without vLLM" in problems["vLLM arguments"]["message"]
    assert "Traceback" not in done.stdout + done.stderr
    text = _run(_without_vllm("doctor", "--", "--enable-sleep-mode"), KVPLAN_BACKEND="torch")
    assert text.returncode == 2 and "Traceback" not in text.stdout + text.stderr
    assert "vLLM features (from the arguments after --)\n  not read: see problems" in text.stdout
    assert "KVP501 error at vLLM arguments: the arguments after -- cannot be read" in text.stdout
