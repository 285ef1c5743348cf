"""Every legacy plan applies on the host-vmm and torch backends and passes ``verify``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvplan.executor import apply, verify
from kvplan.planner.legacy import build_legacy_plan, plan_legacy
from kvplan.schemas.plan import BindingPlan
from tests.planner.legacy._helpers import FIXTURES, STRATEGIES, load


def _plans() -> list[tuple[str, BindingPlan]]:
    out = []
    for name in FIXTURES:
        for strategy, layout in STRATEGIES:
            plan, _ = build_legacy_plan(load(name), strategy=strategy, pool_layout=layout)  # type: ignore[arg-type]
            if plan is not None:
                out.append((f"{name}/{plan.source.layout}", plan))
    return out


PLANS = _plans()


def test_plans_exist_for_every_strategy_of_the_gemma4_fixture() -> None:
    ids = {i for i, _ in PLANS}
    for layout in (
        "vanilla/NHD",
        "kvcached/noncontiguous",
        "kvcached/contiguous",
        "kvcached/per-layer",
    ):
        assert f"gemma-4-e2b/{layout}" in ids
    # 8 vanilla + 6 + 5 + 5 kvcached (HND and no-HMA refused; bs128 contiguous refused;
    # per-layer refuses the Mamba hybrid)
    assert len(PLANS) == 24


@pytest.mark.parametrize("backend", ["host-vmm", "torch"])
@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=[i for i, _ in PLANS])
def test_apply_and_verify(plan: BindingPlan, backend: str) -> None:
    options: dict[str, Any] = {"device": "cpu"} if backend == "torch" else {}
    bound = apply(plan, backend=backend, **options)
    try:
        assert verify(plan, bound.tensors, pools=bound.pools) == []
        for alias in plan.aliases:
            assert bound.tensors[alias.layer] is bound.tensors[alias.target]
    finally:
        bound.close()


def test_gemma4_sharers_read_their_targets_cache() -> None:
    plan = plan_legacy(load("gemma-4-e2b"), strategy="kvcached", pool_layout="contiguous")
    bound = apply(plan, backend="host-vmm")
    try:
        name = "language_model.model.layers.{}.self_attn.attn".format
        bound.tensors[name(13)][5, 1].fill_(3.0)
        assert torch.all(bound.tensors[name(33)][5, 1] == 3.0)  # 33 shares 13 (sliding)
        assert bound.tensors[name(34)] is bound.tensors[name(14)]  # full
        # block 5 of pool 1 as group 0 (sliding) and as group 4 (full) is the same memory
        sliding, full = bound.tensors[name(5)], bound.tensors[name(9)]
        sliding[5].fill_(0)
        full[5].fill_(7.0)
        assert torch.all(sliding[5] == 7.0) and torch.all(sliding[6] == 0)
    finally:
        bound.close()
