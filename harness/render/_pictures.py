"""The plans the picture tests draw, and the docs images (``python -m harness.render._pictures``).

    PYTHONPATH=src python -m harness.render._pictures docs/img

writes ``gemma-4-E2B.png`` (vLLM 0.33's golden gemma-4-E2B plan, kept in ``tests/data``),
``gemma-4-E2B-LBNHC-vs-BLHNC.png``
(that plan against the plan of the same input with the layout changed to BLHNC and the tensor
placed as vLLM places block-outermost layouts) and ``kvplan-top-gemma-4-E2B.png`` (what
``kvplan top --html`` draws for a synthetic snapshot of an elastic engine serving that plan),
all made by headless Chromium.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvplan import plan as make_plan
from kvplan.render import diff_page, plan_page
from kvplan.schemas.loading import load_plan, parse_input
from kvplan.schemas.plan import BindingPlan

ROOT = Path(__file__).resolve().parents[2]
GEMMA = ROOT / "tests" / "data" / "golden-vllm-0.33" / "google__gemma-4-E2B-it"
"""The gemma-4-E2B plan the pictures are drawn and tested on: vLLM 0.33's golden plan, kept
fixed (``examples/golden`` follows the installed vLLM; a picture test should not)."""


def gemma_plan() -> BindingPlan:
    return load_plan(GEMMA / "plan.json")


def with_layout(document: dict[str, Any], layout: str) -> dict[str, Any]:
    """``document`` with ``kv_cache_layout`` changed and each tensor placed as vLLM places it.

    Layer-outermost layouts: ``layer_stride = page × num_blocks``, ``block_stride = page``;
    block-outermost: ``layer_stride = page``, ``block_stride = page × layers`` (see
    ``harness/_builders.py``). The page is taken from the document's own placement.
    """
    out = copy.deepcopy(document)
    config = out["kv_cache_config"]
    config["kv_cache_layout"] = layout
    block_outermost = layout.startswith("B")
    for tensor in config["kv_cache_tensors"]:
        old_block_outermost = tensor["layer_stride"] < tensor["block_stride"]
        page = tensor["layer_stride"] if old_block_outermost else tensor["block_stride"]
        layers = len(tensor["layers"])
        if block_outermost:
            tensor["layer_stride"], tensor["block_stride"] = page, page * layers
        else:
            tensor["layer_stride"], tensor["block_stride"] = page * config["num_blocks"], page
    return out


def gemma_input() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GEMMA / "input.json").read_text())
    return data


def with_blocks(document: dict[str, Any], num_blocks: int) -> dict[str, Any]:
    """``document`` (layer-outermost) with ``num_blocks`` blocks, each tensor resized to it."""
    out = copy.deepcopy(document)
    config = out["kv_cache_config"]
    config["num_blocks"] = num_blocks
    for tensor in config["kv_cache_tensors"]:
        page = tensor["block_stride"]
        tensor["layer_stride"] = page * num_blocks
        tensor["size"] = page * num_blocks * len(tensor["layers"])
    return out


def with_sharers_into(document: dict[str, Any], targets: dict[str, str]) -> dict[str, Any]:
    """``document`` with every sharer of ``old`` target bound to ``targets[old]`` instead."""
    out = copy.deepcopy(document)
    shared = out["shared_kv_cache_layers"]
    for sharer, target in shared.items():
        shared[sharer] = targets.get(target, target)
    return out


def gemma_layer(i: int) -> str:
    return f"language_model.model.layers.{i}.self_attn.attn"


def small_gemma_plan() -> BindingPlan:
    """The golden gemma-4-E2B input at 8,192 blocks (a 768 MiB pool, as on a small machine)."""
    return make_plan(parse_input(with_blocks(gemma_input(), 8192), "gemma-4-E2B 8192 blocks"))


def sharers_into_first_slot_plan() -> BindingPlan:
    """gemma-4-E2B with its sharers reading L0 and L4 (the first slot): the arrow into L0 runs
    up through the rows of L1…L4, whose labels sit in the same slot."""
    doc = with_sharers_into(
        gemma_input(), {gemma_layer(13): gemma_layer(0), gemma_layer(14): gemma_layer(4)}
    )
    return make_plan(parse_input(doc, "gemma-4-E2B sharers into L0 and L4"))


def gemma_regrouped_plan() -> BindingPlan:
    """The golden gemma-4-E2B input with its KV cache groups listed in reverse: the same
    layers, every group renumbered (g0 is the full-attention group)."""
    doc = gemma_input()
    doc["kv_cache_config"]["kv_cache_groups"].reverse()
    doc["kernel_block_sizes"].reverse()
    return make_plan(parse_input(doc, "gemma-4-E2B, groups reversed"))


def gemma_blhnc_plan() -> BindingPlan:
    document = json.loads((GEMMA / "input.json").read_text())
    return make_plan(parse_input(with_layout(document, "BLHNC"), "gemma-4-E2B BLHNC"))


def gemma_page() -> str:
    return plan_page(gemma_plan(), title="google/gemma-4-E2B-it (vLLM 0.33, 80 GiB GPU)")


def layout_diff_page() -> str:
    return diff_page(
        gemma_plan(),
        gemma_blhnc_plan(),
        ("gemma-4-E2B, layout LBNHC (golden plan)", "same input, layout BLHNC"),
        title="gemma-4-E2B: LBNHC vs BLHNC",
    )


def top_page(directory: Path) -> str:
    """``kvplan top --html`` for the synthetic gemma-4-E2B engine of ``harness.render._elastic``."""
    from harness.render._elastic import gemma_dump
    from kvplan.render import EngineView, elastic_page

    stats = gemma_dump(directory / "gemma-e2b")
    shown = Path("dumps", "gemma-e2b", "rank0.stats.json")  # as the user names it, not tmp
    view = EngineView(shown, stats, "running", 0.8, gemma_plan())
    return elastic_page([view], title="dumps/", now=stats.time)


def main(out: Path) -> None:
    from harness.render._browser import ensure_chromium, screenshot

    chromium = ensure_chromium()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as dumps:
        top = top_page(Path(dumps))
    pages = {
        "gemma-4-E2B": (gemma_page(), (1320, 1000)),
        "gemma-4-E2B-LBNHC-vs-BLHNC": (layout_diff_page(), (1400, 1300)),
        "kvplan-top-gemma-4-E2B": (top, (1320, 640)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, (html, size) in pages.items():
            page = Path(tmp) / f"{name}.html"
            page.write_text(html, encoding="utf-8")
            screenshot(chromium, page, out / f"{name}.png", size)
            print(f"wrote {out / name}.png ({len(html.encode()):,} B of HTML)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
