"""The elastic block pool against the installed vLLM's own ``BlockPool``: every way vLLM
frees blocks reaches vLLM's code unchanged (0.34: ``free_blocks(..., evict_first=True)``,
which the offloading managers pass), and kvplan then puts the freed backed uncached blocks at
the front of the free queue."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.vllm


class _Side:
    """What the elastic pool asks of the scheduler side when blocks are freed."""

    def __init__(self, backed: set[int]) -> None:
        self.ledger = SimpleNamespace(backed=backed, uniform_block_cost=1)
        self.changes = 0

    def changed(self, freed: bool = True) -> None:
        self.changes += 1

    # the allocation side, as when the budget is not tight (vLLM's own choice of blocks)
    plain_count = False

    def tight(self) -> bool:
        return False

    def backed(self, block_ids: list[int]) -> None:
        return None

    def handed_out(self, count: int) -> None:
        return None


def _pool(backed: set[int]) -> tuple[Any, _Side]:
    from vllm.v1.core.block_pool import BlockPool

    from kvplan.integrations.vllm.elastic._pool import make_elastic

    pool = BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=16)
    side = _Side(backed)
    make_elastic(pool, side)  # type: ignore[arg-type]
    return pool, side


def _free_order(pool: Any) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_freed_backed_blocks_go_first() -> None:
    pool, side = _pool({5, 6})
    blocks = pool.get_new_blocks(7)  # every block but the null block
    pool.free_blocks([blocks[i] for i in (2, 4, 5)])  # ids 3, 5, 6: 5 and 6 are backed
    order = _free_order(pool)
    assert set(order[:2]) == {5, 6} and order[2] == 3
    assert side.changes == 1


def test_vllms_own_keyword_arguments_reach_vllm() -> None:
    """Whatever ``free_blocks`` takes beyond the blocks (0.34: ``evict_first``) is vLLM's."""
    from vllm.v1.core.block_pool import BlockPool

    extra = [p for p in inspect.signature(BlockPool.free_blocks).parameters if p not in
             ("self", "ordered_blocks")]  # fmt: skip
    pool, side = _pool({3})
    blocks = pool.get_new_blocks(3)
    kwargs = {name: True for name in extra}
    pool.free_blocks(blocks, **kwargs)  # a TypeError here: kvplan dropped vLLM's argument
    assert _free_order(pool)[0] == 3
    assert side.changes == 1
    if "evict_first" in extra:  # 0.34: the keyword vLLM's offloading manager passes
        pool.free_blocks(pool.get_new_blocks(2), evict_first=False)
        assert side.changes == 2
