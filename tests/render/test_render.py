"""The picture of a binding: what the pages show, that they are self-contained, small, escaped."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest

import kvplan
from harness import _builders as b
from harness.render._pictures import ROOT, gemma_blhnc_plan, gemma_plan
from kvplan.render import diff_page, drift_page, plan_page
from kvplan.render._geometry import block_runs, extent, interleaved, is_padded, memory, zoom
from kvplan.schemas.canonical import to_data
from kvplan.schemas.loading import parse_input, parse_plan
from kvplan.schemas.plan import BindingPlan

EXTERNAL = re.compile(
    r"https?:|//|<script|@import|\bsrc\s*=|\bhref\s*=|url\(\s*(?!#)", re.IGNORECASE
)


def plan_of(document: dict[str, Any]) -> BindingPlan:
    return kvplan.plan(parse_input(document))


def big(num_layers: int = 1024, num_groups: int = 6, layout: str = "LBNHC") -> BindingPlan:
    """The planner benchmark's large config: N layers round-robin into G groups, one pool."""
    names = [b.name(i) for i in range(num_layers)]
    groups = [
        (names[g::num_groups], b.attn_spec(heads=8, head_size=128)) for g in range(num_groups)
    ]
    return plan_of(b.document(groups, num_blocks=4096, layout=layout))


def names_in(page: str, plan: BindingPlan) -> list[str]:
    """Every pool, tensor-backed layer and alias of ``plan`` that ``page`` does not name."""
    wanted = [p.name for p in plan.pools] + plan.layers
    return [name for name in wanted if html.escape(name, quote=True) not in page]


def test_gemma_page_names_everything_and_is_small() -> None:
    plan = gemma_plan()
    page = plan_page(plan, title="gemma")
    assert names_in(page, plan) == []
    assert len(page.encode()) < 200_000
    # the overlay: five group rows on one band, sharers drawn as owning no bytes
    for gid in range(5):
        assert f">g{gid} " in page
    assert "sharers (own 0 B)" in page
    assert page.count('class="chip"><title>') == len(plan.aliases)
    assert page.count('marker-end="url(#arrow)"') == 2  # one bus per target: L13 and L14
    # the memory summary (what `kvplan inspect` prints for the same model)
    assert "18,432 B" in page and "24,576 B per token (57%)" in page


@pytest.mark.parametrize("kind", ["plan", "diff", "drift"])
def test_pages_reference_nothing_external(kind: str) -> None:
    a, b_ = gemma_plan(), gemma_blhnc_plan()
    page = {
        "plan": lambda: plan_page(a),
        "diff": lambda: diff_page(a, b_),
        "drift": lambda: drift_page("m", a, b_, input_changed=True),
    }[kind]()
    assert page.startswith("<!DOCTYPE html>")
    assert EXTERNAL.findall(page) == []
    assert "<script" not in page and "<link" not in page and "<img" not in page


def test_names_from_the_plan_are_escaped() -> None:
    text = json.dumps(to_data(gemma_plan()))
    text = text.replace("language_model.model.layers.1.", "<script>alert(1)</script>.layers.1.")
    text = text.replace('"kv_cache"', json.dumps('"><img src=x onerror=alert(2)>'))
    hostile = parse_plan(json.loads(text))
    for page in (plan_page(hostile, title="<b>t</b>"), diff_page(gemma_plan(), hostile)):
        assert "<script" not in page and "<img" not in page and "<b>t" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert names_in(page, hostile) == []


def test_layer_outermost_zoom_has_a_segment_per_layer_slot() -> None:
    plan = gemma_plan()
    z = zoom(list(plan.views), blocks=4)
    assert [s.start for s in z.segments] == [0, 24 << 30, 48 << 30]
    first = z.segments[0]
    assert first.end == 4 * 32768  # four 32 KiB pages of layers 0..4 (one per group)
    assert {c.view.layer.split(".")[3] for c in first.chunks} == {"0", "1", "2", "3", "4"}
    assert not interleaved([v for v in plan.views if v.group == 0])


def test_block_outermost_zoom_interleaves_the_layers_of_a_group() -> None:
    plan = gemma_blhnc_plan()
    group0 = [v for v in plan.views if v.group == 0]
    assert interleaved(group0)
    z = zoom(group0, blocks=2)
    assert len(z.segments) == 1
    order = [(c.view.layer.split(".")[3], c.block) for c in z.segments[0].chunks]
    assert order == [("0", 0), ("5", 0), ("10", 0), ("0", 1), ("5", 1), ("10", 1)]
    page = plan_page(plan)
    assert "interleaved block by block" in page and "L5·b1" in page


def test_padded_pages_are_shown_as_padding() -> None:
    plan = plan_of(b.mamba_hybrid())
    mamba = [v for v in plan.views if "Mamba" in v.kind]
    assert mamba and all(is_padded(v) for v in mamba)
    segment = zoom(mamba[:1], blocks=2).segments[0]
    page_bytes = mamba[0].stride[0] * mamba[0].itemsize
    assert segment.end - segment.start == 2 * page_bytes  # the trailing pad is kept
    assert "padded to" in plan_page(plan)


def test_heads_outside_blocks_give_one_run_per_head() -> None:
    doc = b.llama(4, num_blocks=64, layout="LHBNC")  # placed as in tests/planner/test_planner.py
    doc["kv_cache_config"]["kv_cache_tensors"][0].update(layer_stride=262144, block_stride=2048)
    view = plan_of(doc).views[0]
    runs = block_runs(view)
    assert runs == [(0, 2048), (131072, 133120)]  # head 1 lives 64 blocks further on
    assert len(zoom([view], blocks=2).segments) == 2


def test_memory_summary_matches_the_plan() -> None:
    m = memory(gemma_plan())
    assert (m.per_token, m.shared_per_token) == (18432.0, 24576.0)
    assert m.saved_bytes == gemma_plan().summary.alias_saved_bytes


def test_diff_marks_changed_views_and_lists_fields() -> None:
    a, b_ = gemma_plan(), gemma_blhnc_plan()
    page = diff_page(a, b_, ("LBNHC", "BLHNC"))
    assert "26 change(s)" in page
    assert "ΔL5" in page and ">offset_bytes<" in page and ">layout<" in page
    assert "stripe marked" in page
    same = diff_page(a, a)
    assert "identical plans" in same and "stripe marked" not in same


def test_added_and_removed_aliases_are_marked_on_their_side() -> None:
    a = gemma_plan()
    dropped = a.model_copy(update={"aliases": a.aliases[1:]})
    page = diff_page(a, dropped)
    sharer = "language_model.model.layers.15.self_attn.attn"
    assert f"[removed] {sharer}" in page  # hover text of its chip
    assert f"<span class='mark'>−</span> {sharer}" in page  # the A side's aliases table
    assert f"+</span> {sharer}" not in page
    wide = diff_page(a, dropped, width=1000)  # wide enough for one chip per sharer
    assert "−L15</text>" in wide


def test_drift_page_without_a_stored_plan_draws_the_new_plan() -> None:
    page = drift_page("m", None, gemma_plan())
    assert "no stored plan.json" in page and "field-level" not in page


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC"])
def test_a_1024_layer_page_stays_under_2_mb(layout: str) -> None:
    plan = big(layout=layout)
    page = plan_page(plan)
    assert len(page.encode()) < 2_000_000
    assert names_in(page, plan) == []
    assert "more address segment" in page or "interleaved" in page  # summarised, not drawn


def test_many_sharers_are_counted_per_stripe() -> None:
    shared = {b.name(i): b.name(i - 256) for i in range(256, 512)}
    plan = plan_of(
        b.document([([b.name(i) for i in range(256)], b.attn_spec())], num_blocks=8, shared=shared)
    )
    page = plan_page(plan)
    assert names_in(page, plan) == []
    assert 'class="chip"' in page and " sharers</text>" in page
    assert len(page.encode()) < 1_000_000


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC"])
def test_memoised_extent_is_the_views_byte_extent(layout: str) -> None:
    plans = [big(64, 2, layout), plan_of(b.mamba_hybrid()), plan_of(b.mla())]
    assert all(extent(v) == v.byte_extent for p in plans for v in p.views)


def test_a_legacy_plan_draws_without_a_per_token_figure() -> None:
    from kvplan.planner.legacy import build_legacy_plan
    from kvplan.schemas.legacy import LegacyInputDocument
    from kvplan.schemas.loading import load_any

    legacy = load_any(ROOT / "tests" / "data" / "legacy" / "llama-3.1-8b.json")
    assert isinstance(legacy, LegacyInputDocument)
    plan, _ = build_legacy_plan(legacy, strategy="kvcached")
    assert plan is not None and memory(plan).per_token is None
    page = plan_page(plan)
    assert "not derivable from this plan" in page and names_in(page, plan) == []
    assert "more pools are not drawn" in page and "first 2 pools are zoomed" in page


def test_every_group_style_is_distinct_without_colour() -> None:
    from kvplan.render._svg import STYLES, style

    styles = [style(g) for g in range(STYLES)]
    assert len(set(styles)) == STYLES == 49
    assert style(7)[1] != style(0)[1]  # g7 shares g0's colour, not its hatching


def test_render_imports_neither_torch_nor_vllm() -> None:
    import subprocess
    import sys

    code = "import sys, kvplan.render; print(sorted({'torch', 'vllm'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_the_axis_marks_the_layer_slots() -> None:
    page = plan_page(gemma_plan())
    for label in (">0 B<", ">24.00 GiB<", ">48.00 GiB<", ">72.00 GiB<"):
        assert label in page


def test_the_page_gives_the_block_size_in_tokens() -> None:
    page = plan_page(gemma_plan())
    # vLLM unifies the page size: the full-attention group's blocks hold half as many tokens
    assert "16 tokens (g4); 32 tokens (g0, g1, g2, g3) per block" in page
    assert "g4</b> FullAttention · 3 view(s) · 16 tokens per block" in page
    llama = plan_of(b.llama(4, num_blocks=64))
    assert "16 tokens per block" in plan_page(llama)


def test_a_saving_above_the_pool_says_why() -> None:
    from harness.render._pictures import small_gemma_plan

    page = plan_page(small_gemma_plan())  # 768 MiB pool, sharing "saves" 5.00 GiB
    assert "5.00 GiB" in page and "768.00 MiB" in page
    assert (
        "Why KV sharing saves more than the pool holds: 20 sharers × a 32.00 KiB page × "
        "8,192 blocks is what the sharers would need on their own, while vLLM overlays the 5 "
        "groups on the same 768.00 MiB"
    ) in page
    assert "Why KV sharing saves" not in plan_page(plan_of(b.llama(4, num_blocks=64)))


def test_styles_follow_the_layers_across_plans() -> None:
    from harness.render._pictures import gemma_regrouped_plan
    from kvplan.render._palette import palette

    a, regrouped = gemma_plan(), gemma_regrouped_plan()
    (alone,) = palette(a)
    assert alone == {g: g for g in range(5)}
    sa, sb = palette(a, regrouped)
    layer_style_a = {v.layer: sa[v.group] for v in a.views}
    layer_style_b = {v.layer: sb[v.group] for v in regrouped.views}
    assert layer_style_a == layer_style_b
    # a group of B sharing no layer with A takes a style no group of A has
    extra = plan_of(b.document([([b.name(i) for i in range(90, 92)], b.attn_spec())], num_blocks=8))
    sa, sx = palette(a, extra)
    assert set(sx.values()).isdisjoint(sa.values())


def test_the_drawing_of_a_10000_layer_plan_is_bounded() -> None:
    """The SVG does not grow with the layers (the tables do, one row each)."""
    sizes = []
    for n in (1000, 10000):
        page = plan_page(big(n, 6))
        svg = sum(len(m) for m in re.findall(r"<svg.*?</svg>", page, re.DOTALL))
        sizes.append(svg)
    assert sizes[1] < 2 * sizes[0] < 600_000, sizes


def test_control_and_bidi_characters_in_names_are_shown_not_obeyed() -> None:
    text = json.dumps(to_data(gemma_plan()))
    text = text.replace("language_model.model.layers.1.", "\\u001b[31m\\u202elayers.1.")
    hostile = parse_plan(json.loads(text))
    for page in (plan_page(hostile), diff_page(gemma_plan(), hostile)):
        assert "\x1b" not in page and "\u202e" not in page
        assert "\\x1b[31m\\u202elayers.1." in page
