"""Input size and work bounds, generated: names and counts past the schema's bounds in every
named field of every bundled document are refused at load with their own codes (``KVP025``
names, ``KVP026`` counts) in bounded time and memory; a valid pool of any size is applied in
memory that does not grow with it; commands that found nothing to do, or refused part of
their input, exit 2."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kvplan.schemas import loading
from kvplan.schemas.bounds import MAX_ITEMS
from kvplan.schemas.errors import KVPlanError
from tests.hostile import _generators as generators
from tests.hostile._attacks import PLAN, Area
from tests.hostile._harness import (
    HANG_SECONDS,
    Outcome,
    assert_bounded,
    assert_no_bug,
    assert_refused,
    invoke,
    spawn,
)

ENV = {"NO_COLOR": "1", "COLUMNS": "200"}
LONG = 1 << 20
"""A 1 MiB name (the attack run's: a 27-30 MB page, seconds of CPU)."""


def _name_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every string that names something (layers, pools, targets, versions, kinds are
    left alone: a kind is an enum), and of every mapping key that is a layer name."""
    out: list[tuple[Any, ...]] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("metadata", "kind", "dtype", "format", "fingerprint"):
                continue
            if isinstance(value, str):
                out.append((*prefix, key))
            elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                out.append((*prefix, key, 0))
            else:
                out.extend(_name_paths(value, (*prefix, key)))
    elif isinstance(doc, list):
        for index, value in enumerate(doc[:2]):
            out.extend(_name_paths(value, (*prefix, index)))
    return out


def _long_name_cases() -> list[tuple[str, str, dict[str, Any]]]:
    cases = []
    for model, kind, doc in generators.sources():
        paths = _name_paths(doc)
        for path in paths[:: max(1, len(paths) // 4)][:4]:
            mutated = copy.deepcopy(doc)
            target = mutated
            for part in path[:-1]:
                target = target[part]
            target[path[-1]] = "n" * LONG
            cases.append((f"{model}-{kind}-{'.'.join(map(str, path))}", kind, mutated))
    return cases


LONG_NAMES = _long_name_cases()


def test_long_name_cases_cover_inputs_and_plans() -> None:
    kinds = {kind for _, kind, _ in LONG_NAMES}
    assert kinds == {"input", "plan"} and len(LONG_NAMES) >= 60


@pytest.mark.parametrize(("name", "kind", "doc"), LONG_NAMES, ids=[c[0] for c in LONG_NAMES])
def test_a_long_name_is_refused_at_load(tmp_path: Path, name: str, kind: str, doc: Any) -> None:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    outcome = invoke(["show", str(path), "--html", str(tmp_path / "o.html")], env=ENV)
    assert_refused(outcome, what=name)
    # a name is KVP025; a field that holds an enum member or a dtype refuses it by its own code
    assert outcome.stderr[:6] in ("KVP025", "KVP006", "KVP008"), outcome.stderr[:300]
    assert not (tmp_path / "o.html").exists()


def _many_views(count: int) -> dict[str, Any]:
    doc = json.loads(PLAN.read_text())
    first = doc["views"][0]
    doc["views"] = [dict(first, layer=f"l{i}") for i in range(count)]
    return doc


def test_a_plan_with_too_many_views_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "many.json"
    path.write_text(json.dumps(_many_views(MAX_ITEMS + 1)))
    outcome = spawn(["show", str(path), "--html", str(tmp_path / "o.html")])
    assert_refused(outcome, "KVP026")
    assert_bounded(outcome, f"{MAX_ITEMS + 1} views")
    with pytest.raises(KVPlanError) as refused:
        loading.load_plan(path)
    assert refused.value.code.value == "KVP026"


def test_show_of_a_plan_at_the_bound_prints_bounded_tables(tmp_path: Path) -> None:
    """The attack run's 10,000-layer ``show --html`` (11.6 s of CPU, most of it laying out a
    10,000-row table): every table prints at most 512 rows and counts the rest."""
    path = tmp_path / "many.json"
    path.write_text(json.dumps(_many_views(10_000)))
    outcome = spawn(["show", str(path), "--html", str(tmp_path / "o.html")])
    assert outcome.exit_code == 0, outcome.stderr
    assert "… and 9,488 more rows (of 10,000; --json lists them all)" in outcome.stdout
    assert outcome.stdout.count("\n") < 700
    assert_bounded(outcome, "10,000 views")


def _pool_plan(tmp_path: Path, size: int) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": "kvplan.plan/1",
        "fingerprint": "sha256:" + "0" * 64,
        "source": {"vllm_version": "0.33.0", "layout": None, "num_blocks": 1},
        "pools": [{"name": "p", "size_bytes": size, "alignment_bytes": 256, "num_blocks": 1}],
        "views": [
            {
                "layer": "a",
                "group": 0,
                "pool": "p",
                "kind": "FullAttentionSpec",
                "dtype": "int8",
                "shape": [1, 4096],
                "stride": [4096, 1],
                "offset_bytes": 0,
            }
        ],
        "aliases": [],
        "summary": {
            "tensor_backed_layers": 1,
            "aliased_layers": 0,
            "bytes_per_block": size,
            "pool_bytes": size,
            "alias_saved_bytes": 0,
        },
    }
    path = tmp_path / "pool.json"
    path.write_text(json.dumps(doc))
    return path


def _apply(path: Path, mode: str, *extra: str) -> Outcome:
    outcome = spawn(["apply", str(path), "--backend", "meta", "--mode", mode, "--json", *extra])
    assert_no_bug(outcome, f"{path.name} {mode}")
    return outcome


GROWTH_BYTES = 64 << 20
"""What a pool may add to the peak RSS of ``kvplan apply`` over a 1 GiB pool's (torch alone
is about 500 MiB, so the suite's absolute bound cannot apply)."""


@pytest.mark.parametrize("mode", ["eager", "elastic"])
def test_a_huge_pool_is_applied_in_memory_that_does_not_grow(tmp_path: Path, mode: str) -> None:
    """The attack run's 256 TiB pool took 25-33 s and 1.4 GB, then failed with a MemoryError
    dressed as KVP402; 8 EiB-class pools (the largest a plan holds) are applied too."""
    small = _apply(_pool_plan(tmp_path / "small", 1 << 30), mode)
    assert small.exit_code == 0, small.stderr
    for size in (256 << 40, 8 << 50, (1 << 62) + (1 << 61)):
        path = _pool_plan(tmp_path / str(size), size)
        assert invoke(["validate", str(path)], env=ENV).exit_code == 0
        outcome = _apply(path, mode)
        assert outcome.exit_code == 0, outcome.stderr
        result = json.loads(outcome.stdout)
        assert result["verify"]["ok"] and result["reserved_bytes"] >= size
        assert result["mapped_bytes"] == (result["reserved_bytes"] if mode == "eager" else 0)
        growth = outcome.peak_rss_bytes - small.peak_rss_bytes
        assert growth < GROWTH_BYTES, f"{size} bytes {mode}: {growth >> 20} MiB more"


def test_a_chunk_size_that_needs_too_many_mappings_is_refused_first(tmp_path: Path) -> None:
    path = _pool_plan(tmp_path, 256 << 40)
    outcome = _apply(path, "eager", "--chunk-size", "4KiB")
    assert_refused(outcome, "KVP420")
    assert "chunk size of at least" in outcome.stderr
    assert outcome.seconds < HANG_SECONDS


def test_a_huge_pool_is_applied_in_bounded_memory_from_python(tmp_path: Path) -> None:
    from tests.hostile.test_plan_validation import _run_bounded

    out = _run_bounded(
        f"""
        from kvplan.executor import apply
        from kvplan.schemas.errors import KVPlanError
        from kvplan.schemas.loading import load_plan
        plan = load_plan({str(_pool_plan(tmp_path, 256 << 40))!r})
        import torch  # noqa: F401 - its own memory is the baseline
        base = peak_mb()
        try:
            with apply(plan, backend="meta") as cache:
                code = "ok" if cache.mapped_bytes == 256 << 40 else "wrong"
        except KVPlanError as exc:
            code = exc.code.value
        except MemoryError:
            code = "MemoryError"
        print(json.dumps({{"code": code, "growth_mb": peak_mb() - base}}))
        """,
        limit_mb=4096,
    )
    assert out["code"] == "ok", out
    assert out["growth_mb"] < 64, out


def test_golden_check_of_a_directory_without_models_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("no models here\n")
    (tmp_path / "not-a-model").mkdir()
    for command in ("check", "update"):
        outcome = invoke(["golden", command, str(tmp_path), "--input-only"], env=ENV)
        assert_refused(outcome, "KVP024", what=command)


def test_top_past_the_stats_file_bound_exits_2(tmp_path: Path) -> None:
    from kvplan.elastic import files
    from tests.hostile.test_output_targets import _stats

    area = Area(tmp_path)
    for rank in range(files.MAX_STATS_FILES + 1):
        files.write_stats(area.dump, _stats().model_copy(update={"rank": rank}))
    outcome = invoke(["top", str(area.dump), "--once"], env=ENV)
    assert_no_bug(outcome)
    assert outcome.exit_code == 2, outcome.stderr[-400:]
    assert "KVP416" in outcome.stderr and "more than 1024 stats files" in outcome.stderr
