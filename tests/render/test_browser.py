"""The pages as a reader sees them: rendered by headless Chromium (one page per kind), and laid
out with Chromium's real font metrics to check what the picture says: each sharer arrow ends
inside its target's stripe, no arrow crosses a label, every zoom chip names its layer, no label
spills out of its shape."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.render._browser import drawn_rows, dump_dom, measure, png_rows, screenshot
from harness.render._pictures import (
    gemma_blhnc_plan,
    gemma_plan,
    sharers_into_first_slot_plan,
    small_gemma_plan,
)
from kvplan.render import diff_page, plan_page
from kvplan.render._geometry import short
from tests.render.test_render import names_in


def _render(chromium: str, tmp_path: Path, name: str, page: str) -> tuple[Path, str]:
    html = tmp_path / f"{name}.html"
    html.write_text(page, encoding="utf-8")
    png = tmp_path / f"{name}.png"
    screenshot(chromium, html, png, (1320, 900))
    return png, dump_dom(chromium, html)


def test_the_blank_check_sees_a_blank_page(chromium: str, tmp_path: Path) -> None:
    png, _ = _render(chromium, tmp_path, "blank", "<!DOCTYPE html><html><body></body></html>")
    width, height, _ = png_rows(png)
    assert (width, height) == (1320, 900)
    assert drawn_rows(png) < 0.01


def test_plan_page_renders_and_names_every_pool_layer_and_alias(
    chromium: str, tmp_path: Path
) -> None:
    plan = gemma_plan()
    png, dom = _render(chromium, tmp_path, "plan", plan_page(plan, title="gemma-4-E2B"))
    assert drawn_rows(png) > 0.3
    assert names_in(dom, plan) == []
    assert "<svg" in dom and "sharers (own 0 B)" in dom


def test_diff_page_renders_both_plans(chromium: str, tmp_path: Path) -> None:
    a, b = gemma_plan(), gemma_blhnc_plan()
    png, dom = _render(chromium, tmp_path, "diff", diff_page(a, b, ("LBNHC", "BLHNC")))
    assert drawn_rows(png) > 0.3
    assert names_in(dom, a) == [] and names_in(dom, b) == []
    assert "field-level changes" in dom


# -- geometry, measured in the browser -----------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "gemma": lambda: plan_page(gemma_plan()),
    "gemma-blhnc": lambda: plan_page(gemma_blhnc_plan()),
    "gemma-blhnc-narrow": lambda: plan_page(gemma_blhnc_plan(), width=400),
    "gemma-diff": lambda: diff_page(gemma_plan(), gemma_blhnc_plan()),
    "small-gemma": lambda: plan_page(small_gemma_plan()),
    "sharers-into-L0": lambda: plan_page(sharers_into_first_slot_plan()),
    "sharers-into-L0-narrow": lambda: plan_page(sharers_into_first_slot_plan(), width=560),
}
Box = list[float]


@pytest.fixture(scope="module")
def measured(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("measured")
    out = {}
    for name, page in PAGES.items():
        folder = tmp / name
        folder.mkdir()
        out[name] = measure(chromium, page(), folder)
    return out


def _points(svg: dict[str, Any], d: str, step: float = 1.0) -> list[tuple[float, float]]:
    """Points every ``step`` px along an arrow path (``M x,y V y H x L x,y …``), page pixels."""
    ox, oy = svg["origin"]
    x = y = 0.0
    out: list[tuple[float, float]] = []
    for op, args in re.findall(r"([MVHL])([^MVHL]*)", d):
        numbers = [float(n) for n in args.replace(",", " ").split()]
        nx, ny = (numbers[0], numbers[1]) if op in "ML" else (x, y)
        if op == "V":
            ny = numbers[0]
        if op == "H":
            nx = numbers[0]
        if op != "M":
            n = max(int(max(abs(nx - x), abs(ny - y)) / step), 1)
            out += [(ox + x + (nx - x) * k / n, oy + y + (ny - y) * k / n) for k in range(n + 1)]
        x, y = nx, ny
    return out


def _inside(point: tuple[float, float], box: Box, grow: float = 0.0) -> bool:
    return box[0] - grow <= point[0] <= box[2] + grow and box[1] - grow <= point[1] <= box[3] + grow


def _bands(measured: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [s for s in measured[name]["svgs"] if s["label"].startswith("pool ")]


@pytest.mark.parametrize("name", list(PAGES))
def test_every_arrow_ends_inside_its_targets_stripe(measured: dict[str, Any], name: str) -> None:
    arrows = [a for band in _bands(measured, name) for a in band["arrows"]]
    assert arrows
    for arrow in arrows:
        targets = arrow["title"].split(" → ", 1)[1].removesuffix(" …").split(", ")
        for probe in ("at_tip", "at_head_base"):  # the head's tip and its base
            under = arrow[probe]
            assert under, (name, arrow["d"], probe)
            topmost = under[0]
            assert any(t in topmost for t in targets), (name, arrow["d"], probe, topmost[:80])


@pytest.mark.parametrize("name", list(PAGES))
def test_no_arrow_crosses_a_label(measured: dict[str, Any], name: str) -> None:
    for band in _bands(measured, name):
        labels = [t for t in band["texts"] if "lbl" in t["cls"]]
        for arrow in band["arrows"]:
            points = _points(band, arrow["d"])
            hit = [t["text"] for t in labels if any(_inside(p, t["box"], 2.0) for p in points)]
            assert hit == [], (name, arrow["d"], hit)  # 2 px: the arrow's white halo


@pytest.mark.parametrize("name", list(PAGES))
def test_labels_stay_inside_their_stripes(measured: dict[str, Any], name: str) -> None:
    for svg in measured[name]["svgs"]:
        stripes = [r["box"] for r in svg["rects"] if "stripe" in r["cls"]]
        for text in (t for t in svg["texts"] if "lbl" in t["cls"]):
            box = text["box"]
            mid = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
            home = [s for s in stripes if s[0] <= mid[0] <= s[2] and s[1] <= mid[1] <= s[3]]
            assert home, (name, text["text"])
            assert home[-1][0] - 0.5 <= box[0] and box[2] <= home[-1][2] + 0.5, (name, text)


@pytest.mark.parametrize("name", list(PAGES))
def test_every_zoom_chip_names_its_layer(measured: dict[str, Any], name: str) -> None:
    zooms = [s for s in measured[name]["svgs"] if s["label"].startswith("zoom ")]
    assert zooms
    for svg in zooms:
        texts = [t for t in svg["texts"] if "lbl" in t["cls"]]
        chips = [r for r in svg["rects"] if "stripe" in r["cls"]]
        assert chips
        for chip in chips:
            layer = chip["title"].split("\n")[0].removeprefix("[changed] ")
            box = chip["box"]
            inside = [
                t["text"]
                for t in texts
                if box[0] <= (t["box"][0] + t["box"][2]) / 2 <= box[2]
                and box[1] <= (t["box"][1] + t["box"][3]) / 2 <= box[3]
            ]
            assert any(t.split("·")[0] == short(layer) for t in inside), (name, layer, inside)


def test_the_zoom_has_a_byte_scale_and_block_axis(measured: dict[str, Any]) -> None:
    for name in ("gemma", "gemma-blhnc"):
        (zoom,) = [s for s in measured[name]["svgs"] if s["label"].startswith("zoom ")]
        words = [t["text"] for t in zoom["texts"]]
        assert any(w.endswith("KiB (segments to scale)") for w in words), words
        assert {"b0", "b1", "b2", "b3"} <= set(words)


# -- kvplan top --html: a synthetic snapshot on the real gemma-4-E2B plan -----------------------


def test_top_html_draws_the_mapped_chunks_where_they_are(chromium: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from harness.render._elastic import CHUNK, RUNS, gemma_dump
    from kvplan.cli.app import app

    gemma_dump(tmp_path / "dumps" / "e1")
    out = tmp_path / "top.html"
    res = CliRunner().invoke(
        app, ["top", str(tmp_path / "dumps"), "--html", str(out)], env={"NO_COLOR": "1"}
    )
    assert res.exit_code == 0, res.output
    png = tmp_path / "top.png"
    screenshot(chromium, out, png, (1320, 700))
    assert drawn_rows(png) > 0.2
    got = measure(chromium, out.read_text(), tmp_path)
    (band,) = [s for s in got["svgs"] if s["label"] == "mapped chunks of pool kv_cache"]
    overview = next(r for r in band["rects"] if r["cls"] == "unmapped")["box"]
    pool = 72 << 30
    mapped = [r for r in band["rects"] if r["cls"] in ("mapped", "partly")]
    width = overview[2] - overview[0]
    for first, _ in RUNS["kv_cache"]:  # the overview: each run drawn at its address, to scale
        want = overview[0] + first * CHUNK / pool * width
        assert any(abs(r["box"][0] - want) <= 1.5 for r in mapped if r["box"][1] == overview[1])
    cells = [r for r in mapped if r["title"].startswith("chunk ")]
    chunks = {int(r["title"].split()[1].rstrip(":").replace(",", "")) for r in cells}
    assert chunks == {f + k for f, n in RUNS["kv_cache"] for k in range(n)}  # one cell each
    assert all(r["box"][2] - r["box"][0] >= 2.0 for r in cells)  # visible
    words = " ".join(t["text"] for t in band["texts"])
    for layers in ("L0 L1 L2 L3 L4", "L5 L6 L7 L8 L9", "L10 L11 L12 L13 L14"):
        assert f"{layers} · blocks 0–1,023" in words


def test_a_layer_keeps_its_colour_across_a_diff(chromium: str, tmp_path: Path) -> None:
    """B numbers the same groups the other way round: each layer is drawn with the same
    pattern on both sides (and the legend names the A group)."""
    from harness.render._pictures import gemma_regrouped_plan

    page = diff_page(gemma_plan(), gemma_regrouped_plan())
    assert "<b>g0</b> (A: g4)" in page
    got = measure(chromium, page, tmp_path)
    bands = [s for s in got["svgs"] if s["label"] == "pool kv_cache"]
    assert len(bands) == 2
    sides = []
    for band in bands:
        fills = {}
        for rect in band["rects"]:
            if "stripe" in rect["cls"]:
                fills[rect["title"].split("\n")[0].removeprefix("[changed] ")] = rect["fill"]
        sides.append(fills)
    a, b = sides
    assert len(a) == 15 and a == b
    assert len(set(a.values())) == 5  # five groups, five styles


def test_top_html_draws_the_group_budget_by_member(chromium: str, tmp_path: Path) -> None:
    """A group of two engines: llama borrows 3 MiB of gemma's guarantee, gemma claims it.
    Laid out in Chromium, the group's bars (one scale: the 8 MiB budget) show each member's
    guarantee as half the budget, llama's grant as its guarantee plus a pale borrowed part in
    llama's colour, gemma's 1 MiB grant, and gemma's 3 MiB claim; every label inside its bar."""
    from typer.testing import CliRunner

    from harness.render._elastic import group_of_two
    from kvplan.cli.app import app

    with group_of_two(tmp_path) as (group, dumps):
        out = tmp_path / "top.html"
        res = CliRunner().invoke(
            app, ["top", str(dumps), "--html", str(out)], env={"NO_COLOR": "1"}
        )
        assert res.exit_code == 0, res.output
    png = tmp_path / "top.png"
    screenshot(chromium, out, png, (1320, 900))
    assert drawn_rows(png) > 0.2
    got = measure(chromium, out.read_text(), tmp_path)
    (svg,) = [s for s in got["svgs"] if s["label"].startswith(f"group {group}:")]
    rows = [r for r in svg["rects"] if r["cls"] == "gfree"]
    assert len(rows) == 3  # guaranteed, granted, claimed
    left, right = rows[0]["box"][0], rows[0]["box"][2]
    mib = (right - left) / 8

    def of(cls: str, who: str) -> list[dict[str, Any]]:
        return [r for r in svg["rects"] if r["cls"] == cls and r["title"].startswith(f"{who} ")]

    def width(rect: dict[str, Any]) -> float:
        return float(rect["box"][2] - rect["box"][0])

    (g_llama,), (g_gemma,) = of("guarantee", "llama"), of("guarantee", "gemma")
    assert abs(width(g_llama) - 4 * mib) <= 1.5 and abs(width(g_gemma) - 4 * mib) <= 1.5
    (mine,), (borrowed,) = of("granted", "llama"), of("granted borrowed", "llama")
    assert abs(width(mine) - 4 * mib) <= 1.5 and abs(width(borrowed) - 3 * mib) <= 1.5
    assert borrowed["fill"] == g_llama["fill"] != g_gemma["fill"]  # the borrower's colour
    (gemma_grant,) = of("granted", "gemma")
    assert abs(width(gemma_grant) - mib) <= 1.5
    for row in (
        [g_llama, g_gemma],
        [mine, borrowed, gemma_grant],
    ):  # each row stacked from 0, member after member: 8 MiB, the budget, is full
        boxes = sorted(r["box"] for r in row)
        assert abs(boxes[0][0] - left) <= 1 and abs(boxes[-1][2] - right) <= 1.5
        assert all(abs(a[2] - b[0]) <= 1 for a, b in itertools.pairwise(boxes))
    assert abs(mine["box"][2] - borrowed["box"][0]) <= 1  # the borrowed part follows its own
    (claim,) = of("claim", "gemma")
    assert abs(width(claim) - 3 * mib) <= 1.5
    assert not of("claim", "llama") and not of("granted borrowed", "gemma")
    labels = [t for t in svg["texts"] if t["cls"] == "lbl"]
    assert {t["text"] for t in labels} >= {"llama", "gemma"}
    bars = [r["box"] for r in svg["rects"] if r["cls"] != "gfree"]
    for text in labels:  # every name sits inside a bar of its own
        x0, y0, x1, y1 = text["box"]
        assert any(b[0] <= x0 + 0.5 and x1 <= b[2] + 0.5 and b[1] <= y0 + 2 and y1 <= b[3] + 2
                   for b in bars), text  # fmt: skip
