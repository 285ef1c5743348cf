"""The suite's own xdist scheduler (``tests/conftest.py``), driven through xdist's real
``LoadScopeScheduling`` with two stand-in workers that run what they are sent in order -- and,
as pytest does, never their last test until they get more or are told to stop."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests import conftest

STEADY = [
    "tests/engine/test_differential.py::test_d1",
    "tests/engine/test_differential.py::test_d2",
    "tests/engine/test_elastic.py::test_e1",
    "tests/engine/test_elastic.py::test_e2",
]
REST = [f"tests/cli/test_rest.py::test_{i}" for i in range(12)]
BESIDE = [
    "tests/engine/test_colocation.py::test_c1",
    "tests/engine/test_metrics.py::test_m1",
]
TIMED = ["tests/engine/test_reclaim.py::test_r1"]
COLLECTION = STEADY + REST + BESIDE + TIMED
"""In the order ``tests/engine/conftest.py`` puts them: steady units, the rest, held back."""


class Worker:
    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.queue: list[int] = []
        self.sent_while: dict[int, list[str]] = {}
        """For each test sent: what the other worker still held then."""
        self.other: Worker | None = None

    def send_runtest_some(self, indices: list[int]) -> None:
        assert self.other is not None
        for index in indices:
            self.sent_while[index] = [COLLECTION[i] for i in self.other.queue]
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def run_suite() -> tuple[list[tuple[str, str]], dict[str, Worker]]:
    """The order tests finish in (worker, node id), the two workers taking turns."""
    config: Any = SimpleNamespace(
        getvalue=lambda name: ["2*popen"] if name == "tx" else None,
        option=SimpleNamespace(loadscopereorder=True),
    )
    scheduler = conftest.pytest_xdist_make_scheduler(config, None)
    conftest._SCHEDULER.remove(scheduler)  # not this session's scheduler
    first, second = Worker("gw0"), Worker("gw1")
    first.other, second.other = second, first
    for worker in (first, second):
        scheduler.add_node(worker)
    for worker in (first, second):
        scheduler.add_node_collection(worker, COLLECTION)
    scheduler.schedule()
    done: list[tuple[str, str]] = []
    while True:
        moved = False
        for worker in (first, second):
            if len(worker.queue) > 1 or (worker.queue and worker.shutting_down):
                index = worker.queue.pop(0)
                done.append((worker.gateway.id, COLLECTION[index]))
                scheduler.mark_test_complete(worker, index)
                moved = True
        if not moved:
            return done, {"gw0": first, "gw1": second}


def test_every_test_runs_once() -> None:
    done, _ = run_suite()
    assert sorted(nodeid for _, nodeid in done) == sorted(COLLECTION)


def test_the_unit_beside_the_rest_runs_beside_it_once_the_steady_units_are_done() -> None:
    """Held back while a steady engine test runs; then sent to a worker at once, ahead of the
    rest of the suite, which the other worker goes on with (before the fix, it waited until
    no test of the rest was left to send: xdist tops a worker up while it holds two tests)."""
    done, workers = run_suite()
    order = [nodeid for _, nodeid in done]
    last_steady = max(order.index(t) for t in STEADY)
    assert all(order.index(t) > last_steady for t in BESIDE)
    for test in BESIDE:
        worker = workers[next(w for w, t in done if t == test)]
        held = worker.sent_while[COLLECTION.index(test)]
        assert not set(held) & set(STEADY), (test, held)
    left = [t for t in REST if order.index(t) > order.index(BESIDE[0])]
    assert len(left) >= len(REST) // 3, order  # the old threshold: 1 of 12 left
    beside_worker = next(w for w, t in done if t == BESIDE[0])
    others = [t for w, t in done[order.index(BESIDE[0]) :] if w != beside_worker and t in REST]
    assert others, "the other worker went on with the rest meanwhile"


def test_the_timed_unit_runs_last_with_the_machine_to_itself() -> None:
    done, workers = run_suite()
    assert done[-1][1] == TIMED[0]
    worker = workers[done[-1][0]]
    assert worker.sent_while[COLLECTION.index(TIMED[0])] == []
    assert worker.other is not None and worker.other.shutting_down
