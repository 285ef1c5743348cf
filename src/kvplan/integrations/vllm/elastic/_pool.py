"""vLLM's ``BlockPool``, made elastic in place: its class is swapped for a subclass that asks the
:class:`~kvplan.integrations.vllm.elastic._scheduler.SchedulerSide` (same object, so the
managers that hold the pool keep it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.elastic._scheduler import SchedulerSide

if TYPE_CHECKING:
    from kvplan.elastic.admission import AdmissionIndex


class _ElasticPool:
    """Mixed into the class of the scheduler's ``BlockPool`` (see :func:`make_elastic`)."""

    _kvplan: SchedulerSide

    def get_num_free_blocks(self) -> int:
        vanilla: int = super().get_num_free_blocks()  # type: ignore[misc]
        side = self._kvplan
        if side.plain_count or not side.tight():  # vLLM asks several times a step
            return vanilla
        return side.free_count(vanilla)

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
        side.handed_out(len(got))
        return got

    def free_blocks(self, ordered_blocks: Any, *args: Any, **kwargs: Any) -> None:
        """vLLM's, then the freed blocks that are backed and hold no cache entry go to the
        front of the free queue, so vLLM hands them out again first: their pages are reused
        (the reserve, see :meth:`SchedulerSide.reserve_target`) instead of being given back
        while blocks further along are mapped. Blocks with cache entries keep vLLM's order
        (the LRU order of its prefix cache); for uncached blocks the order changes nothing
        but which pages back them. Further arguments are vLLM's own (0.34: ``evict_first``);
        blocks of another pool (0.34's ``KVCacheBlock.pool``) are that pool's to order."""
        blocks = list(ordered_blocks)
        super().free_blocks(blocks, *args, **kwargs)  # type: ignore[misc]
        side = self._kvplan
        backed = side.ledger.backed
        own = getattr(self, "_weak_self", None)
        spare = [
            b
            for b in blocks
            if b.ref_cnt == 0
            and b.block_hash is None
            and b.block_id in backed
            and b.block_id
            and getattr(b, "pool", None) in (None, own)
        ]
        if spare:
            queue = self.free_block_queue  # type: ignore[attr-defined]
            for block in spare:
                queue.remove(block)
            queue.prepend_n(spare)
        side.changed()

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
        if done and side.index is not None:
            side.index.evicted(b.block_id for b in self.free_block_queue.get_all_free_blocks())  # type: ignore[attr-defined]
        side.changed()
        return done

    def _maybe_evict_cached_block(self, block: Any) -> bool:
        evicted: bool = super()._maybe_evict_cached_block(block)  # type: ignore[misc]
        index = self._kvplan.index
        if evicted and index is not None:
            index.evicted([block.block_id])
        return evicted


_POOL_CLASSES: dict[type, type] = {}


def make_elastic(pool: Any, side: SchedulerSide) -> None:
    """Turn vLLM's ``pool`` into an elastic pool in place (its managers keep the object)."""
    base = type(pool)
    cls = _POOL_CLASSES.get(base)
    if cls is None:
        cls = _POOL_CLASSES[base] = type(f"Elastic{base.__name__}", (_ElasticPool, base), {})
    pool.__class__ = cls
    pool._kvplan = side
    if side.ledger.uniform_block_cost is None:
        index_free_queue(pool, side)


def index_free_queue(pool: Any, side: SchedulerSide) -> None:
    """Blocks share chunks (cuda-vmm's 2 MiB chunks under smaller pages): admission under a
    binding limit counts and picks from an :class:`~kvplan.elastic.admission.AdmissionIndex`
    (O(log n)) instead of walking vLLM's free queue. The index follows the queue: its
    instance's ``append(_n)`` / ``prepend_n`` / ``popleft(_n)`` / ``remove`` tell it (every
    way a block enters or leaves vLLM's free queue), evictions come through the pool, backing
    and unbacking through the ledger."""
    from kvplan.elastic.admission import AdmissionIndex

    queue = pool.free_block_queue
    free = queue.get_all_free_blocks()
    index = AdmissionIndex(
        side.ledger,
        [b.block_id for b in free],
        cached=[b.block_id for b in free if b.block_hash is not None],
    )
    follow_free_queue(queue, index)
    side.index = index


def follow_free_queue(queue: Any, index: AdmissionIndex) -> None:
    """Make ``index`` follow vLLM's free queue ``queue`` (a ``FreeKVCacheBlockQueue``): its
    instance's ``append(_n)`` / ``prepend_n`` / ``popleft(_n)`` / ``remove`` tell the index
    which blocks entered (with or without a prefix-cache entry) or left."""
    append_n, prepend_n, popleft_n = queue.append_n, queue.prepend_n, queue.popleft_n
    popleft, remove, append = queue.popleft, queue.remove, queue.append

    def ids(blocks: Any) -> list[int]:
        return [b.block_id for b in blocks]

    def hashed(blocks: Any) -> list[int]:
        return [b.block_id for b in blocks if b.block_hash is not None]

    def on_append_n(blocks: Any) -> None:
        append_n(blocks)
        index.appended(ids(blocks), cached=hashed(blocks))

    def on_append(block: Any) -> None:
        append(block)
        index.appended([block.block_id], cached=hashed([block]))

    def on_prepend_n(blocks: Any) -> None:
        prepend_n(blocks)
        index.prepended(ids(blocks), cached=hashed(blocks))

    def on_popleft_n(n: int) -> Any:
        got = popleft_n(n)
        index.removed(ids(got))
        return got

    def on_popleft() -> Any:
        got = popleft()
        index.removed([got.block_id])
        return got

    def on_remove(block: Any) -> None:
        remove(block)
        index.removed([block.block_id])

    queue.append_n, queue.prepend_n, queue.popleft_n = on_append_n, on_prepend_n, on_popleft_n
    queue.popleft, queue.remove, queue.append = on_popleft, on_remove, on_append


def side_of(scheduler: Any) -> SchedulerSide | None:
    """The elastic state of ``scheduler``'s block pool (``None``: the pool is vLLM's own)."""
    pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
    side: SchedulerSide | None = getattr(pool, "_kvplan", None)
    return side
