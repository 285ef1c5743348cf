#!/usr/bin/env python3
"""Group budget benchmark: what a member pays per step, and per grant change.

    python benchmarks/bench_group.py [--changes 400] [--calls 200000] [--members 1,8]

Measured in this process on a group directory in ``/dev/shm`` (tmpfs, the recommended place)
and on the disk's temporary directory (``fsync`` of the ledger and its directory cost more
there): µs per call of

* ``request(need)`` within the effective limit (the no-op path of every step),
* ``release(mapped)`` within the hysteresis (no I/O), ``tick()`` between refreshes, and
  ``tick(force=True)`` with the ledger unchanged (one ``lstat``),
* a grant change: ``request`` past the grant, then ``give_back``, each one locked
  read-check-write of the ledger (reaping first: one lease probe per other member),

with 1 and with 8 members (the others idle, holding their leases in this process).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

MiB = 1 << 20


def per_call(fn: object, calls: int) -> float:
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()  # type: ignore[operator]
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def measure(base: Path, members: int, changes: int, calls: int) -> dict[str, float]:
    from kvplan.elastic.group import GroupMember, set_budget

    with tempfile.TemporaryDirectory(dir=base) as tmp:
        directory = Path(tmp)
        budget = 64 << 30
        set_budget(directory, budget, create=True)
        others = [
            GroupMember.join(directory, f"idle{i}", floor=MiB, ceiling=budget)
            for i in range(members - 1)
        ]
        m = GroupMember.join(directory, "bench", floor=MiB, ceiling=budget)
        m.hold_seconds = 0.0
        assert m.request(8 << 30)
        need = m.effective_limit // 2
        out = {
            "request within the limit": per_call(lambda: m.request(need), calls),
            "release within the hysteresis": per_call(
                lambda: m.release(m.granted - m.quantum), calls
            ),
            "tick between refreshes": per_call(m.tick, calls),
            "tick(force), ledger unchanged": per_call(lambda: m.tick(force=True), calls // 20),
        }
        low, high = 4 << 30, 12 << 30
        t0 = time.perf_counter()
        for _ in range(changes // 2):
            assert m.request(high)
            m.give_back(low)
        out["grant change (locked read-check-write)"] = (
            (time.perf_counter() - t0) / (changes // 2 * 2) * 1e6
        )
        m.leave()
        for o in others:
            o.leave()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--changes", type=int, default=400)
    parser.add_argument("--calls", type=int, default=200000)
    parser.add_argument("--members", default="1,8")
    args = parser.parse_args()
    places = [Path("/dev/shm"), Path(tempfile.gettempdir())]
    for place in places:
        if not place.is_dir():
            continue
        for members in (int(x) for x in args.members.split(",")):
            costs = measure(place, members, args.changes, args.calls)
            change = costs["grant change (locked read-check-write)"]
            noop = costs["request within the limit"]
            print(
                f"{place} ({members} member{'s' if members > 1 else ''}): "
                + ", ".join(f"{k} {v:.2f} µs" for k, v in costs.items())
                + f"; a grant change costs {change / noop:.0f}x the no-op path"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
