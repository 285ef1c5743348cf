"""The plans the picture tests draw, and the docs images (``python -m tests.render._pictures``).

    PYTHONPATH=src python -m tests.render._pictures docs/img

writes ``gemma-4-E2B.png`` (the golden gemma-4-E2B plan) and ``gemma-4-E2B-LBNHC-vs-BLHNC.png``
(that plan against the plan of the same input with the layout changed to BLHNC and the tensor
placed as vLLM places block-outermost layouts), both made by headless Chromium.
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
GEMMA = ROOT / "examples" / "golden" / "google__gemma-4-E2B-it"


def gemma_plan() -> BindingPlan:
    return load_plan(GEMMA / "plan.json")


def with_layout(document: dict[str, Any], layout: str) -> dict[str, Any]:
    """``document`` with ``kv_cache_layout`` changed and each tensor placed as vLLM places it.

    Layer-outermost layouts: ``layer_stride = page × num_blocks``, ``block_stride = page``;
    block-outermost: ``layer_stride = page``, ``block_stride = page × layers`` (see
    ``tests/_builders.py``). The page is taken from the document's own placement.
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


def main(out: Path) -> None:
    from tests.render._browser import ensure_chromium, screenshot

    chromium = ensure_chromium()
    out.mkdir(parents=True, exist_ok=True)
    pages = {
        "gemma-4-E2B": (gemma_page(), (1320, 900)),
        "gemma-4-E2B-LBNHC-vs-BLHNC": (layout_diff_page(), (1400, 1240)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, (html, size) in pages.items():
            page = Path(tmp) / f"{name}.html"
            page.write_text(html, encoding="utf-8")
            screenshot(chromium, page, out / f"{name}.png", size)
            print(f"wrote {out / name}.png ({len(html.encode()):,} B of HTML)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
