"""The admission index wired to vLLM's real ``BlockPool`` (the installed release) through the hook
points the elastic pool uses (``follow_free_queue``; evictions here by hand, as the pool's
``_maybe_evict_cached_block`` does): its free set and order follow vLLM's free queue under
vLLM's own hand-outs, frees (cached to the back, uncached to the front), prefix hits,
evictions and cache resets; every pick is a block vLLM then hands out, within the limit."""

from __future__ import annotations

import random
from typing import Any

import pytest

from harness import _builders as builders
from kvplan.elastic.admission import AdmissionIndex
from kvplan.elastic.ledger import FreeBlock, Ledger, trim
from tests.elastic.test_admission import admit_until_one_does_not_fit, model_order
from tests.elastic.test_ledger import PAGE, plan_of

pytestmark = pytest.mark.vllm
NUM_BLOCKS = 192


def wire(pool: Any, index: AdmissionIndex) -> None:
    """The hook points: vLLM's free queue and its cache evictions call the index."""
    from kvplan.integrations.vllm.elastic._pool import follow_free_queue

    follow_free_queue(pool.free_block_queue, index)
    evict = pool._maybe_evict_cached_block

    def on_evict(block: Any) -> bool:
        done: bool = evict(block)
        if done:
            index.evicted([block.block_id])
        return done

    pool._maybe_evict_cached_block = on_evict


def _cache(pool: Any, block: Any, n: int) -> None:
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    key = make_block_hash_with_group_id(n.to_bytes(32, "little"), 0)  # type: ignore[arg-type]
    pool._insert_block_hash(key, block, num_tokens=16)


def finish_some(pool: Any, used: list[Any], rng: random.Random, tag: int) -> int:
    """A request finishes: up to 4 of the ``used`` blocks are freed, about half of them with
    a prefix-cache entry (vLLM frees cached blocks to the back of its queue, the rest to the
    front). The next cache tag."""
    done = [used.pop(rng.randrange(len(used))) for _ in range(min(len(used), 4))]
    for block in done:
        if rng.random() < 0.5:
            tag += 1
            _cache(pool, block, tag)
    pool.free_blocks(reversed(done))
    return tag


@pytest.mark.parametrize("chunk", [PAGE, 1 << 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_index_follows_vllms_block_pool(chunk: int, seed: int) -> None:
    from vllm.v1.core.block_pool import BlockPool

    rng = random.Random(seed)
    pool = BlockPool(NUM_BLOCKS, enable_caching=True, hash_block_size=16)
    ledger = Ledger(plan_of(builders.llama(num_blocks=NUM_BLOCKS)), chunk)
    ledger.back([0])
    queue = pool.free_block_queue
    index = AdmissionIndex(ledger, [b.block_id for b in queue.get_all_free_blocks()])
    wire(pool, index)
    limit = ledger.reserved_bytes // 3
    used: list[Any] = []
    tag = 0
    seen = {"allocations": 0, "frees": 0, "hits": 0, "evictions": 0}
    for _ in range(200):
        free = queue.get_all_free_blocks()
        free_ids = [b.block_id for b in free]
        cached = {b.block_id for b in free if b.block_hash is not None}
        assert index.nfree == queue.num_free_blocks == len(free_ids)
        order = model_order(ledger, free_ids, cached)
        assert list(index.order()) == order
        headroom = limit - ledger.mapped_bytes
        assert index.count(headroom) == len(
            admit_until_one_does_not_fit(ledger, order, max(0, headroom))
        )
        op = rng.random()
        if op < 0.4:  # allocate as the elastic pool will: pick, put in front, vLLM pops
            want = rng.randint(1, 6)
            if index.count(headroom) < want:
                continue
            picks = index.pick(want, headroom)
            blocks = [pool.blocks[b] for b in picks]
            for block in blocks:
                queue.remove(block)
            queue.prepend_n(blocks)
            got = pool.get_new_blocks(want)
            assert [b.block_id for b in got] == picks
            before = ledger.mapped_bytes
            ledger.back(picks)
            assert ledger.mapped_bytes <= max(limit, before)  # within the limit, or no new map
            used.extend(got)
            seen["allocations"] += 1
        elif op < 0.6 and used:  # a request finishes; some of its blocks were cached
            tag = finish_some(pool, used, rng, tag)
            seen["frees"] += 1
        elif op < 0.7 and cached:  # a prefix hit on a free cached block, or its eviction
            block = pool.blocks[rng.choice(sorted(cached))]
            if rng.random() < 0.7:
                pool.touch([block])
                used.append(block)
                seen["hits"] += 1
            else:
                pool.evict_blocks({block.block_id})  # vLLM's own eviction by id
                seen["evictions"] += 1
        elif op < 0.85:  # the trimmer: evict through vLLM, then unback
            backed_free = [
                FreeBlock(b, b in cached, i) for i, b in enumerate(free_ids) if b in ledger.backed
            ]
            result = trim(
                ledger, backed_free, limit=limit, cache_limit=rng.randint(0, limit // 4),
                reserve=rng.randint(0, limit // 8),
            )  # fmt: skip
            for b in result.evict:
                pool._maybe_evict_cached_block(pool.blocks[b])
            seen["evictions"] += len(result.evict)
        elif op < 0.9 and not used:
            assert pool.reset_prefix_cache()
            index.evicted([b.block_id for b in queue.get_all_free_blocks()])
        else:
            limit = rng.randint(0, ledger.reserved_bytes)
    assert all(seen.values()), seen
