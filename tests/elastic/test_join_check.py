"""``join_refusals``: what a join would refuse, found without joining — with the join's own
code and text (the vLLM plugin refuses a group member with it before vLLM loads the model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvplan.elastic.group import GroupMember, read_snapshot, set_budget
from kvplan.elastic.join_check import join_refusals
from kvplan.schemas.errors import KVPlanError

MiB = 1 << 20
BUDGET = 8 * MiB
Full = tuple[Path, list[GroupMember]]


def _join_refusal(directory: Path, guarantee: int | None, budget: int | None = None) -> list[str]:
    """What ``GroupMember.join`` says, rendered (it must refuse)."""
    with pytest.raises(KVPlanError) as refused:
        GroupMember.join(
            directory, "third", floor=MiB // 2, ceiling=BUDGET, guarantee=guarantee, budget=budget
        )
    return [d.render() for d in refused.value.diagnostics]


@pytest.fixture
def full(tmp_path: Path) -> Iterator[Full]:
    """A group whose two live members are guaranteed the whole budget."""
    set_budget(tmp_path, BUDGET, create=True)
    members = [GroupMember.join(tmp_path, n, floor=MiB, ceiling=BUDGET, guarantee=4 * MiB)
               for n in ("a", "b")]  # fmt: skip
    yield tmp_path, members
    for member in members:
        try:
            member.leave()
        except KVPlanError:  # the test tore the ledger
            member.close_descriptors()


def test_a_guarantee_that_cannot_fit_is_the_joins_kvp542(full: Full) -> None:
    directory, _ = full
    before = read_snapshot(directory).revision
    found = join_refusals(directory, "third", guarantee=MiB)
    assert [d.code.value for d in found] == ["KVP542"]
    assert [d.render() for d in found] == _join_refusal(directory, MiB)
    assert "Σ guarantees 9437184 bytes with this member's 1048576 bytes" in found[0].message
    assert read_snapshot(directory).revision == before  # nothing written


def test_a_guarantee_that_fits_is_not_refused(full: Full) -> None:
    directory, members = full
    members[1].leave()
    assert join_refusals(directory, "third", guarantee=4 * MiB) == []
    assert join_refusals(directory, "third", guarantee=None) == []  # the floor: at the join


def test_dead_members_and_the_engines_own_name_are_not_counted(full: Full) -> None:
    directory, members = full
    members[1].close_descriptors()  # its lease is no longer held: dead, reaped by a join
    assert join_refusals(directory, "third", guarantee=4 * MiB) == []
    assert join_refusals(directory, "a", guarantee=8 * MiB) == []  # a's record is this engine


def test_no_ledger_and_no_budget_is_the_joins_kvp544(tmp_path: Path) -> None:
    found = join_refusals(tmp_path, "third", guarantee=MiB)
    assert join_refusals(tmp_path, "third", guarantee=MiB, budget=BUDGET) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing made
    assert [d.code.value for d in found] == ["KVP544"]
    assert [d.render() for d in found] == _join_refusal(tmp_path, MiB)


def test_a_directory_the_join_cannot_use_is_its_kvp540(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    found = join_refusals(missing, "third", guarantee=MiB, budget=BUDGET)
    assert [d.code.value for d in found] == ["KVP540"]
    assert [d.render() for d in found] == _join_refusal(missing, MiB, BUDGET)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "dangling")
    assert [d.render() for d in join_refusals(link, "t", guarantee=MiB)] == _join_refusal(link, MiB)


def test_an_unreadable_ledger_is_the_joins_kvp541(full: Full) -> None:
    directory, _ = full
    (directory / "ledger.json").write_text("{torn")
    found = join_refusals(directory, "third", guarantee=MiB)
    assert [d.code.value for d in found] == ["KVP541"]
    assert [d.render() for d in found] == _join_refusal(directory, MiB)
