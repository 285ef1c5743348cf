"""kvcached 0.1.6's own binding of the legacy fixtures, as recorded by
``tools/make_kvcached_fixtures.py`` (its real patches on vLLM 0.24.0's runner classes, only the
compiled VMM module stubbed), and kvplan's plans in the same form for comparison."""

from __future__ import annotations

import json
from typing import Any

from kvplan.schemas.plan import BindingPlan
from tests.planner.legacy._helpers import ROOT

RECORDED = ROOT / "tests" / "data" / "kvcached"
KVCACHED_VERSION = "0.1.6"
VLLM_VERSION = "0.24.0"


def recording(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / f"{name}.json").read_text())
    return data


def layout_of(name: str, layout: str) -> dict[str, Any]:
    """``{"scheduler": ElasticBlockPool's arguments, "worker": views or error}``."""
    recorded: dict[str, Any] = recording(name)["layouts"][layout]
    return recorded


def pool_index(pool: str) -> int:
    return 0 if pool == "kv_contiguous" else int(pool.removeprefix("kv_"))


def geometry(view: Any) -> dict[str, Any]:
    return {
        "dtype": view.dtype,
        "shape": view.shape,
        "stride": view.stride,
        "offset_bytes": view.offset_bytes,
    }


def plan_views(plan: BindingPlan) -> dict[str, dict[str, Any]]:
    """kvplan's views in the recording's form (pool index, no alias entries)."""
    return {v.layer: {"pool": pool_index(v.pool), **geometry(v)} for v in plan.views}
