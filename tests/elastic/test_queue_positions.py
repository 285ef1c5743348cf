"""The trim's positions of the backed free blocks in vLLM's free queue (``SchedulerSide.
queue_positions``), read in from both ends of the queue's links, equal what a walk of the whole
queue (``get_all_free_blocks``) says -- on vLLM's real ``BlockPool`` (the installed release) under
its own hand-outs, frees (cached to the back, uncached to the front) and evictions -- and the
walk stops once every wanted block is found. The trim's free backed blocks
(``SchedulerSide.free_backed``: as many as the backed blocks less those in use, found in from
the ends) are every free, backed block, at those positions, under an elastic pool's own
schedule (hand-outs within a binding limit, frees, evictions, trims, maps ahead)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from harness import _builders as builders
from kvplan.elastic.ledger import Ledger
from kvplan.integrations.vllm.elastic._scheduler import SchedulerSide
from tests.elastic.test_admission_vllm import finish_some
from tests.elastic.test_ledger import PAGE, plan_of

pytestmark = pytest.mark.vllm
NUM_BLOCKS = 96


def positions(pool: Any, wanted: set[int]) -> dict[int, int]:
    return SchedulerSide.queue_positions(SimpleNamespace(pool=pool), wanted)  # type: ignore[arg-type]


def whole_walk(pool: Any, wanted: set[int]) -> dict[int, int]:
    listed = pool.free_block_queue.get_all_free_blocks()
    return {b.block_id: i for i, b in enumerate(listed) if b.block_id in wanted}


def random_event(pool: Any, used: list[Any], rng: random.Random, tag: int, side: Any = None) -> int:
    """One pool event at random: blocks handed out, a request finishing, a cached block
    evicted; with an elastic ``side``, also its trim (what the reserve and the limit ask) or
    its map ahead. The next cache tag."""
    op = rng.random()
    if side is not None and op >= 0.85:
        if op < 0.93:
            side.trim()
        else:
            side.map_ahead()
    elif op < 0.45 and pool.get_num_free_blocks() > 8:
        used.extend(pool.get_new_blocks(rng.randint(1, 6)))
    elif op < 0.8 and used:
        tag = finish_some(pool, used, rng, tag)
    elif op < 0.9:
        cached = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        cached = [b for b in cached if pool.blocks[b].block_hash is not None]
        if cached:
            pool.evict_blocks({rng.choice(cached)})
    return tag


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_positions_equal_a_walk_of_the_whole_queue(seed: int) -> None:
    from vllm.v1.core.block_pool import BlockPool

    rng = random.Random(seed)
    pool = BlockPool(NUM_BLOCKS, enable_caching=True, hash_block_size=16)
    used: list[Any] = []
    tag = 0
    for _ in range(300):
        free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        for wanted in (
            set(rng.sample(free, rng.randint(0, min(len(free), 12)))),
            set(free[:3]) | set(free[-3:]),  # near both ends, as the trim's usually are
            {NUM_BLOCKS + 5} | set(free[:2]),  # one not in the queue: the walk reads it all
        ):
            assert positions(pool, wanted) == whole_walk(pool, wanted)
        tag = random_event(pool, used, rng, tag)


def test_the_walk_stops_once_every_wanted_block_is_found() -> None:
    from vllm.v1.core.block_pool import BlockPool

    pool = BlockPool(NUM_BLOCKS, enable_caching=False, hash_block_size=16)
    queue = pool.free_block_queue
    read: list[int] = []
    first = queue.fake_free_list_head.next_free_block
    last = queue.fake_free_list_tail.prev_free_block

    class Counted:  # a link that counts its reads
        def __init__(self, block: Any) -> None:
            self.block = block

        def __getattr__(self, name: str) -> Any:
            if name == "block_id":
                read.append(self.block.block_id)
            value = getattr(self.block, name)
            return Counted(value) if name.endswith("_free_block") and value else value

    queue.fake_free_list_head = SimpleNamespace(next_free_block=Counted(first))
    queue.fake_free_list_tail = SimpleNamespace(prev_free_block=Counted(last))
    ids = [b.block_id for b in [first, first.next_free_block, last]]
    last_at = queue.num_free_blocks - 1  # vLLM took the null block out of the queue
    assert positions(pool, set(ids)) == {ids[0]: 0, ids[1]: 1, ids[2]: last_at}
    assert len(set(read)) <= 4  # two links from each end, not the whole queue


def test_a_queue_without_links_is_read_through_its_list() -> None:
    blocks = [SimpleNamespace(block_id=i) for i in (7, 3, 9, 4)]
    queue = SimpleNamespace(get_all_free_blocks=lambda: blocks)
    pool = SimpleNamespace(free_block_queue=queue)
    assert positions(pool, {9, 7, 11}) == {7: 0, 9: 2}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_trims_free_backed_blocks_are_every_free_backed_block(seed: int) -> None:
    from vllm.v1.core.block_pool import BlockPool

    from kvplan.integrations.vllm import elastic

    rng = random.Random(seed)
    pool = BlockPool(NUM_BLOCKS, enable_caching=True, hash_block_size=16)
    ledger = Ledger(plan_of(builders.llama(num_blocks=NUM_BLOCKS)), PAGE)
    settings = elastic.ElasticSettings(limit=ledger.reserved_bytes // 2, reserve=4 * 65536)
    side = SchedulerSide(ledger, settings, pool, None)
    elastic.make_elastic(pool, side)
    used: list[Any] = []
    tag = 0
    seen = 0
    for _ in range(400):
        scanned = {b for b in ledger.backed if b != 0 and pool.blocks[b].ref_cnt == 0}
        found = side.free_backed()
        assert set(found) == scanned
        assert found == whole_walk(pool, scanned)
        seen += bool(scanned)
        tag = random_event(pool, used, rng, tag, side)
    assert seen > 100  # free backed blocks were there to find, most of the time
