"""The examples of the input/output guard-rails issue, one test each (CLI as a user runs it)."""

from __future__ import annotations

import copy
import errno
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from harness import _builders as b
from harness._stats import make_stats
from kvplan.elastic.files import write_stats
from kvplan.schemas import loading
from kvplan.schemas.errors import Code, KVPlanError, error, printable, show_value
from kvplan.units import MAX_OPTION_BYTES, human_bytes, parse_size
from tests.hostile._harness import assert_bounded, assert_refused, digest, invoke, spawn

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "examples" / "golden" / "google__gemma-3-1b-it"


def _plan_data() -> dict[str, Any]:
    return json.loads((GOLDEN / "plan.json").read_text())


def _file(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


# 1. crashes: deep nesting, huge numbers, markup, output failures, one boundary


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.json", "[" * 1000 + "]" * 1000),
        ("deep.yaml", "a: " + "[" * 1000 + "]" * 1000 + "\n"),
        (
            "deep-block.yaml",
            "".join("  " * i + f"k{i}:\n" for i in range(1000)) + "  " * 1000 + "v",
        ),
    ],
)
def test_deep_nesting_is_kvp009(tmp_path: Path, name: str, text: str) -> None:
    outcome = spawn(["plan", str(_file(tmp_path, name, text))])
    assert_refused(outcome, "KVP009")


def test_deeply_nested_metadata_is_kvp009(tmp_path: Path) -> None:
    doc = b.llama(4)
    deep: Any = 1
    for _ in range(200):
        deep = {"m": deep}
    doc["metadata"] = deep
    assert_refused(invoke(["plan", str(_file(tmp_path, "d.json", json.dumps(doc)))]), "KVP009")


def test_self_referencing_alias_is_kvp012_also_through_diff(tmp_path: Path) -> None:
    bad = _file(tmp_path, "self.yaml", "format: kvplan.input/1\nmetadata: &m {self: *m}\n")
    good = _file(tmp_path, "good.json", json.dumps(b.llama(4)))
    for args in (["plan", str(bad)], ["diff", str(bad), str(good)], ["validate", str(bad)]):
        outcome = invoke(args)
        assert_refused(outcome, "KVP012")
        assert "line 2, column" in outcome.stderr


@pytest.mark.parametrize("digits", [20, 4299, 4301, 100_000])
def test_integer_outside_64_bits_is_kvp010_with_position(tmp_path: Path, digits: int) -> None:
    doc = json.dumps(b.llama(4)).replace('"num_blocks": 64', '"num_blocks": 1' + "0" * digits)
    for suffix in (".json", ".yaml"):
        outcome = invoke(["plan", str(_file(tmp_path, "n" + suffix, doc))])
        assert_refused(outcome, "KVP010")
        assert "line 1, column" in outcome.stderr


def test_non_finite_numbers_are_kvp010(tmp_path: Path) -> None:
    for text in ('{"a": NaN}', '{"a": -Infinity}', '{"a": 1e999}'):
        assert_refused(invoke(["validate", str(_file(tmp_path, "f.json", text))]), "KVP010")
    assert_refused(invoke(["validate", str(_file(tmp_path, "f.yaml", "a: .inf\n"))]), "KVP010")


def test_size_formatting_and_parsing_never_overflow() -> None:
    assert human_bytes(10**400) == "more than 10^290 TiB"
    assert human_bytes(10**20).endswith("TiB") and human_bytes(1610612736) == "1.50 GiB"
    for text in ("1" + "0" * 5000, "2QiB", "0", "-1", "lots"):
        with pytest.raises(KVPlanError) as raised:
            parse_size(text, "--size")
        assert raised.value.code == "KVP020" and raised.value.diagnostics[0].location == "--size"
    # a size that reads but is too large is KVP405 whatever its magnitude (8 EiB and more too)
    for text in ("9" * 40, "99999999999999999999TiB", "8EiB", "9EiB", "16EiB"):
        with pytest.raises(KVPlanError) as raised:
            parse_size(text, "--size")
        assert raised.value.code == "KVP405" and raised.value.diagnostics[0].location == "--size"
        with pytest.raises(KVPlanError) as raised:
            parse_size(text, "SIZE", limit=MAX_OPTION_BYTES)
        assert raised.value.code == "KVP405"
    with pytest.raises(KVPlanError) as raised:
        parse_size("4096TiB", "--chunk-size", limit=MAX_OPTION_BYTES)
    assert raised.value.code == "KVP405"
    assert parse_size("1.5KiB") == 1536 and parse_size("1KB") == 1000
    assert parse_size("2PiB") == 2 << 50 and parse_size("1P") == 1 << 50
    assert parse_size("1PB") == 10**15 and parse_size("4EiB") == 4 << 60


def test_the_documented_size_limit_is_a_size_kvplan_reads(tmp_path: Path) -> None:
    """docs/cli.md: sizes "above 1 PiB" give KVP405; 1 PiB itself is accepted, so PiB is a
    unit (it used to be KVP020, an unreadable size, which contradicted the text)."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    assert "`KVP405` above 1 PiB" in docs and "`KiB`…`EiB`" in docs
    assert parse_size("1PiB", limit=MAX_OPTION_BYTES) == MAX_OPTION_BYTES
    for args in (
        ["limit", str(tmp_path), "2PiB"],
        ["limit", str(tmp_path), "8EiB"],  # 8 EiB and more: KVP405 too, as cli.md says
        ["limit", str(tmp_path), "100EiB"],
        ["limit", str(tmp_path), "1PiB", "--cache", "2P"],
        ["limit", str(tmp_path), "1PiB", "--cache", "9EiB"],
    ):
        assert_refused(invoke(args), "KVP405")
    write_stats(tmp_path, make_stats(time=time.time()))  # an engine dumps there
    assert invoke(["limit", str(tmp_path), "1PiB"]).exit_code == 0


@pytest.mark.parametrize(
    ("chunk", "code"),
    [
        ("2PiB", "KVP405"),
        ("4096TiB", "KVP405"),
        ("2QiB", "KVP020"),
        ("9" * 30, "KVP405"),
        ("9" * 41, "KVP020"),
    ],
)
def test_apply_chunk_size_is_validated(tmp_path: Path, chunk: str, code: str) -> None:
    plan = _file(tmp_path, "p.json", (GOLDEN / "plan.json").read_bytes())
    outcome = invoke(["apply", str(plan), "--backend", "meta", "--chunk-size", chunk])
    assert_refused(outcome, code)


def test_markup_and_escapes_in_names_are_shown_as_text(tmp_path: Path) -> None:
    data = _plan_data()
    name = "[/]\x1b[31mpool\u202e"
    data["pools"][0]["name"] = name
    for view in data["views"]:
        view["pool"] = name
    data["views"][0]["layer"] = "[bold]layer[/bold]\x1b]0;title\x07"
    data["source"]["vllm_version"] = "[/]"
    data["fingerprint"] = "sha256:[/]\x1b[2J"
    path = _file(tmp_path, "p.json", json.dumps(data))
    shown = invoke(["show", str(path)], env={"NO_COLOR": "1", "COLUMNS": "300"})
    assert shown.exit_code == 0, shown.stderr
    assert "\\x1b[31mpool\\u202e" in shown.stdout and "[/]" in shown.stdout
    assert "[bold]layer[/bold]" in shown.stdout
    other = copy.deepcopy(data)
    other["views"][1]["layer"] = "\x1b[2Jgone"
    diff = invoke(["diff", str(path), str(_file(tmp_path, "q.json", json.dumps(other)))])
    for outcome in (shown, diff, invoke(["show", str(path), "--json"])):
        assert "\x1b" not in outcome.stdout + outcome.stderr
        assert "\u202e" not in outcome.stdout + outcome.stderr
    assert diff.exit_code == 1 and "\\x1b[2Jgone" in diff.stdout


def test_escapes_in_diagnostics_are_escaped(tmp_path: Path) -> None:
    doc = b.llama(4)
    doc["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]["dtype"] = "\x1b[31m[/]"
    outcome = invoke(["plan", str(_file(tmp_path, "e.json", json.dumps(doc)))])
    assert_refused(outcome, "KVP006")
    assert "\\x1b[31m[/]" in outcome.stderr


def test_one_boundary_reports_a_bug_as_kvp019(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kvplan.cli import _documents

    def broken(*args: object) -> None:
        raise ZeroDivisionError("x" * 10_000)

    monkeypatch.setattr(_documents, "load_any", broken)
    path = _file(tmp_path, "in.json", json.dumps(b.llama(4)))
    outcome = invoke(["show", str(path)])
    assert outcome.exit_code == 2 and outcome.stderr.startswith("KVP019")
    assert "ZeroDivisionError" in outcome.stderr and len(outcome.stderr) < 1200
    monkeypatch.setenv("KVPLAN_TRACEBACK", "1")
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        invoke(["show", str(path)])


# 2. resources


def test_alias_bomb_is_refused_quickly_and_small(tmp_path: Path) -> None:
    lines = ["format: kvplan.input/1", "metadata:", "  a0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    for level in range(1, 10):
        lines.append(f"  a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    path = _file(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    assert path.stat().st_size < 7000
    outcome = spawn(["plan", str(path)])
    assert_refused(outcome, "KVP012")
    assert_bounded(outcome, "alias bomb")


def test_one_megabyte_document_is_decided_within_bounds(tmp_path: Path) -> None:
    doc = b.llama(4)
    doc["metadata"] = {"values": list(range(120_000))}
    path = _file(tmp_path, "big.json", json.dumps(doc))
    assert path.stat().st_size > 800_000
    outcome = spawn(["validate", str(path)])
    assert outcome.exit_code in (0, 2) and "Traceback" not in outcome.stderr
    assert_bounded(outcome, "1 MB document")


def test_messages_are_bounded() -> None:
    diag = error(Code.SCHEMA, "a" * 10_000, "m" * 100_000, "h" * 100_000)
    assert len(diag.render()) < 1200
    assert show_value(10**5000).startswith("an integer of about")
    assert len(show_value("x" * 10**6)) <= 60
    assert printable("a\x00b\x9bc\u2066") == "a\\x00b\\x9bc\\u2066"


# 3. data safety


def test_plan_refuses_to_overwrite_its_input(tmp_path: Path) -> None:
    path = _file(tmp_path, "in.json", json.dumps(b.llama(4)))
    before = digest(path)
    assert_refused(invoke(["plan", str(path), "-o", str(path)]), "KVP017")
    assert digest(path) == before


def test_dump_is_atomic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kvplan.planner import plan

    target = _file(tmp_path, "plan.yaml", "previous\n")
    result = plan(loading.parse_input(b.llama(4)))

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(KVPlanError) as caught:
        loading.dump(result, target)
    assert caught.value.code is Code.OUTPUT_FAILED
    assert target.read_text() == "previous\n" and len(list(tmp_path.iterdir())) == 1
    monkeypatch.undo()
    loading.dump(result, target)
    assert target.read_text().startswith("format: kvplan.plan/1")


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("d.json", '{"format": "kvplan.input/1",\n  "format": "kvplan.input/1"}', "line 2"),
        ("d.yaml", "format: kvplan.input/1\nmetadata: {a: 1, a: 2}\n", "line 2"),
    ],
)
def test_duplicate_keys_are_kvp011_with_position(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    outcome = invoke(["validate", str(_file(tmp_path, name, text))])
    assert_refused(outcome, "KVP011")
    assert where in outcome.stderr


def test_yaml_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    text = "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\n"
    assert loading.parse_text(text, "m.yaml") == {
        "base": {"x": 1, "y": 2},
        "other": {"x": 3, "y": 2},
    }


# 4. messages that help


def test_locations_hold_no_pydantic_internals(tmp_path: Path) -> None:
    doc = b.llama(4)
    doc["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]["block_stride_alignment"] = "abc"
    outcome = invoke(["validate", str(_file(tmp_path, "a.json", json.dumps(doc)))])
    assert_refused(outcome, "KVP004")
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].count("(got 'abc')") == 1, lines
    assert "constrained-int" not in outcome.stderr and "MultipleOf" not in outcome.stderr
    assert "kv_cache_spec.block_stride_alignment:" in lines[0]


@pytest.mark.parametrize(
    ("content", "code", "text"),
    [
        (b'{"a": "caf\xe9"}', "KVP013", "not UTF-8"),
        (b"", "KVP015", "empty"),
        (b"a: 1\nb: x\x00y\n", "KVP013", "line 2, column 5"),
        ("{}".encode("utf-16"), "KVP013", "UTF-16"),
    ],
)
def test_reading_messages(tmp_path: Path, content: bytes, code: str, text: str) -> None:
    for suffix in (".json", ".yaml"):
        outcome = invoke(["validate", str(_file(tmp_path, "x" + suffix, content))])
        assert_refused(outcome, code)
        assert text in outcome.stderr and "check the path" not in outcome.stderr


def test_utf8_bom_is_accepted_in_json_and_yaml(tmp_path: Path) -> None:
    doc = json.dumps(b.llama(4)).encode()
    for suffix in (".json", ".yaml"):
        path = _file(tmp_path, "bom" + suffix, b"\xef\xbb\xbf" + doc)
        assert invoke(["validate", str(path)]).exit_code == 0


def test_golden_check_reports_a_missing_plan_as_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "golden" / "model"
    folder.mkdir(parents=True)
    (folder / "input.json").write_bytes((GOLDEN / "input.json").read_bytes())
    outcome = invoke(["golden", "check", str(tmp_path / "golden"), "--input-only"])
    assert outcome.exit_code == 2
    assert "KVP002" in outcome.stdout and "plan.json" in outcome.stdout
    update = invoke(["golden", "update", str(tmp_path / "golden"), "--input-only"])
    assert update.exit_code == 0 and (folder / "plan.json").is_file()
    assert invoke(["golden", "check", str(tmp_path / "golden"), "--input-only"]).exit_code == 0


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["plan", "--virtual-capacity", "abc", "x.json"], "--virtual-capacity"),
        (["nosuch"], "kvplan"),
        (["apply", "x.json", "--backend", "nope"], "--backend"),
        (["plan"], "IN"),
    ],
)
def test_usage_errors_are_kvp406(args: list[str], where: str) -> None:
    outcome = spawn(args)
    assert_refused(outcome, "KVP406")
    assert where in outcome.stderr.splitlines()[0]


def test_console_exit_codes_pass_through(tmp_path: Path) -> None:
    one = _file(tmp_path, "a.json", json.dumps(b.llama(4)))
    other = b.llama(4)
    other["kv_cache_config"]["num_blocks"] = 32
    two = _file(tmp_path, "b.json", json.dumps(other))
    assert spawn(["diff", str(one), str(one)]).exit_code == 0
    assert spawn(["diff", str(one), str(two)]).exit_code == 1
    assert spawn(["--help"]).exit_code == 0


def test_at_most_50_diagnostics_are_printed(tmp_path: Path) -> None:
    doc = b.llama(4)
    doc["kv_cache_config"].update({f"unknown_{i}": i for i in range(300)})
    path = _file(tmp_path, "many.json", json.dumps(doc))
    outcome = invoke(["plan", str(path)])
    assert_refused(outcome, "KVP004")
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 51 and "250 more diagnostics" in lines[-1]
    listed = json.loads(invoke(["validate", "--json", str(path)]).stdout)["diagnostics"]
    assert len(listed) == 300
