"""Two engines' scheduler sides in one group, on vLLM's real ``BlockPool``: the grant
bounds admission, grows when admission is short, is given back once the workers confirmed
the unmaps, and a member below its guarantee gets back what a borrower holds (cached pages
first, then as its blocks are freed). The whole engines are in ``tests/engine``."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from harness import _builders as builders
from kvplan.elastic.group import read_snapshot, set_budget
from kvplan.elastic.ledger import Ledger
from kvplan.integrations.vllm.elastic import ElasticSettings, SchedulerSide, make_elastic
from kvplan.integrations.vllm.elastic._group import join
from kvplan.integrations.vllm.elastic._scheduler import ASK_LOOK_SECONDS, ASK_SECONDS
from tests.elastic.test_ledger import PAGE, plan_of

pytestmark = pytest.mark.vllm
NUM_BLOCKS = 256


def _member_side(
    directory: Path, name: str, guarantee_blocks: int, reserve: int | None = 0
) -> tuple[Any, SchedulerSide]:
    """A member's scheduler side over vLLM's real block pool; ``reserve``: its
    ``KVPLAN_RESERVE`` (``None``: the default)."""
    from vllm.v1.core.block_pool import BlockPool

    plan = plan_of(builders.llama(num_blocks=NUM_BLOCKS))
    ledger = Ledger(plan, PAGE)
    pool = BlockPool(NUM_BLOCKS, enable_caching=True, hash_block_size=16)
    block = sum(ledger.chunk_size(c) for c in ledger.chunks(1))
    settings = ElasticSettings(
        cache_limit=0, reserve=reserve, group=directory, group_guarantee=guarantee_blocks * block
    )
    side = SchedulerSide(ledger, settings, pool, None)
    side.floor = 2 * block
    side.group = join(
        settings,
        name=name,
        floor=side.floor,
        ceiling=ledger.reserved_bytes,
        initial=ledger.mapped_bytes,
        factor=1,
    )
    side.group.hold_seconds = 0.0  # no hysteresis in time: the test steps faster than a second
    make_elastic(pool, side)
    return pool, side


def _step(side: SchedulerSide) -> None:
    """One engine step as the handlers run it: trim before, operations after, the output
    confirming them."""
    side.before_schedule()
    side.group.tick(force=True)  # type: ignore[union-attr]
    side.ops()
    side.confirm(side.seq)


def _charged(directory: Path) -> int:
    return read_snapshot(directory).granted_bytes


def test_a_borrower_gives_back_what_a_member_below_its_guarantee_claims(tmp_path: Path) -> None:
    block_bytes = 4 * 4 * 1024  # 4 layers x 4 KiB pages
    budget = 96 * block_bytes
    set_budget(tmp_path, budget, create=True)
    pool_a, a = _member_side(tmp_path, "a", guarantee_blocks=16)
    pool_b, b = _member_side(tmp_path, "b", guarantee_blocks=16)
    assert a.tight() and b.tight()  # the group's grant binds each

    # a bursts: its admission asks the group for more, several times a step if need be
    got = []
    for _ in range(8):
        n = pool_a.get_num_free_blocks()
        if n <= 0:
            break
        got += pool_a.get_new_blocks(min(n, 16))
        _step(a)
    assert len(got) > 48  # far above its guarantee: a borrows what b does not use
    assert _charged(tmp_path) <= budget
    assert a.ledger.mapped_bytes <= a.group.granted  # type: ignore[union-attr]

    # b needs its guarantee while a holds nearly all of the budget
    wanted = 16
    assert pool_b.get_num_free_blocks() < wanted
    claimed = read_snapshot(tmp_path)
    assert any(m.name == "b" and m.claim_bytes > 0 for m in claimed.members)

    # a's next steps: its effective limit drops; blocks it frees are given back
    pool_a.free_blocks(got[len(got) // 2 :])
    for _ in range(3):
        _step(a)
    _step(b)
    assert pool_b.get_num_free_blocks() >= wanted  # b got its guarantee back from a
    taken = pool_b.get_new_blocks(wanted)
    assert len(taken) == wanted
    for side in (a, b):
        assert side.ledger.mapped_bytes <= side.group.granted  # type: ignore[union-attr]
    assert _charged(tmp_path) <= budget


def test_grants_are_given_back_only_when_the_unmaps_are_confirmed(tmp_path: Path) -> None:
    block_bytes = 4 * 4 * 1024
    set_budget(tmp_path, 128 * block_bytes, create=True)
    pool, side = _member_side(tmp_path, "solo", guarantee_blocks=8)
    blocks = pool.get_new_blocks(64)
    _step(side)
    granted = side.group.granted  # type: ignore[union-attr]
    pool.free_blocks(blocks)
    side.before_schedule()  # trims: the blocks are unbacked in the ledger, not yet on workers
    ops = side.ops()
    assert ops is not None and ops.unmap
    side.confirm(ops.seq - 1)  # an older step's output: the unmaps may not have run
    assert side.group.granted >= side.ledger.mapped_bytes + sum(side.unconfirmed.values())  # type: ignore[union-attr]
    side.confirm(ops.seq)
    assert side.group.granted < granted  # type: ignore[union-attr]
    assert side.group.granted >= side.ledger.mapped_bytes  # type: ignore[union-attr]


def test_an_engine_that_goes_idle_gives_back_its_grant_at_once(tmp_path: Path) -> None:
    """vLLM does not step an engine with nothing to schedule, so the step that empties it is
    the last chance to give back: the hysteresis (no voluntary shrink within a second of
    growing) must not keep a burst's grant borrowed for as long as the engine idles."""
    block_bytes = 4 * 4 * 1024
    budget = 128 * block_bytes
    set_budget(tmp_path, budget, create=True)
    pool, side = _member_side(tmp_path, "bursty", guarantee_blocks=8)
    group = side.group
    assert group is not None
    group.hold_seconds = 60.0  # the grant grew "just now" for the whole test
    blocks = pool.get_new_blocks(64)  # a burst: the grant grows far past the guarantee
    _step(side)
    grown = group.granted
    assert grown >= side.ledger.mapped_bytes >= 64 * block_bytes
    pool.free_blocks(blocks)
    side.before_schedule()  # the step after the burst: its blocks are unbacked
    ops = side.ops()
    assert ops is not None and ops.unmap
    side.confirm(ops.seq)  # requests are still waiting: the hysteresis holds the grant
    assert group.granted == grown
    side.confirm(ops.seq, idle=True)  # nothing left to schedule: everything unmapped goes back
    assert group.granted == side.ledger.mapped_bytes < 2 * block_bytes
    assert _charged(tmp_path) == side.ledger.mapped_bytes


def _idle(side: SchedulerSide) -> None:
    """What the watcher of an idle engine runs (``_reclaim.reclaim_idle``, workers aside)."""
    side.before_schedule(force_tick=True)
    ops = side.ops()
    side.confirm(side.seq if ops is None else ops.seq, idle=True)


def test_an_idle_members_reserve_yields_once_the_group_runs_out(tmp_path: Path) -> None:
    """A member idle after a burst keeps its default reserve backed for its next one --
    while the group has bytes free. Once a neighbour's growth has taken the last free bytes,
    the idle member gives its reserve back at its next look, and the neighbour's next ask gets
    it; with bytes free again the idle member maps nothing ahead on its own."""
    block_bytes = 4 * 4 * 1024
    set_budget(tmp_path, 96 * block_bytes, create=True)
    pool_a, a = _member_side(tmp_path, "a", guarantee_blocks=8, reserve=None)
    a.reserve = 8 * block_bytes  # the default's size, made larger to be seen
    pool_b, b = _member_side(tmp_path, "b", guarantee_blocks=8)
    group_a, group_b = a.group, b.group
    assert group_a is not None and group_b is not None

    pool_a.free_blocks(pool_a.get_new_blocks(16))  # a's burst, over
    _idle(a)
    assert a.reserve_bytes == 8 * block_bytes  # kept ahead: the group has bytes free
    assert group_a.granted == a.ledger.mapped_bytes
    _idle(a)  # a later look with bytes still free changes nothing
    assert a.reserve_bytes == 8 * block_bytes

    got = []  # b grows until the group has nothing free
    while (n := pool_b.get_num_free_blocks()) > 0:
        got += pool_b.get_new_blocks(min(n, 16))
        _step(b)
    assert group_b.free < group_b.quantum
    before = len(got)

    _idle(a)  # a's watcher sees the ledger changed: its reserve yields
    assert a.reserve_bytes == 0
    assert group_a.granted == a.ledger.mapped_bytes < 2 * block_bytes
    time.sleep(ASK_SECONDS)  # b asks again once the ledger changed and ASK_SECONDS passed
    assert pool_b.get_num_free_blocks() >= 8  # b's next ask gets what a kept ahead
    got += pool_b.get_new_blocks(8)
    assert len(got) == before + 8
    assert _charged(tmp_path) <= 96 * block_bytes

    pool_b.free_blocks(got)  # b's burst ends: bytes are free again
    _idle(b)
    assert group_b.free >= group_b.quantum
    _idle(a)
    assert not a.wants_ahead()  # nothing granted beyond what it maps: nothing mapped ahead
    assert a.ledger.mapped_bytes < 2 * block_bytes


def test_a_reserve_the_user_set_never_yields(tmp_path: Path) -> None:
    """With ``KVPLAN_RESERVE`` set, an idle member keeps its reserve backed even when a
    neighbour's growth took the group's last free bytes: the neighbour claims (if below its
    guarantee) as it would from any borrower."""
    block_bytes = 4 * 4 * 1024
    set_budget(tmp_path, 96 * block_bytes, create=True)
    pool_a, a = _member_side(tmp_path, "a", guarantee_blocks=8, reserve=8 * block_bytes)
    pool_b, b = _member_side(tmp_path, "b", guarantee_blocks=8)
    group_b = b.group
    assert group_b is not None
    pool_a.free_blocks(pool_a.get_new_blocks(16))
    _idle(a)
    assert a.reserve_bytes == 8 * block_bytes
    while (n := pool_b.get_num_free_blocks()) > 0:
        pool_b.get_new_blocks(min(n, 16))
        _step(b)
    assert group_b.free < group_b.quantum
    _idle(a)
    assert not a.reserve_yields()
    assert a.reserve_bytes == 8 * block_bytes
    assert _charged(tmp_path) <= 96 * block_bytes


def test_a_refused_member_looks_at_the_ledger_once_a_while_not_at_every_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM counts the free blocks several times a step; a member whose ask was refused asks
    again once the ledger changed, and finds that out with an ``lstat`` -- at most every
    ``ASK_LOOK_SECONDS``, not at every count (in a burst those looks were a fifth of a member's
    scheduling time). A change is still seen at the next look: the ask is made, and granted.
    Asks for more bytes past the guarantee wait for such a change too (only bytes set free
    can grow the grant then)."""
    from kvplan.elastic import group as group_module

    block_bytes = 4 * 4 * 1024
    set_budget(tmp_path, 96 * block_bytes, create=True)
    pool_a, a = _member_side(tmp_path, "a", guarantee_blocks=8)
    pool_b, b = _member_side(tmp_path, "b", guarantee_blocks=8)
    got: list[Any] = []
    while len(got) < 16:  # b past its guarantee
        n = pool_b.get_num_free_blocks()
        got += pool_b.get_new_blocks(min(n, 16 - len(got)))
        _step(b)
    held = []
    while (n := pool_a.get_num_free_blocks()) > 0:  # a takes all the rest
        held += pool_a.get_new_blocks(min(n, 16))
        _step(a)
    group_b = b.group
    assert group_b is not None and group_b.granted >= group_b.guarantee
    b.demand = 8
    while (n := pool_b.get_num_free_blocks()) > 0:  # what its grant still covers
        got += pool_b.get_new_blocks(n)
        _step(b)
    assert b.refused  # its last ask was refused
    looks = []
    stamp = group_module.ledger_stamp

    def counted(paths: Any) -> Any:
        looks.append(time.monotonic())
        return stamp(paths)

    asks = []
    request = type(b.group).request

    def asked(member: Any, need: int) -> bool:
        asks.append(need)
        return bool(request(member, need))

    monkeypatch.setattr(group_module, "ledger_stamp", counted)
    monkeypatch.setattr(type(b.group), "request", asked)
    time.sleep(ASK_SECONDS)
    started = time.monotonic()
    for i in range(200):
        b.demand = 9 + i  # its requests want more and more: past its guarantee only bytes
        assert pool_b.get_num_free_blocks() == 0  # set free can grow the grant
    spent = time.monotonic() - started
    assert 1 <= len(looks) <= 1 + spent / ASK_LOOK_SECONDS
    assert all(y - x >= ASK_LOOK_SECONDS for x, y in itertools.pairwise(looks))
    assert asks == []  # nothing changed: no ledger write

    pool_a.free_blocks(held)  # a's burst ends and its grant goes back: the ledger changes
    _idle(a)
    time.sleep(ASK_LOOK_SECONDS)
    assert pool_b.get_num_free_blocks() > 0  # the next look saw it, b asked and got more
    assert _charged(tmp_path) <= 96 * block_bytes
