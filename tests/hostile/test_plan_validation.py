"""Hostile plans and inputs against the planner, validation and executor guard rails.

Covers: crashes turned into KVP diagnostics, ``apply`` refusing exactly what ``validate``
refuses, exact overlap against a byte-set oracle, bounded time/memory for alias cycles and
interleaved views, message quality, and what ``verify`` checks beyond the plan.
"""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import kvplan
from harness import _builders as b
from harness.executor import _plans as plans
from kvplan.cli import app
from kvplan.executor import apply, verify
from kvplan.planner import build_plan, validate
from kvplan.planner._overlap import MAX_PAIR_CHECKS, find_overlaps
from kvplan.schemas.canonical import to_data
from kvplan.schemas.errors import Code, KVPlanError
from kvplan.schemas.loading import load_any, parse_input, parse_plan
from kvplan.schemas.plan import Alias, BindingPlan, Pool, View
from tests.planner.test_properties import configs

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def codes(diags: list[Any]) -> set[Code]:
    return {d.code for d in diags if d.is_error}


def input_codes(data: dict[str, Any]) -> set[Code]:
    try:
        doc = parse_input(json.loads(json.dumps(data)))
    except KVPlanError as exc:
        return {d.code for d in exc.diagnostics}
    return codes(build_plan(doc)[1])


def view(layer: str, shape: list[int], stride: list[int], offset: int, **kw: Any) -> View:
    fields: dict[str, Any] = {"group": 0, "pool": "p", "kind": "FullAttentionSpec"}
    fields.update(kw)
    fields.setdefault("dtype", "int8")
    return View(layer=layer, shape=shape, stride=stride, offset_bytes=offset, **fields)


def pool(size: int, name: str = "p", num_blocks: int = 1) -> Pool:
    return Pool(name=name, size_bytes=size, alignment_bytes=256, num_blocks=num_blocks)


# -- 1. crashes in planning and validation ---------------------------------------------------


def _hisparse_doc(host_blocks: int) -> dict[str, Any]:
    data = b.llama(2)
    data["kv_cache_config"]["kv_cache_tensors"][0]["host_resident"] = True
    data["kv_cache_config"]["hisparse_host_num_blocks"] = host_blocks
    return data


def test_zero_hisparse_host_blocks_is_a_schema_error() -> None:
    assert input_codes(_hisparse_doc(0)) == {Code.SCHEMA}
    assert input_codes(_hisparse_doc(-3)) == {Code.SCHEMA}


def test_uniform_type_specs_without_inner_specs_is_a_schema_error() -> None:
    data = b.llama(2)
    data["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"] = {
        "kind": "UniformTypeKVCacheSpecs",
        "block_size": 16,
        "kv_cache_specs": {},
    }
    assert input_codes(data) == {Code.SCHEMA}


def _mamba_doc(shapes: list[list[int]], padded: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "MambaSpec",
        "block_size": 16,
        "shapes": [[1024]],
        "dtypes": ["float32"],
    }
    data = b.document([(["m.0"], spec)], num_blocks=4)
    data["kv_cache_config"]["kv_cache_tensors"][0].update(
        size=4096 * 4, layer_stride=4096 * 4, block_stride=4096
    )
    assert input_codes(data) == set()  # the valid baseline plans
    spec = data["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]
    spec.update(shapes=shapes, dtypes=["float32"] * len(shapes))
    if padded:
        spec["page_size_padded"] = padded
    return data


@pytest.mark.parametrize("shapes", [[[0]], [[4, 0]], [], [[-2]]])
def test_empty_mamba_state_is_refused(shapes: list[list[int]]) -> None:
    assert input_codes(_mamba_doc(shapes)) == {Code.SCHEMA}
    assert input_codes(_mamba_doc(shapes, padded=4096)) == {Code.SCHEMA}


def test_legacy_mamba_with_zero_shape_is_a_schema_error() -> None:
    from kvplan.schemas.legacy import parse_legacy

    path = ROOT / "tests" / "data" / "legacy" / "jamba-v0.1-hybrid.json"
    data = json.loads(path.read_text())
    found = 0
    for group in data["kv_cache_config"]["kv_cache_groups"]:
        spec = group["kv_cache_spec"]
        for sub in spec.get("kv_cache_specs", {"": spec}).values():
            if sub.get("kind") == "MambaSpec":
                sub["shapes"] = [[0] for _ in sub["shapes"]]
                found += 1
    assert found
    with pytest.raises(KVPlanError) as e:
        parse_legacy(data)
    assert {d.code for d in e.value.diagnostics} == {Code.SCHEMA}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kv_tp_replicas", -(2**63)),
        ("kv_tp_replicas", 0),
        ("hash_block_size", 0),
        ("cache_hit_alignment_tokens", -1),
        ("prefix_cache_retention_interval", -5),
        ("hisparse_host_block_stride", 0),
    ],
)
def test_binding_irrelevant_numbers_are_range_checked(field: str, value: int) -> None:
    data = b.llama(2)
    data["kv_cache_config"][field] = value
    assert input_codes(data) == {Code.SCHEMA}


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tp_shards", 0), ("sliding_window", -1), ("tokens_per_state", 0)],
)
def test_spec_numbers_are_range_checked(field: str, value: int) -> None:
    data = b.llama(2)
    data["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"][field] = value
    assert input_codes(data) == {Code.SCHEMA}


def test_huge_numbers_never_reach_a_message_unbounded() -> None:
    big = 10**4000
    plan = plans.make_plan(
        [pool(1 << 20)],
        [view("a", [big, big], [big, 1], 0), view("b", [4], [1], 10**4200)],
    )
    diags = validate(plan)
    assert {Code.OVERFLOW} <= codes(diags)
    for d in diags:
        assert len(d.render()) < 600


# -- apply: KVPlanError for malformed plans, never ValueError/TypeError ----------------------


def test_apply_refuses_non_plans_and_constructed_garbage() -> None:
    good = plans.llama_plan(layers=2, num_blocks=8)
    with pytest.raises(KVPlanError) as e:
        apply({"pools": []}, backend="meta")  # type: ignore[arg-type]
    assert e.value.code is Code.SCHEMA
    garbage = BindingPlan.model_construct(**{**dict(good), "views": [{"layer": 3}]})
    with pytest.raises(KVPlanError) as e:
        apply(garbage, backend="meta")
    assert e.value.code is Code.SCHEMA
    bad_view = View.model_construct(**{**dict(good.views[0]), "shape": ["x", None]})
    garbage = BindingPlan.model_construct(**{**dict(good), "views": [bad_view]})
    with pytest.raises(KVPlanError) as e:
        apply(garbage, backend="meta")
    assert e.value.code is Code.SCHEMA
    for kw in ({"chunk_size": "2MiB"}, {"chunk_size": 0}, {"mode": 3}):
        with pytest.raises(KVPlanError):
            apply(good, backend="meta", **kw)  # type: ignore[arg-type]


# -- 3. validation holes: apply refuses what validate refuses --------------------------------


def _overlapping(plan: BindingPlan) -> BindingPlan:
    v0, v1 = plan.views[0], plan.views[1]
    return plan.model_copy(
        update={"views": [v0, v1.model_copy(update={"offset_bytes": v0.offset_bytes})]}
    )


def _corruptions(plan: BindingPlan) -> dict[str, BindingPlan]:
    v = plan.views
    first, second = v[0].layer, v[1].layer
    return {
        "overlap": _overlapping(plan),
        "duplicate-view": plan.model_copy(update={"views": [*v, v[0]]}),
        "alias-chain": plan.model_copy(
            update={"aliases": [Alias(layer="x", target=first), Alias(layer="y", target="x")]}
        ),
        "alias-cycle": plan.model_copy(
            update={"aliases": [Alias(layer="x", target="y"), Alias(layer="y", target="x")]}
        ),
        "duplicate-alias": plan.model_copy(
            update={"aliases": [Alias(layer="x", target=first), Alias(layer="x", target=second)]}
        ),
        "duplicate-pool": plan.model_copy(update={"pools": [*plan.pools, plan.pools[0]]}),
        "self-overlap": plan.model_copy(
            update={
                "views": [
                    v[0].model_copy(update={"stride": [v[0].stride[0] // 2, *v[0].stride[1:]]}),
                    *v[1:],
                ]
            }
        ),
    }


EXPECTED = {
    "overlap": Code.VIEW_OVERLAP,
    "duplicate-view": Code.DUPLICATE_VIEW,
    "alias-chain": Code.ALIAS_CHAIN,
    "alias-cycle": Code.ALIAS_CYCLE,
    "duplicate-alias": Code.DUPLICATE_VIEW,
    "duplicate-pool": Code.DUPLICATE_POOL,
    "self-overlap": Code.VIEW_SELF_OVERLAP,
}


def _apply_codes(plan: BindingPlan) -> set[Code] | None:
    try:
        cache = apply(plan, backend="meta")
    except KVPlanError as exc:
        return {d.code for d in exc.diagnostics if d.is_error}
    cache.close()
    return None


@pytest.mark.parametrize("what", sorted(EXPECTED))
def test_apply_refuses_each_hole_with_validates_codes(what: str, tmp_path: Path) -> None:
    bad = _corruptions(plans.llama_plan(layers=2, num_blocks=8))[what]
    expected = codes(validate(bad))
    assert EXPECTED[what] in expected
    assert _apply_codes(bad) == expected
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(to_data(bad)))
    result = runner.invoke(app, ["apply", str(path), "--backend", "meta"])
    assert result.exit_code == 2, result.output
    assert "verify ok" not in result.output
    assert EXPECTED[what].value in result.stderr


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.data())
def test_apply_refuses_every_plan_validate_refuses(
    data: dict[str, Any], draw: st.DataObject
) -> None:
    plan = kvplan.plan(parse_input(data))
    plan_data = to_data(plan)
    corruption = draw.draw(st.sampled_from(["field", "named", "shift"]))
    if corruption == "named" and len(plan.views) >= 2:
        bad_plan: BindingPlan | None = _corruptions(plan)[
            draw.draw(st.sampled_from(sorted(EXPECTED)))
        ]
    else:
        bad = copy.deepcopy(plan_data)
        if corruption == "shift" and plan.views:
            i = draw.draw(st.integers(0, len(plan.views) - 1))
            key = draw.draw(st.sampled_from(["offset_bytes", "stride", "shape"]))
            if key == "offset_bytes":
                bad["views"][i][key] = draw.draw(st.integers(0, plan.pools[0].size_bytes))
            else:
                j = draw.draw(st.integers(0, len(plan.views[i].shape) - 1))
                bad["views"][i][key][j] = draw.draw(st.integers(0, 70000))
        else:
            views = bad["views"]
            if views:
                i = draw.draw(st.integers(0, len(views) - 1))
                key = draw.draw(st.sampled_from(["group", "pool", "layer", "dtype"]))
                other = views[draw.draw(st.integers(0, len(views) - 1))]
                views[i][key] = other[key] if key != "pool" else "nope"
        try:
            bad_plan = parse_plan(bad)
        except KVPlanError:
            return
    assert bad_plan is not None
    expected = codes(validate(bad_plan))
    got = _apply_codes(bad_plan)
    if expected:
        assert got == expected
    else:
        assert got is None


@st.composite
def degenerate_views(draw: st.DrawFn, name: str, pool_bytes: int) -> View:
    """Views as small as a plan allows and as odd: sizes 0 and 1, strides 0, huge and
    misaligned, offsets at and past the pool's end."""
    nd = draw(st.integers(1, 3))
    dtype, isz = draw(st.sampled_from([("int8", 1), ("float16", 2), ("float32", 4)]))
    shape = [draw(st.sampled_from([0, 0, 1, 1, 2, 3, 5])) for _ in range(nd)]
    stride = [draw(st.sampled_from([0, 1, 2, 7, 64, 1 << 40])) for _ in range(nd)]
    offset = draw(
        st.sampled_from([0, isz, 3, pool_bytes - isz, pool_bytes, pool_bytes + isz, 1 << 62])
    )
    return view(name, shape, stride, max(offset, 0), dtype=dtype)


BACKENDS = ("meta", "torch", "host-vmm")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_apply_and_verify_agree_with_validate_on_degenerate_views(draw: st.DataObject) -> None:
    """What validate accepts, every backend binds and verify proves; what it refuses, apply
    refuses with the same codes: zero-sized, one-element, zero-stride, edge-of-pool views."""
    size = draw.draw(st.sampled_from([4096, 8192]))
    count = draw.draw(st.integers(1, 3))
    views = [draw.draw(degenerate_views(f"v{i}", size)) for i in range(count)]
    plan = plans.make_plan([pool(size)], views)
    expected = codes(validate(plan, granularity=0))
    backend = draw.draw(st.sampled_from(BACKENDS))
    device = None if backend == "meta" else "cpu"
    try:
        cache = apply(plan, backend=backend, device=device)
    except KVPlanError as exc:
        assert {d.code for d in exc.diagnostics if d.is_error} == expected, exc
        return
    with cache:
        assert not expected, f"{backend} bound a plan validate refuses: {expected}"
        problems = verify(plan, cache.tensors, pools=cache.pools)
        assert problems == [], [d.render() for d in problems]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_with_no_elements_binds_and_verifies(backend: str) -> None:
    """The attack run's case: shape[0] = 0 was valid, then apply's verify failed with an
    offset of minus the pool's address (torch reports no data pointer for empty tensors)."""
    plan = plans.make_plan(
        [pool(8192)], [view("a", [0, 4], [4, 1], 64), view("b", [3, 0], [4, 1], 8)]
    )
    assert codes(validate(plan, granularity=0)) == set()
    with apply(plan, backend=backend, device=None if backend == "meta" else "cpu") as cache:
        assert verify(plan, cache.tensors, pools=cache.pools) == []


def test_views_of_one_group_overlapping_with_different_strides_are_an_error() -> None:
    # 64-byte runs every 96 bytes vs every 160 bytes: they provably share bytes
    plan = plans.make_plan(
        [pool(1 << 20)],
        [view("a", [4096, 64], [96, 1], 0), view("b", [2048, 64], [160, 1], 32)],
    )
    diags = validate(plan)
    assert codes(diags) == {Code.VIEW_OVERLAP}
    assert not any(d.code is Code.OVERLAP_UNPROVEN for d in diags)


def test_half_page_block_stride_overlaps_itself() -> None:
    data = b.llama(2, num_blocks=8)
    tensor = data["kv_cache_config"]["kv_cache_tensors"][0]
    tensor["block_stride"] //= 2
    assert Code.VIEW_SELF_OVERLAP in input_codes(data)


def test_layer_twice_in_one_group_is_refused() -> None:
    data = b.llama(2)
    group = data["kv_cache_config"]["kv_cache_groups"][0]
    group["layer_names"].append(group["layer_names"][0])
    doc = parse_input(data)
    diags = build_plan(doc)[1]
    assert Code.DUPLICATE_GROUP_LAYER in codes(diags)
    assert any("twice in group 0" in d.message for d in diags)


# -- exact overlap against a byte-set oracle -------------------------------------------------


def _bytes(v: View) -> list[int]:
    out = []
    for idx in itertools.product(*[range(n) for n in v.shape]):
        e = sum(i * s for i, s in zip(idx, v.stride, strict=True))
        out.extend(range(v.offset_bytes + e * v.itemsize, v.offset_bytes + (e + 1) * v.itemsize))
    return out


@st.composite
def small_views(draw: st.DrawFn, name: str) -> View:
    nd = draw(st.integers(1, 3))
    dtype, isz = draw(st.sampled_from([("int8", 1), ("float16", 2), ("float32", 4)]))
    return view(
        name,
        [draw(st.integers(0, 5)) for _ in range(nd)],
        [draw(st.integers(0, 40)) for _ in range(nd)],
        draw(st.integers(0, 64 // isz)) * isz,
        dtype=dtype,
    )


@settings(max_examples=400, deadline=None)
@given(small_views("a"), small_views("b"))
def test_overlap_is_exact_against_a_byte_oracle(a: View, b_: View) -> None:
    bytes_a, bytes_b = _bytes(a), _bytes(b_)
    size = max([0, *bytes_a, *bytes_b]) + 1
    diags = validate(plans.make_plan([pool(size)], [a, b_]))
    shared = bool(set(bytes_a) & set(bytes_b))
    assert (Code.VIEW_OVERLAP in codes(diags)) == shared
    selfs = {d.location for d in diags if d.code is Code.VIEW_SELF_OVERLAP}
    assert selfs == {v.layer for v, bs in ((a, bytes_a), (b_, bytes_b)) if len(set(bs)) < len(bs)}
    assert not any(d.code in (Code.OVERLAP_UNPROVEN, Code.OVERLAP_UNDECIDED) for d in diags)


# -- 2. resources ----------------------------------------------------------------------------


def _run_bounded(code: str, limit_mb: int = 1024) -> dict[str, Any]:
    """Run ``code`` (which prints one JSON line) in a fresh interpreter under RLIMIT_AS."""
    script = textwrap.dedent(
        f"""
        import json, resource, sys, time
        resource.setrlimit(resource.RLIMIT_AS, ({limit_mb} << 20, {limit_mb} << 20))
        sys.path[:0] = {[str(ROOT / "src"), str(ROOT)]!r}

        def peak_mb():  # this process's high-water RSS (ru_maxrss survives exec)
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) >> 10
            raise AssertionError("no VmHWM")
        """
    ) + textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("n", [1000, 2000])
def test_alias_cycle_is_one_bounded_diagnostic(n: int) -> None:
    out = _run_bounded(
        f"""
        from kvplan.planner import build_plan, validate
        from kvplan.schemas.loading import parse_input
        from kvplan.schemas.plan import Alias
        from harness import _builders as b
        from harness.executor import _plans as plans
        n = {n}
        data = b.llama(2)
        data["shared_kv_cache_layers"] = {{f"s{{i}}": f"s{{(i + 1) % n}}" for i in range(n)}}
        t0 = time.perf_counter()
        diags = build_plan(parse_input(data))[1]
        plan = plans.llama_plan(layers=2, num_blocks=8)
        aliases = [Alias(layer=f"s{{i}}", target=f"s{{(i + 1) % n}}") for i in range(n)]
        pdiags = validate(plan.model_copy(update={{"aliases": aliases}}))
        dt = time.perf_counter() - t0
        errors = [d for d in diags + pdiags if d.is_error]
        text = [d.render() for d in errors]
        print(json.dumps({{"dt": dt, "codes": [d.code.value for d in errors],
                          "chars": sum(map(len, text))}}))
        """,
    )
    assert out["codes"] == ["KVP204", "KVP204"]  # one per cycle, input and plan
    assert out["chars"] < 2000
    assert out["dt"] < 5.0  # linear: milliseconds; the bug took 5 s (1,000) and 39 s (2,000)


def test_alias_cycle_names_members_bounded() -> None:
    data = b.llama(2)
    data["shared_kv_cache_layers"] = {"x": "y", "y": "z", "z": "x", "w": "x"}
    diags = build_plan(parse_input(data))[1]
    cycle = [d for d in diags if d.code is Code.ALIAS_CYCLE]
    chain = [d for d in diags if d.code is Code.ALIAS_CHAIN]
    assert len(cycle) == 1 and "cycle of 3 layers: x, y, z" in cycle[0].message
    assert len(chain) == 1 and chain[0].location.endswith(".w")


INTERLEAVED = """
    from kvplan.planner import validate
    from kvplan.schemas.canonical import to_data
    from kvplan.schemas.plan import Pool, View
    from harness.executor import _plans as plans
    n, runs, blocks = 256, 65536, 2
    views = [
        View(layer=f"l{i}", group=0, pool="p", kind="FullAttentionSpec", dtype="int8",
             shape=[blocks, runs], stride=[runs * n, n], offset_bytes=i)
        for i in range(n)
    ]
    size = blocks * runs * n
    plan = plans.make_plan([Pool(name="p", size_bytes=size, alignment_bytes=256,
                                 num_blocks=blocks)], views + [View(**e) for e in EXTRA])
    text = json.dumps(to_data(plan))
    t0 = time.perf_counter()
    diags = validate(plan, granularity=0)
    dt = time.perf_counter() - t0
    peak = peak_mb()
    print(json.dumps({"dt": dt, "bytes": len(text), "peak_mb": peak,
                      "codes": sorted({d.code.value for d in diags})}))
"""


def test_interleaved_views_check_in_bounded_memory() -> None:
    out = _run_bounded("EXTRA = []\n" + textwrap.dedent(INTERLEAVED))
    assert out["bytes"] < 100_000
    assert out["codes"] == []  # interleaved, disjoint
    assert out["dt"] < 10.0  # target 2 s
    assert out["peak_mb"] < 500  # the bug: 2.35 GB


def test_interleaved_views_with_one_overlap_are_found() -> None:
    extra = (
        'EXTRA = [dict(layer="odd", group=0, pool="p", kind="FullAttentionSpec", dtype="int8",'
        " shape=[3, 7], stride=[1000, 37], offset_bytes=77)]\n"
    )
    out = _run_bounded(extra + textwrap.dedent(INTERLEAVED))
    assert out["codes"] == ["KVP302"]
    assert out["dt"] < 10.0


def test_megabyte_plan_of_mixed_periods_is_bounded() -> None:
    out = _run_bounded(
        """
        from kvplan.planner import validate
        from kvplan.schemas.canonical import to_data
        from kvplan.schemas.plan import Pool, View
        from harness.executor import _plans as plans
        n = 6000
        views = [
            View(layer=f"l{i}", group=0, pool="p", kind="FullAttentionSpec", dtype="int8",
                 shape=[1000 + i, 1], stride=[10007 + 2 * i, 1], offset_bytes=i)
            for i in range(n)
        ]
        plan = plans.make_plan([Pool(name="p", size_bytes=1 << 40, alignment_bytes=256,
                                     num_blocks=1)], views)
        text = json.dumps(to_data(plan))
        t0 = time.perf_counter()
        diags = validate(plan, granularity=0)
        dt = time.perf_counter() - t0
        peak = peak_mb()
        print(json.dumps({"dt": dt, "bytes": len(text), "peak_mb": peak,
                          "codes": sorted({d.code.value for d in diags})}))
        """
    )
    assert out["bytes"] <= 1 << 20
    assert out["dt"] < 10.0 and out["peak_mb"] < 500
    assert out["codes"] and set(out["codes"]) <= {"KVP302", "KVP311"}


def test_budget_exhaustion_is_refused_not_half_checked() -> None:
    views = [view(f"l{i}", [50, 1], [97 + i, 1], i) for i in range(700)]
    found = find_overlaps(views)
    assert found and all(f.kind in ("pair", "complex") for f in found)
    assert MAX_PAIR_CHECKS >= 100_000


# -- 4. messages -----------------------------------------------------------------------------


def _messages(data: dict[str, Any]) -> list[str]:
    return [d.render() for d in build_plan(parse_input(data))[1] if d.is_error]


def test_kvp107_fix_never_suggests_zero() -> None:
    data = b.llama(2)
    data["kv_cache_config"]["kv_cache_tensors"][0]["size"] = 100
    text = " ".join(_messages(data))
    assert "KVP107" in text and "e.g. 0" not in text and "at least" in text


def test_kvp106_names_one_tensor_when_listed_twice() -> None:
    data = b.llama(2)
    tensor = data["kv_cache_config"]["kv_cache_tensors"][0]
    tensor["layers"].append(tensor["layers"][0])
    text = " ".join(_messages(data))
    assert "KVP106" in text and "tensors 0 and 0" not in text and "twice in tensor 0" in text


def test_kvp110_names_a_negative_kernel_block() -> None:
    data = b.llama(2)
    data["kernel_block_sizes"] = [-16]
    [text] = [m for m in _messages(data) if "KVP110" in m]
    assert "not positive" in text and "layout" not in text and "Fix:" in text


def test_kvp115_has_a_fix() -> None:
    data = b.llama(2, layout="LHBNC")
    data["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]["page_size_padded"] = 4096
    msgs = [m for m in _messages(data) if "KVP115" in m]
    assert msgs and all("Fix:" in m for m in msgs)


def test_every_planner_error_has_a_fix() -> None:
    bad = sorted((ROOT / "tests" / "data" / "bad").glob("KVP[123]*.json"))
    assert bad
    for path in bad:
        try:
            doc = load_any(path)
        except KVPlanError:
            continue
        diags = validate(doc)
        for d in diags:
            if d.is_error:
                assert d.hint, f"{path.name}: {d.render()}"


# -- verify checks what the plan cannot promise ----------------------------------------------


def test_verify_reports_plan_errors_and_real_memory() -> None:
    import torch

    plan = plans.llama_plan(layers=2, num_blocks=8)
    with apply(plan, backend="meta") as cache:
        assert verify(plan, cache.tensors, pools=cache.pools) == []
        bad = _overlapping(plan)
        assert Code.VIEW_OVERLAP in codes(verify(bad, cache.tensors, pools=cache.pools))
    # tensors that really overlap although the plan says they do not
    pool_t = torch.zeros(plan.pools[0].size_bytes, dtype=torch.int8)
    typed = pool_t.view(torch.bfloat16)
    v0, v1 = plan.views
    t0 = torch.as_strided(typed, v0.shape, v0.stride, v0.storage_offset)
    diags = verify(plan, {v0.layer: t0, v1.layer: t0}, pools={"kv": pool_t})
    assert any(d.location == f"{v1.layer}.memory" or "share memory" in d.message for d in diags)
    # a tensor reaching past its pool's allocation
    short = pool_t[: plan.pools[0].size_bytes // 2]
    t1 = torch.as_strided(typed, v1.shape, v1.stride, v1.storage_offset)
    diags = verify(plan, {v0.layer: t0, v1.layer: t1}, pools={"kv": short})
    assert any("allocation" in d.message for d in diags)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=3, max_size=3), st.data())
def test_overlap_pairs_are_exact_for_several_views(periods: list[int], draw: st.DataObject) -> None:
    # shared periods and their multiples exercise the modulo-gcd sweep, not only extents
    base = draw.draw(st.sampled_from([8, 12, 16]))
    views = []
    for i, k in enumerate(periods):
        v = draw.draw(small_views(f"v{i}"))
        if k:
            stride = [max(1, base * k // v.itemsize), *v.stride[1:]]
            v = v.model_copy(update={"stride": stride})
        views.append(v)
    found = find_overlaps(views)
    assert not any(f.kind == "complex" for f in found)
    sets = [_bytes(v) for v in views]
    pairs = {
        (views[i].layer, views[j].layer)
        for i in range(3)
        for j in range(i + 1, 3)
        if set(sets[i]) & set(sets[j])
    }
    selfs = {v.layer for v, bs in zip(views, sets, strict=True) if len(set(bs)) < len(bs)}
    assert {(f.a, f.b) for f in found if f.kind == "pair"} == pairs
    assert {f.a for f in found if f.kind == "self"} == selfs


def test_views_with_too_many_run_progressions_are_refused_boundedly() -> None:
    # [64, 64, 64] with non-mergeable strides: 4096 progressions per view, 20 views
    views = [view(f"l{i}", [64, 64, 64], [100_000, 1000, 3], i * 7) for i in range(20)]
    found = find_overlaps(views)
    assert any(f.kind == "complex" for f in found)
    one = find_overlaps([view("x", [65, 65, 65], [100_000, 1000, 3], 0)])
    assert [f.kind for f in one] == ["complex"]
