"""The incremental admission index against ``admit``: random pool events (hand-outs, frees at
either end of the queue, prefix hits, evictions, trims, limit changes) × seeds, on uniform
and chunk-sharing ledgers built from real plans."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import _builders as builders
from kvplan.elastic.admission import AdmissionIndex, Fenwick
from kvplan.elastic.ledger import FreeBlock, Ledger, admit, trim
from tests.elastic.test_ledger import PAGE, plan_of

LAYOUTS = {
    "llama": lambda: builders.llama(num_blocks=160),
    "gemma4-LBNHC-sharing": lambda: builders.gemma4_e2b("LBNHC", 96),
    "gemma4-BLHNC-block-outermost": lambda: builders.gemma4_e2b("BLHNC", 96),
    "mamba-hybrid-padded": lambda: builders.mamba_hybrid(40),
    "mla": lambda: builders.mla(),
}
CHUNKS = [PAGE, 16 * PAGE, 1 << 21]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_index_knows_every_blocks_chunks_by_arithmetic(layout: str, chunk: int) -> None:
    ledger = Ledger(plan_of(LAYOUTS[layout]()), chunk)
    index = AdmissionIndex(ledger, range(1, ledger.num_blocks))
    users: dict[tuple[int, int], set[int]] = {}
    for b in range(ledger.num_blocks):
        assert index.block_chunks(b) == set(ledger.chunks(b))
        assert index.nchunks(b) == len(ledger.chunks(b))
        for c in ledger.chunks(b):
            users.setdefault(c, set()).add(b)
    for c, expected in users.items():
        got = {b for lo, hi in index.users(c) for b in range(lo, hi + 1)}
        assert got == expected


def model_order(ledger: Ledger, queue: list[int], cached: set[int]) -> list[int]:
    """The index's order from first principles: zero-cost blocks without cache entries in
    queue order, blocks that map memory by id, zero-cost cached blocks in queue order."""
    zero = [b for b in queue if ledger.cost(b) == 0]
    costly = sorted(b for b in queue if ledger.cost(b) > 0)
    return [b for b in zero if b not in cached] + costly + [b for b in zero if b in cached]


def admit_until_one_does_not_fit(ledger: Ledger, order: list[int], headroom: int) -> list[int]:
    """``admit`` over ``order`` that takes no block mapping memory after the first that does
    not fit (zero-cost blocks are taken throughout): the index's documented answer."""
    taken: list[int] = []
    pending: set[tuple[int, int]] = set()
    left = headroom
    stopped = False
    for b in order:
        new = [c for c in ledger.chunks(b) if not ledger.refs.get(c) and c not in pending]
        need = sum(ledger.chunk_size(c) for c in new)
        if need == 0:
            taken.append(b)
        elif not stopped and need <= left:
            left -= need
            pending.update(new)
            taken.append(b)
        else:
            stopped = True
    return taken


def run(layout: str, chunk: int, seed: int, steps: int = 120) -> int:
    """Random pool events; after each, the index's count and picks are checked. The number
    of blocks ``admit`` (which goes on past a block that does not fit) took beyond them."""
    rng = random.Random(seed)
    ledger = Ledger(plan_of(LAYOUTS[layout]()), chunk)
    ledger.back([0])
    queue = list(range(1, ledger.num_blocks))
    cached: set[int] = set()
    used: set[int] = set()
    index = AdmissionIndex(ledger, queue)
    limit = rng.randint(0, ledger.reserved_bytes)
    beyond = 0
    for _ in range(steps):
        headroom = limit - ledger.mapped_bytes
        order = model_order(ledger, queue, cached)
        assert list(index.order()) == order
        expected = admit_until_one_does_not_fit(ledger, order, max(0, headroom))
        count = index.count(headroom)
        assert count == len(expected)
        n = rng.randint(0, count + 2)
        picks = index.pick(n, headroom)
        assert picks == expected[:n]
        walked = admit(ledger, order, max(0, headroom))
        extra = set(walked) - set(expected)  # admit went on past a block that did not fit
        assert set(expected) <= set(walked) and all(ledger.cost(b) > 0 for b in extra)
        beyond += len(extra)
        op = rng.random()
        if op < 0.35 and count:  # vLLM hands out blocks the pool picked
            picks = index.pick(rng.randint(1, min(count, 8)), headroom)
            assert len(set(picks)) == len(picks) and set(picks) <= set(queue)
            cost = sum(ledger.chunk_size(c) for c in {
                c for b in picks for c in ledger.chunks(b) if not ledger.refs.get(c)
            })  # fmt: skip
            assert cost <= max(0, headroom)  # what vLLM accepts: free, and within the limit
            for b in picks:
                queue.remove(b)
                cached.discard(b)
            index.removed(picks)
            ledger.back(picks)
            used.update(picks)
        elif op < 0.6 and used:  # requests finish: uncached blocks to the front, cached back
            freed = rng.sample(sorted(used), rng.randint(1, min(6, len(used))))
            back = [b for b in freed if rng.random() < 0.5]
            front = [b for b in freed if b not in back]
            used.difference_update(freed)
            queue[:0] = front
            queue.extend(back)
            cached.update(back)
            index.prepended(front)
            index.appended(back, cached=back)
        elif op < 0.7 and cached:
            b = rng.choice(sorted(cached))
            cached.discard(b)
            if rng.random() < 0.5:  # a prefix hit: out of the queue, in use
                queue.remove(b)
                used.add(b)
                index.removed([b])
            else:
                index.evicted([b])
        elif op < 0.85:  # the trimmer gives pages back
            free = [FreeBlock(b, b in cached, i) for i, b in enumerate(queue) if b in ledger.backed]
            result = trim(
                ledger, free, limit=rng.randint(0, ledger.reserved_bytes),
                cache_limit=rng.randint(0, ledger.reserved_bytes // 4),
                reserve=rng.randint(0, ledger.reserved_bytes // 8),
            )  # fmt: skip
            cached.difference_update(result.evict)
            index.evicted(result.evict)
        else:
            limit = rng.randint(0, ledger.reserved_bytes)
    return beyond


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_index_answers_admit_over_its_order(layout: str, chunk: int, seed: int) -> None:
    beyond = run(layout, chunk, seed)
    ledger = Ledger(plan_of(LAYOUTS[layout]()), chunk)
    if ledger.uniform_block_cost is not None:
        assert beyond == 0  # every block owns its chunks at one cost: exactly admit's answer


def test_on_a_uniform_ledger_the_count_is_the_arithmetic_one() -> None:
    ledger = Ledger(plan_of(LAYOUTS["llama"]()), PAGE)
    cost = ledger.uniform_block_cost
    assert cost is not None
    ledger.back([0, 1, 2, 3])
    queue = list(range(2, ledger.num_blocks))  # 2 and 3 free and backed, 1 in use
    index = AdmissionIndex(ledger, queue)
    for headroom in (0, cost - 1, cost, 7 * cost + 5, 10**12):
        expected = 2 + min(len(queue) - 2, max(0, headroom) // cost)
        assert index.count(headroom) == expected == len(admit(ledger, queue, headroom))


def test_blocks_sharing_chunks_cost_their_chunk_once() -> None:
    """2 MiB chunks under 4 KiB pages: the first block of a run maps the run's chunks, the
    next ones are free; the count follows the union, as admit does in id order."""
    ledger = Ledger(plan_of(builders.llama(num_blocks=2048)), 1 << 21)
    ledger.back([0])
    queue = list(range(1, 2048))
    index = AdmissionIndex(ledger, queue)
    first = next(b for b in queue if ledger.cost(b) > 0)  # past the null block's chunks
    run_cost = ledger.cost(first)
    assert ledger.cost(first + 1) == run_cost  # alone it costs as much ...
    zero = len([b for b in queue if ledger.cost(b) == 0])
    assert index.count(0) == zero
    assert index.count(run_cost - 1) == zero
    sharing = len([b for b in queue if set(ledger.chunks(b)) == set(ledger.chunks(first))])
    assert index.count(run_cost) == zero + sharing  # ... with the first, nothing
    for headroom in (run_cost, 3 * run_cost, 3 * run_cost + 1):
        assert index.count(headroom) == len(admit(ledger, queue, headroom))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=80), st.data())
def test_fenwick_descents(values: list[int], data: st.DataObject) -> None:
    tree = Fenwick(values)
    for _ in range(5):
        i = data.draw(st.integers(0, len(values) - 1))
        delta = data.draw(st.integers(-values[i], 30))
        values[i] += delta
        tree.add(i, delta)
    bound = data.draw(st.integers(0, sum(values) + 5))
    longest = tree.longest_within(bound)
    assert sum(values[:longest]) <= bound
    assert longest == len(values) or sum(values[: longest + 1]) > bound
    assert all(tree.prefix(k) == sum(values[:k]) for k in range(len(values) + 1))
    ones = [1 if v % 2 else 0 for v in values]
    units = Fenwick(ones)
    positions = [i for i, v in enumerate(ones) if v]
    assert [units.kth(k) for k in range(1, len(positions) + 1)] == positions


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from(["llama", "gemma4-LBNHC-sharing", "gemma4-BLHNC-block-outermost"]),
    st.sampled_from([16 * PAGE, 1 << 21]),
    st.integers(0, 1 << 30),
)
def test_the_index_answers_admit_over_its_order_for_any_seed(
    layout: str, chunk: int, seed: int
) -> None:
    run(layout, chunk, seed, steps=60)
