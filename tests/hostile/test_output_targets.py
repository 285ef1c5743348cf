"""Every writer × everything that may already stand where it writes: kvplan writes regular
files only, never through a symbolic link, never outside the directory it was given, never
over one of its inputs; a refused write changes nothing anywhere (no file, no link, no node,
no temporary file)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvplan.elastic.files import ElasticStats, write_limit, write_stats
from kvplan.schemas.errors import KVPlanError
from tests.hostile._attacks import (
    INPUT_TARGETS,
    TARGETS,
    WRITERS,
    Area,
    Target,
    Writer,
    retarget,
)
from tests.hostile._harness import assert_no_bug, invoke

ENV = {"NO_COLOR": "1", "COLUMNS": "200"}
REFUSED = ("KVP016", "KVP017", "KVP022", "KVP023", "KVP002")

CASES: list[tuple[Writer, str, Target]] = [
    (writer, name, make) for writer in WRITERS for name, make in sorted(TARGETS.items())
] + [
    (writer, name, make)
    for writer in WRITERS
    if writer.inputs is not None
    for name, make in sorted(INPUT_TARGETS.items())
]


def _run(tmp_path: Path, writer: Writer, target: str, make: Target) -> None:
    area = Area(tmp_path)
    if writer.prepare is not None:
        writer.prepare(area)
    place = writer.place(area)
    inputs = writer.inputs(area) if writer.inputs is not None else []
    if os.path.lexists(place):
        place.unlink()
    made = make(area, place, inputs)
    args = retarget(writer.args(area), place, made)
    before = area.snapshot()
    outcome = invoke(args, env=ENV)
    what = f"{writer.name} over {target}"
    assert_no_bug(outcome, what)
    text = outcome.stdout + outcome.stderr
    assert outcome.exit_code == 2, f"{what}: exit {outcome.exit_code}: {text[:600]}"
    expected = ("KVP017",) if target in INPUT_TARGETS else REFUSED
    assert any(code in text for code in expected), f"{what}: {text[:600]}"
    after = area.snapshot()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"{what}: changed {changed}"


@pytest.mark.parametrize(
    ("writer", "target", "make"),
    CASES,
    ids=[f"{writer.name}-{target}" for writer, target, _ in CASES],
)
def test_a_writer_never_writes_through_what_is_there(
    tmp_path: Path, writer: Writer, target: str, make: Target
) -> None:
    _run(tmp_path, writer, target, make)


def _stats() -> ElasticStats:
    return ElasticStats(
        engine="e",
        rank=0,
        pid=1,
        time=0.0,
        state="running",
        backend="host-vmm",
        chunk_bytes=4096,
        num_blocks=8,
        reserved_bytes=1 << 20,
        mapped_bytes=0,
        peak_mapped_bytes=0,
        limit_bytes=0,
        cache_limit_bytes=0,
        reserve_bytes=0,
        live_blocks=0,
        cached_blocks=0,
        maps=0,
        unmaps=0,
        map_seconds=0.0,
        unmap_seconds=0.0,
        failed_maps=0,
        steps=0,
    )


FILE_WRITERS = {
    "write_stats": ("rank0.stats.json", lambda d: write_stats(d, _stats())),
    "write_limit": ("limit.json", lambda d: write_limit(d, 1 << 30)),
}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("writer", sorted(FILE_WRITERS))
def test_the_engines_file_writers_never_write_through_what_is_there(
    tmp_path: Path, writer: str, target: str
) -> None:
    area = Area(tmp_path)
    name, write = FILE_WRITERS[writer]
    TARGETS[target](area, area.dump / name, [])
    before = area.snapshot()
    with pytest.raises(KVPlanError) as refused:
        write(area.dump)
    assert refused.value.code.value in REFUSED
    assert area.snapshot() == before


@pytest.mark.parametrize("writer", [w for w in WRITERS if w.name.startswith("golden-update")])
def test_golden_update_never_writes_into_a_linked_model_folder(
    tmp_path: Path, writer: Writer
) -> None:
    area = Area(tmp_path)
    real = area.outside / "model"
    area.model.rename(real)
    area.model.symlink_to(real)
    (real / "plan.json").unlink()  # update would write a new one there
    before = area.snapshot()
    outcome = invoke(writer.args(area), env=ENV)
    assert_no_bug(outcome, writer.name)
    assert outcome.exit_code == 2 and "KVP023" in outcome.stderr, outcome.stderr
    assert area.snapshot() == before
