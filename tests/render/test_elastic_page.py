"""The ``kvplan top --html`` page: a pure function of stats snapshots and plans."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness._stats import make_stats
from harness.render._elastic import RUNS, gemma_dump
from harness.render._pictures import GEMMA
from kvplan.cli.app import app
from kvplan.elastic.files import read_stats_tree
from kvplan.render import EngineView, elastic_page
from kvplan.render.elastic import plan_mismatch, windows
from kvplan.schemas.loading import load_plan
from tests.render.test_render import EXTERNAL

ENV = {"NO_COLOR": "1", "COLUMNS": "200"}


def _view(tmp_path: Path, **changes: object) -> EngineView:
    stats = gemma_dump(tmp_path, **changes)
    return EngineView(
        tmp_path / "rank0.stats.json", stats, "running", 0.4, load_plan(GEMMA / "plan.json")
    )


def test_the_page_says_which_layers_and_blocks_are_mapped(tmp_path: Path) -> None:
    page = elastic_page([_view(tmp_path)], title="dumps")
    assert page.startswith("<!DOCTYPE html>") and EXTERNAL.findall(page) == []
    assert "gemma-e2b · rank 0 · running" in page
    assert "mapped 96.00 MiB in 3 run(s)" in page and "chunks of 2.00 MiB, as the engine" in page
    # each window names the layers whose pages it holds and the blocks: 1024 x 32 KiB pages
    for layers in ("L0 L1 L2 L3 L4", "L5 L6 L7 L8 L9", "L10 L11 L12 L13 L14"):
        assert f"{layers} · blocks 0–1,023" in page
    assert "chunk 12,288: bytes [25,769,803,776, 25,771,900,928) mapped" in page
    assert "floor 1.00 GiB" in page and "asked 24.00 GiB" in page


def test_a_raised_limit_is_explained(tmp_path: Path) -> None:
    page = elastic_page([_view(tmp_path, asked_limit_bytes=1024, limit_bytes=1 << 30)])
    assert "The limit asked, 1.00 KiB (1,024 B), is below this engine" in page
    assert "the limit in force is 1.00 GiB" in page


def test_old_snapshots_say_the_mapping_is_unknown(tmp_path: Path) -> None:
    page = elastic_page([_view(tmp_path, mapped_runs=None)])
    assert "carries no <code>mapped_runs</code>" in page and "mapped: unknown" in page


def test_coarse_runs_are_said_to_be_coarse(tmp_path: Path) -> None:
    page = elastic_page([_view(tmp_path, mapped_runs={"kv_cache": [(0, 2)]}, mapped_runs_unit=8)])
    assert "coarse runs of 16.00 MiB units (8 chunks)" in page and "or less (coarse runs)" in page


def test_plan_mismatch() -> None:
    plan = load_plan(GEMMA / "plan.json")
    good = make_stats(chunk_bytes=2 << 20, num_blocks=plan.source.num_blocks, mapped_runs=RUNS)
    assert plan_mismatch(good, plan) is None
    cases = {
        "fingerprint": good.model_copy(update={"plan_fingerprint": "sha256:0000"}),
        "blocks": good.model_copy(update={"num_blocks": 5}),
        "does not have": good.model_copy(update={"mapped_runs": {"other": [(0, 1)]}}),
        "which has 36,864": good.model_copy(update={"mapped_runs": {"kv_cache": [(36864, 1)]}}),
        "chunk_bytes is 0": good.model_copy(update={"chunk_bytes": 0}),
    }
    for needle, stats in cases.items():
        found = plan_mismatch(stats, plan)
        assert found is not None and needle in found, (needle, found)


def test_windows_cover_every_run_within_the_bound() -> None:
    runs = [(i * 10, 2) for i in range(1000)]
    got = windows(runs, most=6)
    assert len(got) <= 6
    assert all(any(a <= f and f + c <= b for a, b in got) for f, c in runs)
    assert windows([(0, 1), (5, 1)], most=6) == [(0, 1), (5, 6)]


def test_names_are_escaped_and_the_page_is_bounded(tmp_path: Path) -> None:
    views = []
    for rank in range(64):
        stats = make_stats(
            engine='<script>x</script>"',
            rank=rank,
            mapped_runs={"kv_cache": [(2 * k, 1) for k in range(512)]},
        )
        views.append(EngineView(tmp_path / f"rank{rank}.stats.json", stats, "stale", 9.0, None))
    page = elastic_page(views, title="<b>", drawn=16)
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>" not in page
    assert "48 more ranks are in the table but not drawn" in page
    assert page.count("<h2>") == 16 and page.count("<tr><td>&lt;script&gt;") == 64
    assert len(page.encode()) < 1_000_000


# -- kvplan top --html ------------------------------------------------------------------------


def run(*args: str) -> object:
    return CliRunner().invoke(app, list(args), env=ENV)


def test_top_html_writes_the_page_and_prints_the_table(tmp_path: Path) -> None:
    gemma_dump(tmp_path / "e1")
    out = tmp_path / "top.html"
    res = CliRunner().invoke(app, ["top", str(tmp_path), "--html", str(out)], env=ENV)
    assert res.exit_code == 0, res.output
    assert "gemma-e2b" in res.stdout and f"wrote {out}" in res.stderr
    page = out.read_text()
    assert "L5 L6 L7 L8 L9 · blocks 0–1,023" in page
    res = CliRunner().invoke(app, ["top", str(tmp_path), "--html", str(out), "--json"], env=ENV)
    assert res.exit_code == 0 and json.loads(res.stdout)[0]["mapped_runs"] == {
        "kv_cache": [list(r) for r in RUNS["kv_cache"]]
    }


@pytest.mark.parametrize(
    ("spoil", "needle"),
    [
        ("missing", "no plan next to the stats of rank 0"),
        ("broken", "the plan of rank 0 cannot be used: KVP001"),
        ("other", "this plan is not the one rank 0 of gemma-e2b bound"),
    ],
)
def test_top_html_without_a_usable_plan_warns_and_draws_the_figures(
    tmp_path: Path, spoil: str, needle: str
) -> None:
    gemma_dump(tmp_path)
    plan = tmp_path / "rank0.plan.json"
    if spoil == "missing":
        plan.unlink()
    elif spoil == "broken":
        plan.write_text("{")
    else:
        plan.write_text((GEMMA.parent / "google__gemma-3-1b-it" / "plan.json").read_text())
    out = tmp_path / "top.html"
    res = CliRunner().invoke(app, ["top", str(tmp_path), "--html", str(out)], env=ENV)
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith("wrote") or "KVP426 warning" in res.stderr
    assert "KVP426 warning" in res.stderr and needle in res.stderr
    page = out.read_text()
    assert "KVP426" in page and "gemma-e2b · rank 0" in page and "budget" in page
    assert "up close" not in page


def test_top_html_leaves_the_previous_page_when_it_cannot_write(tmp_path: Path) -> None:
    gemma_dump(tmp_path / "e1")
    res = CliRunner().invoke(
        app, ["top", str(tmp_path), "--html", str(tmp_path / "no" / "top.html")], env=ENV
    )
    assert res.exit_code == 2 and res.stderr.startswith("KVP016")
    assert read_stats_tree(tmp_path)  # the stats are untouched
    _ = time


def test_the_group_is_drawn_above_its_engines(tmp_path: Path) -> None:
    """``top --html`` of a group of two: the group's budget by member (guarantees, grants with
    the borrowed part, claims) above the engines' sections, every figure in its table."""
    from harness.render._elastic import GROUP_BUDGET, group_of_two
    from kvplan.elastic.group import read_snapshot

    with group_of_two(tmp_path) as (group, dumps):
        snap = read_snapshot(group)
        out = tmp_path / "top.html"
        res = CliRunner().invoke(app, ["top", str(dumps), "--html", str(out)], env=ENV)
        assert res.exit_code == 0, res.output
    page = out.read_text()
    assert EXTERNAL.findall(page) == []
    heading = page.index(f"<h2>group {group} · 2 member(s)</h2>")
    assert heading < page.index("<h2>gemma · rank 0") and heading < page.index("<h2>llama · rank 0")
    assert f'aria-label="group {group}: budget, guarantees, grants and claims by member"' in page
    members = {m.name: m for m in snap.members}
    llama, gemma = members["llama"], members["gemma"]
    assert llama.borrowed_bytes == 3 << 20 and gemma.claim_bytes == 3 << 20
    assert "llama (alive, x1): borrowed (granted above its guarantee): 3.00 MiB" in page
    assert "gemma (alive, x1): claims 3.00 MiB (3,145,728 B) below its guarantee" in page
    for m in (llama, gemma):
        assert f"{m.name} (alive, x1): guarantee 4.00 MiB (4,194,304 B)" in page
    assert f"budget: 8.00 MiB ({GROUP_BUDGET:,} B)" in page
    assert "group budget 8.00 MiB" in page


def test_a_closed_engines_picture_says_what_it_is(tmp_path: Path) -> None:
    page = elastic_page([_view(tmp_path, state="closed", mapped_runs=None)])
    assert "This is the engine's closing snapshot" in page
    assert "older kvplan" not in page
