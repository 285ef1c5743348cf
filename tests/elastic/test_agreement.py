"""The ranks of one step agree on a failed map across tensor *and* pipeline parallelism.

Four processes on gloo (``torch.distributed``, 127.0.0.1), numbered as vLLM numbers a TP=2 x
PP=2 engine (rank ``pp * 2 + tp``), each with its TP group and its PP group as vLLM builds
them: whichever rank's map fails -- one, two or none -- every rank learns the same failing
ranks (``failed_ranks``). With the TP group alone (before pipeline stages were served) a
failure on the first stage never reached the last stage, whose output is the one the
scheduler reads.
"""

from __future__ import annotations

import multiprocessing
import socket
from types import SimpleNamespace
from typing import Any

import pytest

TP, PP = 2, 2
WORLD = TP * PP
CASES: list[tuple[int, ...]] = [(), (0,), (1,), (2,), (3,), (0, 3), (1, 2)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _coordinators(members: list[list[int]], rank: int, dist: Any) -> SimpleNamespace:
    """What ``agree_across_ranks`` reads of vLLM's ``GroupCoordinator``: ``rank``'s group of
    ``members`` (every rank makes every group, as ``torch.distributed`` wants)."""
    groups = [dist.new_group(ranks, backend="gloo") for ranks in members]
    ranks, group = next((r, g) for r, g in zip(members, groups, strict=True) if rank in r)
    return SimpleNamespace(world_size=len(ranks), rank_in_group=ranks.index(rank), cpu_group=group)


def _rank_main(rank: int, port: int, queue: Any, tp_only: bool) -> None:
    import torch.distributed as dist

    from kvplan.integrations.vllm.elastic._recovery import failed_ranks

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=WORLD, rank=rank
    )
    try:
        tp = _coordinators([[p * TP + t for t in range(TP)] for p in range(PP)], rank, dist)
        pp = _coordinators([[p * TP + t for p in range(PP)] for t in range(TP)], rank, dist)
        groups = [tp] if tp_only else [tp, pp]
        seen = [failed_ranks(rank in case, groups) for case in CASES]
        queue.put((rank, seen))
    finally:
        dist.destroy_process_group()


def _run(tp_only: bool) -> dict[int, list[tuple[int, ...]]]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    procs = [
        context.Process(target=_rank_main, args=(r, port, queue, tp_only)) for r in range(WORLD)
    ]
    for proc in procs:
        proc.start()
    try:
        results = dict(queue.get(timeout=60) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    assert all(proc.exitcode == 0 for proc in procs), [p.exitcode for p in procs]
    return results


@pytest.fixture(scope="module")
def agreed() -> dict[int, list[tuple[int, ...]]]:
    return _run(tp_only=False)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(c) for c in CASES])
def test_every_rank_of_tp_times_pp_learns_every_failure(
    agreed: dict[int, list[tuple[int, ...]]], index: int
) -> None:
    for rank in range(WORLD):
        assert agreed[rank][index] == CASES[index], rank


def test_the_tp_group_alone_leaves_the_other_stage_unaware() -> None:
    """The reason for the PP round: with TP's all-reduce only, the last stage (ranks 2, 3:
    the output rank is 2) never hears of the first stage's failure."""
    results = _run(tp_only=True)
    first_stage_fails = CASES.index((0,))
    assert results[0][first_stage_fails] == (0,)
    assert results[2][first_stage_fails] == ()
