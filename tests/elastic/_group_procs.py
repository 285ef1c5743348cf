"""Member processes for the group tests (started with multiprocessing's fork context)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from kvplan.elastic import _group_files
from kvplan.elastic.group import (
    GroupMember,
    GroupPaths,
    attach,
    read_ledger,
    read_snapshot,
)
from kvplan.schemas.errors import KVPlanError


def racer(
    directory: Path,
    name: str,
    want: int,
    free: int,
    rounds: int,
    barrier: Any,
    held: Any,
    results: Any,
    unlocked: bool,
) -> None:
    """Every round: wait for the others, ask for ``want`` bytes of the ``free`` ones at the
    same instant, record what was granted in ``held`` (shared memory, independent of the
    ledger), wait again, give it back."""
    member = GroupMember.join(directory, name, floor=0, ceiling=10 * free)
    member.hold_seconds = 0.0
    if unlocked:  # the negative control: the race itself runs without the lock (injected
        _group_files._UNLOCKED = True  # in this forked member process only)
    barrier.wait()
    for r in range(rounds):
        barrier.wait()
        got = member.request(want)
        if got:
            with held.get_lock():
                held.value += want
                if held.value > free:
                    results.put(("over", r, held.value))
        results.put(("round", r, int(got)))
        barrier.wait()
        if got:
            with held.get_lock():
                held.value -= want
            member.give_back(0)
    barrier.wait()
    _group_files._UNLOCKED = False
    member.leave()


def holder(directory: Path, name: str, floor: int, guarantee: int, need: int, ready: Any) -> None:
    """Join, get ``need`` bytes, say so, then hold them until killed."""
    member = GroupMember.join(directory, name, floor=floor, guarantee=guarantee, ceiling=need * 4)
    member.acquire(need, timeout=10)
    ready.put((member.lease_id, member.granted))
    while True:
        time.sleep(1)


def claimer(directory: Path, name: str, guarantee: int, ready: Any) -> None:
    """Join with ``guarantee`` and ask for all of it: with the bytes borrowed by others, it
    claims them; say so, then wait to be killed."""
    member = GroupMember.join(directory, name, floor=guarantee, ceiling=guarantee * 2)
    got = member.request(guarantee)
    ready.put((got, member.claim))
    while True:
        time.sleep(1)


def worker_attached(directory: Path, name: str, ready: Any) -> None:
    """A worker process of member ``name``: hold its lease, then wait to be killed."""
    lease = attach(directory, name)
    ready.put(lease.inode)
    while True:
        time.sleep(1)


def churn(directory: Path, name: str, seed: int, ceiling: int) -> None:
    """Join (reaping a dead predecessor of the same name) and request/release at random as
    fast as it can until killed."""
    rng = random.Random(seed)
    while True:
        try:
            member = GroupMember.join(
                directory, name, floor=0, guarantee=ceiling // 8, ceiling=ceiling
            )
            break
        except KVPlanError:
            time.sleep(0.01)  # the name is still held by a predecessor being reaped
    member.hold_seconds = 0.0
    while True:
        op = rng.random()
        if op < 0.5:
            member.request(rng.randint(0, ceiling))
        elif op < 0.8:
            member.give_back(rng.randint(0, ceiling // 2))
        else:
            member.tick(force=True)


def reader(directory: Path, stop: Any, results: Any) -> None:
    """Read the ledger and the snapshot in a loop; report every failure."""
    paths = GroupPaths(Path(directory))
    reads = 0
    while not stop.is_set():
        try:
            ledger = read_ledger(paths)
            assert ledger is not None
            read_snapshot(directory)
            reads += 1
        except KVPlanError as exc:
            results.put(("error", str(exc)))
        except Exception as exc:
            results.put(("crash", repr(exc)))
    results.put(("reads", reads))


def sleeper(ready: Any) -> None:
    """A forked child that neither attaches nor exits (until killed)."""
    ready.put(os.getpid())
    while True:
        time.sleep(1)
