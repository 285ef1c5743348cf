"""vLLM's ``BlockPool``, made elastic in place: its class is swapped for a subclass that asks the
:class:`~kvplan.integrations.vllm.elastic._scheduler.SchedulerSide` (same object, so the
managers that hold the pool keep it)."""

from __future__ import annotations

from typing import Any

from kvplan.integrations.vllm.elastic._scheduler import SchedulerSide


class _ElasticPool:
    """Mixed into the class of the scheduler's ``BlockPool`` (see :func:`make_elastic`)."""

    _kvplan: SchedulerSide

    def get_num_free_blocks(self) -> int:
        vanilla: int = super().get_num_free_blocks()  # type: ignore[misc]
        return self._kvplan.free_count(vanilla)

    def get_new_blocks(self, num_blocks: int) -> list[Any]:
        side = self._kvplan
        found = False
        if side.tight():
            chosen = side.choose(num_blocks)
            found = len(chosen) >= num_blocks  # else vLLM raises as when it runs out
            if found:
                queue = self.free_block_queue  # type: ignore[attr-defined]
                picked = [self.blocks[b] for b in chosen]  # type: ignore[attr-defined]
                for block in picked:
                    queue.remove(block)
                queue.prepend_n(picked)  # vLLM pops exactly these
        # the blocks are found: vLLM's own "enough free blocks?" check needs no second count
        side.plain_count = found
        try:
            got: list[Any] = super().get_new_blocks(num_blocks)  # type: ignore[misc]
        finally:
            side.plain_count = False
        side.backed([b.block_id for b in got])
        return got

    def free_blocks(self, ordered_blocks: Any) -> None:
        super().free_blocks(ordered_blocks)  # type: ignore[misc]
        self._kvplan.changed()

    def touch(self, blocks: Any) -> None:
        super().touch(blocks)  # type: ignore[misc]
        self._kvplan.changed(freed=False)

    def evict_blocks(self, block_ids: set[int]) -> None:
        super().evict_blocks(block_ids)  # type: ignore[misc]
        self._kvplan.changed()

    def reset_prefix_cache(self) -> bool:
        # vLLM resets only when every block but the null block is free: count them as vLLM
        # does (under a binding limit the elastic count is smaller, and the reset would fail)
        side = self._kvplan
        side.plain_count = True
        try:
            done: bool = super().reset_prefix_cache()  # type: ignore[misc]
        finally:
            side.plain_count = False
        side.changed()
        return done


_POOL_CLASSES: dict[type, type] = {}


def make_elastic(pool: Any, side: SchedulerSide) -> None:
    """Turn vLLM's ``pool`` into an elastic pool in place (its managers keep the object)."""
    base = type(pool)
    cls = _POOL_CLASSES.get(base)
    if cls is None:
        cls = _POOL_CLASSES[base] = type(f"Elastic{base.__name__}", (_ElasticPool, base), {})
    pool.__class__ = cls
    pool._kvplan = side


def side_of(scheduler: Any) -> SchedulerSide | None:
    """The elastic state of ``scheduler``'s block pool (``None``: the pool is vLLM's own)."""
    pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
    side: SchedulerSide | None = getattr(pool, "_kvplan", None)
    return side
