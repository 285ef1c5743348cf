"""The pages as a reader sees them: rendered by headless Chromium (one page per kind)."""

from __future__ import annotations

from pathlib import Path

from kvplan.render import diff_page, plan_page
from tests.render._browser import drawn_rows, dump_dom, png_rows, screenshot
from tests.render._pictures import gemma_blhnc_plan, gemma_plan
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
