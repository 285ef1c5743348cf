"""Suite-wide settings: vLLM runs on the CPU platform, offline."""

import os

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.hookimpl(optionalhook=True)  # an engine venv's pytest has no xdist
def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """With pytest-xdist (``-n 2`` in pyproject's addopts): the engine tests in the units of
    ``tests.engine._units`` (a unit's tests on one worker, in collection order), every other
    test a unit of its own on whichever worker is free, and the ``timed`` unit held back
    until no other test is left to run. (xdist's own ``--dist loadgroup`` groups by a suffix
    it adds to node ids, which pytest 9 no longer keeps.)

    A worker never runs the last test it was sent until it gets more or is told to stop
    (pytest needs the next item to tear fixtures down), so "nothing else left" is: no worker
    holds more than that one test. The other workers are then stopped (each runs its last
    test and exits), and once their last tests are done the timed unit goes to the one kept.
    """
    from xdist.scheduler import LoadScopeScheduling

    from tests.engine import _units

    class EngineUnits(LoadScopeScheduling):
        keeper = None
        """The worker the timed unit goes to (chosen when nothing else is left)."""

        def _split_scope(self, nodeid: str) -> str:
            return _units.unit_of(nodeid) or nodeid

        def schedule(self) -> None:
            self.config.option.loadscopereorder = False  # collection order is the plan
            super().schedule()

        def mark_test_complete(self, node, item_index, duration=0):  # type: ignore[no-untyped-def]
            super().mark_test_complete(node, item_index, duration)
            for other in list(self.nodes):  # a worker waiting for the timed unit
                if other is not node:
                    self._reschedule(other)

        def _pending(self, node) -> int:  # type: ignore[no-untyped-def]
            return self._pending_of(self.assigned_work.get(node, {}))

        def _reschedule(self, node) -> None:  # type: ignore[no-untyped-def]
            if not self.workqueue or next(iter(self.workqueue)) != _units.TIMED:
                super()._reschedule(node)
                return
            if any(self._pending(n) > 1 for n in self.nodes):
                return  # other tests still run: the timed tests wait for them
            if self.keeper is None or self.keeper not in self.nodes:
                self.keeper = next((n for n in self.nodes if not n.shutting_down), None)
            if self.keeper is None:
                return
            others = [n for n in self.nodes if n is not self.keeper]
            for other in others:
                if not other.shutting_down:
                    other.shutdown()  # it runs the one test it holds, then exits
            if not any(self._pending(n) for n in others):
                super()._reschedule(self.keeper)

    return EngineUnits(config, log)
