"""The elastic ledger: chunks per block from the plan, exact byte accounting, admission within
a budget, and page-aware giving back — on every layout the planner supports."""

from __future__ import annotations

import random
from typing import Any

import pytest

from harness import _builders as builders
from kvplan.elastic.ledger import FreeBlock, Ledger, admit, trim
from kvplan.planner import build_plan
from kvplan.planner.page_index import PageIndex
from kvplan.schemas.input import InputDocument
from kvplan.schemas.plan import BindingPlan

PAGE = 4096


def plan_of(doc: dict[str, Any]) -> BindingPlan:
    plan, problems = build_plan(InputDocument.model_validate(doc))
    assert plan is not None, [p.render() for p in problems]
    return plan


LAYOUTS = {
    "llama": lambda: builders.llama(num_blocks=64),
    "gemma4-LBNHC-sharing": lambda: builders.gemma4_e2b("LBNHC", 64),
    "gemma4-BLHNC-block-outermost": lambda: builders.gemma4_e2b("BLHNC", 64),
    "mamba-hybrid-padded": lambda: builders.mamba_hybrid(16),
    "mla": lambda: builders.mla(),
}


def union_bytes(ledger: Ledger, blocks: set[int]) -> int:
    """Bytes of the chunks ``blocks`` touch, from the page index directly (the oracle)."""
    index = PageIndex(ledger.plan)
    total = 0
    for pool, ids in index.blocks_chunks(blocks, ledger.chunk_bytes).items():
        p = ledger.pool_names.index(pool)
        total += sum(ledger.chunk_size((p, c)) for c in ids)
    return total


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mapped_bytes_are_the_union_of_the_backed_blocks_chunks(layout: str) -> None:
    ledger = Ledger(plan_of(LAYOUTS[layout]()), PAGE)
    rng = random.Random(7)
    backed: set[int] = set()
    for _ in range(40):
        some = set(rng.sample(range(ledger.num_blocks), rng.randint(1, 6)))
        if rng.random() < 0.5:
            new = ledger.back(some)
            assert set(new) == some - backed
            backed |= some
        else:
            ledger.unback(some)
            backed -= some
        assert ledger.backed == backed
        assert ledger.mapped_bytes == union_bytes(ledger, backed)
        assert ledger.peak_mapped_bytes >= ledger.mapped_bytes
    ledger.back(range(ledger.num_blocks))
    assert ledger.mapped_bytes <= ledger.reserved_bytes
    ledger.unback(range(ledger.num_blocks))
    assert ledger.mapped_bytes == 0 and not ledger.refs and not ledger.users


def test_kv_sharers_own_no_chunks() -> None:
    """gemma-4-E2B: 20 of 35 layers share KV; the plan aliases them, the ledger never maps
    anything for them (the same pages as a document that does not mention them)."""
    shared = builders.gemma4_e2b("LBNHC", 64)
    alone = dict(shared, shared_kv_cache_layers={})
    with_sharers, without = Ledger(plan_of(shared), PAGE), Ledger(plan_of(alone), PAGE)
    assert len(with_sharers.plan.aliases) == 20 and not without.plan.aliases
    assert all(with_sharers.chunks(b) == without.chunks(b) for b in range(64))


def test_a_block_outermost_block_is_one_contiguous_run_across_layers() -> None:
    ledger = Ledger(plan_of(builders.gemma4_e2b("BLHNC", 64)), PAGE)
    (pool,) = ledger.plan.pools
    per_block = pool.size_bytes // pool.num_blocks
    ids = [c for _, c in ledger.chunks(5)]
    assert ids == list(range(ids[0], ids[-1] + 1))  # every layer's bytes, one run
    assert ids[0] * PAGE <= 5 * per_block < (ids[0] + 1) * PAGE


def test_admit_takes_what_fits_in_allocation_order() -> None:
    ledger = Ledger(plan_of(builders.llama(num_blocks=64)), PAGE)
    ledger.back([0, 9])
    block = union_bytes(ledger, {1})
    # room for two unbacked blocks; block 9 is backed and costs nothing
    taken = admit(ledger, [1, 9, 2, 3, 4], headroom=2 * block)
    assert taken == [1, 9, 2]
    assert admit(ledger, [1, 9, 2, 3, 4], headroom=2 * block, wanted=2) == [1, 9]
    assert admit(ledger, [1, 2, 9], headroom=0) == [9]  # over budget: only backed blocks
    assert admit(ledger, [1, 2], headroom=-5) == []


def _llama_two_blocks_per_chunk() -> Ledger:
    """llama, 4 KiB per layer and block: an 8 KiB chunk holds two blocks of one layer."""
    ledger = Ledger(plan_of(builders.llama(num_blocks=64)), 2 * PAGE, PAGE)
    assert union_bytes(ledger, {2}) == union_bytes(ledger, {2, 3})  # 2 and 3 share pages
    return ledger


def test_trim_evicts_the_cheapest_pages_first_and_keeps_live_ones() -> None:
    ledger = _llama_two_blocks_per_chunk()
    ledger.back([0, 2, 3, 4, 5, 6, 7])
    mapped = ledger.mapped_bytes
    free = [
        FreeBlock(2, cached=True, age=0),
        FreeBlock(3, cached=True, age=1),
        FreeBlock(4, cached=True, age=2),
        FreeBlock(5, cached=False, age=3),
        FreeBlock(7, cached=True, age=4),  # shares its pages with block 6, in use
    ]
    pair = mapped // 4  # the pages of one pair of blocks (0-1, 2-3, 4-5, 6-7)
    result = trim(ledger, free, limit=mapped, cache_limit=pair, reserve=0)
    assert result.evict == (4,)  # one cached block on its pages: cheaper than pages 2-3
    assert result.unback == (4, 5)
    assert ledger.mapped_bytes == mapped - pair
    assert result.cached_bytes == pair and result.reserve_bytes == 0
    assert {0, 2, 3, 6, 7} == ledger.backed  # 7 is cached but its pages are held by 6


def test_trim_keeps_the_reserve_and_drops_all_cache_at_zero() -> None:
    ledger = _llama_two_blocks_per_chunk()
    ledger.back([0, 2, 3, 4, 5])
    pair = union_bytes(ledger, {2, 3})
    free = [
        FreeBlock(2, cached=True, age=0),
        FreeBlock(3, cached=True, age=1),
        FreeBlock(4, cached=False, age=2),
        FreeBlock(5, cached=False, age=3),
    ]
    result = trim(ledger, free, limit=10**9, cache_limit=0, reserve=pair)
    assert result.evict == (2, 3)  # no cache kept ...
    assert len(result.unback) == 2  # ... and one pair of pages kept as the reserve
    assert result.cached_bytes == 0 and result.reserve_bytes == pair
    assert ledger.mapped_bytes == union_bytes(ledger, {0}) + pair


def test_trim_under_a_lowered_limit_gives_back_cache_and_reserve() -> None:
    ledger = _llama_two_blocks_per_chunk()
    ledger.back([0, 1, 2, 3, 4, 5])
    null_pair = union_bytes(ledger, {0, 1})
    free = [FreeBlock(b, b % 2 == 0, b) for b in (2, 3, 4, 5)]
    result = trim(ledger, free, limit=null_pair, cache_limit=10**9, reserve=10**9)
    assert ledger.mapped_bytes == null_pair  # block 1 is in use with the null block's pages
    assert set(result.evict) == {2, 4} and set(result.unback) == {2, 3, 4, 5}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("chunk", [PAGE, 4 * PAGE, 1 << 21])
def test_uniform_block_cost_is_exact_when_it_is_given(layout: str, chunk: int) -> None:
    """When the ledger claims every block costs the same and owns its chunks, the page index
    agrees for every block; the cost bound is never below a real block's cost."""
    ledger = Ledger(plan_of(LAYOUTS[layout]()), chunk)
    index = PageIndex(ledger.plan)
    costs = {b: union_bytes(ledger, {b}) for b in range(ledger.num_blocks)}
    assert max(costs.values()) <= ledger.max_block_cost
    cost = ledger.uniform_block_cost
    if cost is None:
        return
    assert set(costs.values()) == {cost}
    seen: dict[tuple[str, int], int] = {}
    for b in range(ledger.num_blocks):
        for pool, ids in index.block_chunks(b, chunk).items():
            for c in ids:
                assert seen.setdefault((pool, c), b) == b  # no chunk has two blocks


def test_uniform_block_cost_where_it_applies_and_where_it_does_not() -> None:
    llama = plan_of(LAYOUTS["llama"]())
    assert Ledger(llama, PAGE).uniform_block_cost == 4 * PAGE  # 4 layers, 4 KiB pages
    assert Ledger(llama, 1 << 21).uniform_block_cost is None  # 2 MiB: blocks share chunks


def _chunk_walk(ledger: Ledger, free: list[FreeBlock], **limits: int) -> Any:
    """:func:`trim` forced down its general path (as if blocks shared chunks)."""
    ledger.__dict__["uniform_block_cost"] = None  # the cached property, shadowed
    try:
        return trim(ledger, free, **limits)
    finally:
        del ledger.__dict__["uniform_block_cost"]


@pytest.mark.parametrize("layout", ["llama", "gemma4-LBNHC-sharing", "mla"])
@pytest.mark.parametrize("seed", range(30))
def test_trim_block_by_block_decides_as_the_chunk_walk(layout: str, seed: int) -> None:
    """Where every block owns its chunks (at 4 KiB), the trim works per block; on random
    pools (blocks in use, free with and without cache entries, ages with ties, limits below
    and above what is mapped) it evicts, unbacks and counts exactly as the chunk walk."""
    rng = random.Random(seed)
    plan = plan_of(LAYOUTS[layout]())
    fast, slow = Ledger(plan, PAGE), Ledger(plan, PAGE)
    assert fast.uniform_block_cost is not None
    blocks = rng.sample(range(1, fast.num_blocks), rng.randint(0, min(40, fast.num_blocks - 1)))
    for ledger in (fast, slow):
        ledger.back([0, *blocks])
    free = [
        FreeBlock(b, rng.random() < 0.4, rng.randrange(8))  # ages tie: chunks break them
        for b in blocks
        if rng.random() < 0.7
    ]
    free += [FreeBlock(b, True, 1) for b in rng.sample(blocks, min(2, len(blocks)))]  # twice
    cost = fast.uniform_block_cost
    limits = {
        "limit": fast.mapped_bytes + cost * rng.randint(-30, 5),
        "cache_limit": cost * rng.randint(0, 10),
        "reserve": cost * rng.randint(0, 10),
    }
    got = trim(fast, free, **limits)
    want = _chunk_walk(slow, free, **limits)
    assert got == want
    assert fast.backed == slow.backed and fast.mapped_bytes == slow.mapped_bytes
    assert fast.refs == slow.refs
