"""Hypothesis: generated vLLM-shaped configs always plan cleanly; corruptions never crash."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvplan
from harness import _builders as b
from kvplan.planner import build_plan
from kvplan.schemas import KVPlanError
from kvplan.schemas.loading import parse_input, parse_text

LAYOUTS = ["LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"]


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """One to six same-page groups in any layout, optional padding, optional sharing."""
    layout = draw(st.sampled_from(LAYOUTS))
    n_groups = draw(st.integers(1, 6))
    layers_per_group = draw(st.integers(1, 5))
    heads = draw(st.sampled_from([1, 2, 4]))
    head = draw(st.sampled_from([16, 32, 64]))
    block = draw(st.sampled_from([16, 32]))
    num_blocks = draw(st.integers(1, 40))
    dtype = draw(st.sampled_from(["bfloat16", "float16", "uint8", "float32"]))
    pad = draw(st.booleans()) and layout in ("LBHNC", "LBNHC", "BLHNC", "BLNHC")
    spec: dict[str, Any] = b.attn_spec(block_size=block, heads=heads, head_size=head, dtype=dtype)
    page = b.page_bytes(spec)
    if pad:
        spec["page_size_padded"] = page + 256 * draw(st.integers(1, 4))
        page = spec["page_size_padded"]
    names = [[f"g{g}.l{i}.attn" for i in range(layers_per_group)] for g in range(n_groups)]
    # placement as vLLM's get_kv_cache_config_from_groups (single spec per group)
    H, N, C = heads, block, b.page_bytes({**spec, "page_size_padded": None}) // (heads * block)
    L, B = layers_per_group, num_blocks
    dense = {"C": 1, "N": C, "H": N * C}
    if layout in ("LBHNC", "BLHNC"):
        inner = H * N * C
    elif layout in ("LBNHC", "BLNHC"):
        inner = N * H * C
    else:
        inner = None
    if layout in ("LBHNC", "LBNHC"):
        bs, ls = page, page * B
    elif layout in ("BLHNC", "BLNHC"):
        bs, ls = page * L, page
    elif layout == "LHBNC":
        bs, ls = N * C, N * C * B * H
    else:  # BHLNC
        ls, bs = N * C, N * C * L * H
    del dense, inner
    size = (bs * B) if layout not in ("LBHNC", "LBNHC", "LHBNC") else ls * L
    tensors = [
        {"size": size, "layers": list(g), "layer_stride": ls, "block_stride": bs} for g in names
    ]
    groups = [{"layer_names": list(g), "kv_cache_spec": spec} for g in names]
    shared: dict[str, str] = {}
    n_shared = draw(st.integers(0, 4))
    for k in range(n_shared):
        shared[f"shared{k}.attn"] = draw(st.sampled_from([n for g in names for n in g]))
    return {
        "format": "kvplan.input/1",
        "vllm_version": "0.33.0",
        "kv_cache_config": {
            "num_blocks": num_blocks,
            "kv_cache_layout": layout,
            "kv_cache_tensors": tensors,
            "kv_cache_groups": groups,
        },
        "shared_kv_cache_layers": shared,
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_generated_configs_plan_cleanly(data: dict[str, Any]) -> None:
    doc = parse_input(data)
    plan = kvplan.plan(doc)
    layers = {n for g in data["kv_cache_config"]["kv_cache_groups"] for n in g["layer_names"]}
    assert {v.layer for v in plan.views} == layers
    assert {a.layer for a in plan.aliases} == set(data["shared_kv_cache_layers"])
    for view in plan.views:
        lo, hi = view.byte_extent
        assert lo >= 0 and hi <= plan.pools[0].size_bytes
    assert [d for d in kvplan.validate(plan) if d.is_error] == []
    text = kvplan.dumps(plan)
    assert kvplan.dumps(kvplan.plan(parse_input(data))) == text  # deterministic
    reloaded = kvplan.dumps(BindingPlanRoundTrip.load(text))
    assert reloaded == text  # dump/load byte-identical


class BindingPlanRoundTrip:
    @staticmethod
    def load(text: str) -> kvplan.BindingPlan:
        from kvplan.schemas.loading import parse_plan

        return parse_plan(parse_text(text, "plan.json"))


def _corrupt(data: Any, path: list[Any], value: Any) -> Any:
    data = copy.deepcopy(data)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def _paths(node: Any, prefix: list[Any]) -> list[list[Any]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, [*prefix, k])
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, [*prefix, i])
    return out


JUNK = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.text(max_size=5),
    st.booleans(),
    st.lists(st.integers(-3, 3), max_size=3),
    st.just({}),
    st.just(-1),
    st.just(0),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.data())
def test_corruptions_give_diagnostics_never_other_exceptions(
    data: dict[str, Any], draw: st.DataObject
) -> None:
    paths = _paths(data, [])
    path = draw.draw(st.sampled_from(paths))
    bad = _corrupt(data, path, draw.draw(JUNK))
    try:
        doc = parse_input(json.loads(json.dumps(bad)))
    except KVPlanError as exc:
        assert exc.diagnostics and all(d.code.value.startswith("KVP") for d in exc.diagnostics)
        return
    result, problems = build_plan(doc)  # must not raise
    assert result is not None or any(d.is_error for d in problems)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.data())
def test_corrupted_plans_give_diagnostics_never_other_exceptions(
    data: dict[str, Any], draw: st.DataObject
) -> None:
    from kvplan.schemas.canonical import to_data
    from kvplan.schemas.loading import parse_plan

    plan_data = to_data(kvplan.plan(parse_input(data)))
    path = draw.draw(st.sampled_from(_paths(plan_data, [])))
    bad = _corrupt(plan_data, path, draw.draw(JUNK))
    try:
        plan = parse_plan(json.loads(json.dumps(bad)))
    except KVPlanError as exc:
        assert exc.diagnostics and all(d.code.value.startswith("KVP") for d in exc.diagnostics)
        return
    kvplan.validate(plan)  # must not raise
