"""Generated hostile stats snapshots (and plans beside them) for ``kvplan top`` and ``kvplan
limit``: every field of a full snapshot (new fields included, so a field added later is covered
too) mutated, each decided with no traceback and nothing raw on any stream; the page that
``top --html`` writes escapes what it shows. One worst case runs as a child, bounded."""

from __future__ import annotations

import copy
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness._stats import make_stats
from harness.render._pictures import GEMMA
from kvplan.elastic.files import ElasticStats
from tests.hostile._harness import CODE_LINE, Outcome, assert_bounded, invoke, spawn

SEED = 20261201
HOSTILE_TEXT = ["[/]", "[bold red]x[/]", "\x1b[31mred\x1b[0m", "\u202eevil", "<script>x</script>"]


def _full() -> dict[str, Any]:
    """A valid snapshot with every optional field set."""
    stats = make_stats(
        host="node",
        pid_namespace="pid:[1]",
        floor_bytes=1 << 30,
        asked_limit_bytes=1 << 20,
        plan_fingerprint="sha256:" + "0" * 64,
        mapped_runs={"kv_cache": [(0, 4), (12288, 4)]},
        chunk_bytes=2 << 20,
        num_blocks=786432,
    )
    return stats.model_dump(mode="json")


def _cases() -> list[tuple[str, bytes]]:
    rng = random.Random(SEED)
    doc = _full()
    out: list[tuple[str, bytes]] = []
    for key in doc:
        if key in ("kind", "version"):
            continue
        for family in ("type", "huge", "negative", "nested", "text", "null"):
            mutated = copy.deepcopy(doc)
            if family == "type":
                mutated[key] = rng.choice(["abc", {"x": [1]}, 12.5, [1, 2], True])
            elif family == "huge":
                mutated[key] = 10 ** rng.choice([19, 30, 400])
            elif family == "negative":
                mutated[key] = -rng.choice([1, 4096, 2**40])
            elif family == "nested":
                value: Any = 0
                for level in range(rng.choice([70, 500])):
                    value = [value] if level % 2 else {"d": value}
                mutated[key] = value
            elif family == "text":
                mutated[key] = rng.choice(HOSTILE_TEXT) * rng.choice([1, 200])
            else:
                mutated[key] = None
            out.append((f"{key}-{family}", json.dumps(mutated).encode()))
    runs = [
        {"kv_cache": [[i * 2, 1] for i in range(600)]},
        {"kv_cache": [[2**62, 1]]},
        {"kv_cache": [[0, 2**62]]},
        {"kv_cache": [[4, 1], [0, 1]]},
        {rng.choice(HOSTILE_TEXT): [[0, 1]]},
        {"kv_cache": [[0, 1]] * 3},
        {"kv_cache": "0-1"},
        {"kv_cache": [[36864, 1]]},  # past the golden plan's last chunk: a plan mismatch
    ]
    for i, value in enumerate(runs):
        mutated = copy.deepcopy(doc)
        mutated["mapped_runs"] = value
        out.append((f"mapped_runs-{i}", json.dumps(mutated).encode()))
    text = json.dumps(doc)
    out.append(("truncated", text[: len(text) // 2].encode()))
    out.append(("duplicate-key", text.replace('"rank": 0', '"rank": 0, "rank": 1').encode()))
    return out


CASES = _cases()


def _check(outcome: Outcome, what: str, ok: tuple[int, ...] = (0, 2)) -> None:
    assert outcome.exit_code in ok, f"{what}: exit {outcome.exit_code}: {outcome.stderr[:400]}"
    for text in (outcome.stdout, outcome.stderr):
        assert "Traceback" not in text and "KVP019" not in text, f"{what}: {text[:400]}"
        assert "\x1b" not in text and "\u202e" not in text, f"{what}: a raw escape"
    if outcome.exit_code == 2:
        first = outcome.stderr.strip().splitlines()[0]
        assert CODE_LINE.match(first), f"{what}: {first[:200]}"


def test_every_field_is_mutated() -> None:
    fields = {name.rsplit("-", 1)[0] for name, _ in CASES}
    assert set(ElasticStats.model_fields) - {"kind", "version"} <= fields
    assert len(CASES) >= 150


@pytest.mark.parametrize("index", range(len(CASES)), ids=[name for name, _ in CASES])
def test_hostile_snapshot_is_decided(tmp_path: Path, index: int) -> None:
    name, data = CASES[index]
    (tmp_path / "rank0.stats.json").write_bytes(data)
    shutil.copyfile(GEMMA / "plan.json", tmp_path / "rank0.plan.json")
    env = {"NO_COLOR": "1", "COLUMNS": "100"}
    page = tmp_path / "top.html"
    json_out = invoke(["top", str(tmp_path), "--json"], env=env)
    _check(json_out, f"{name} --json")
    json.loads(json_out.stdout)  # always a JSON list, even of nothing
    _check(invoke(["top", str(tmp_path), "--once"], env=env), f"{name} --once")
    shown = invoke(["top", str(tmp_path), "--html", str(page)], env=env)
    _check(shown, f"{name} --html")
    if shown.exit_code == 0:
        html = page.read_text()
        assert "<script>" not in html and "\x1b" not in html and "\u202e" not in html, name
    limited = invoke(["limit", str(tmp_path), "1KiB"], env=env)
    _check(limited, f"{name} limit", ok=(0, 1, 2))
    # an unreadable snapshot is no engine: nothing would read a limit.json (KVP429)
    assert limited.exit_code < 2 or limited.stderr.startswith("KVP429"), name
    assert (tmp_path / "limit.json").exists() == (limited.exit_code < 2), name
    assert (tmp_path / "rank0.stats.json").read_bytes() == data  # read, never rewritten


@pytest.mark.parametrize(
    "plan",
    [
        b"{",
        json.dumps({"format": "kvplan.plan/1"}).encode(),
        (GEMMA / "input.json").read_bytes(),  # an input document where the plan should be
        (GEMMA / "plan.json").read_text().replace('"kv_cache"', json.dumps("<img src=x>")).encode(),
    ],
    ids=["truncated", "empty-plan", "an-input", "hostile-pool-name"],
)
def test_a_hostile_plan_beside_the_stats_is_a_warning(tmp_path: Path, plan: bytes) -> None:
    stats = make_stats(chunk_bytes=2 << 20, num_blocks=786432, mapped_runs={"kv_cache": [(0, 1)]})
    (tmp_path / "rank0.stats.json").write_text(stats.model_dump_json())
    (tmp_path / "rank0.plan.json").write_bytes(plan)
    page = tmp_path / "top.html"
    outcome = invoke(["top", str(tmp_path), "--html", str(page)], env={"NO_COLOR": "1"})
    _check(outcome, "plan", ok=(0,))
    html = page.read_text()
    assert "<img" not in html and "<script" not in html


def test_the_worst_case_in_a_child_is_bounded(tmp_path: Path) -> None:
    """The most runs a snapshot may hold, on the largest golden plan, for 16 drawn ranks."""
    runs = {"kv_cache": [(2 * k, 1) for k in range(512)]}
    for rank in range(16):
        stats = make_stats(
            rank=rank, chunk_bytes=2 << 20, num_blocks=786432, mapped_runs=runs, time=1e9
        )
        (tmp_path / f"rank{rank}.stats.json").write_text(stats.model_dump_json())
        shutil.copyfile(GEMMA / "plan.json", tmp_path / f"rank{rank}.plan.json")
    outcome = spawn(["top", str(tmp_path), "--html", str(tmp_path / "top.html")])
    _check(outcome, "worst case", ok=(0,))
    assert_bounded(outcome, "top --html")
    assert (tmp_path / "top.html").stat().st_size < 4_000_000
