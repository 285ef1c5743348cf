"""Suite-wide settings: vLLM runs on the CPU platform, offline."""

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests import _deadline

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config: pytest.Config) -> None:
    """The session's main process (the xdist controller, before its workers start) gives
    this run the id that marks every engine process the tests start, and starts filling
    vLLM's model-class cache for the suite's models beside the tests (``harness.vllm_cache``:
    one process, where each class missing from the cache cost a test a subprocess that
    imports vLLM again; a cache warmed before returns at once)."""
    if not hasattr(config, "workerinput"):
        from harness.engine import _leftovers

        _leftovers.start_run()
        # once per session tree: not in a pytest a test starts (its marks), nor in an engine
        # venv's (warmed when the venv was built)
        if not {_leftovers.MARK_VAR, _WARM_VAR} & set(os.environ):
            os.environ[_WARM_VAR] = "1"
            _WARMING.append(_VllmCacheWarmUp.start())


_WARM_VAR = "KVPLAN_TESTS_WARMING_VLLM_CACHE"


class _VllmCacheWarmUp:
    """The suite's venv's warm-up of vLLM's model-class cache, run beside the session and
    reported at its end (an optimization: a failed one costs time, not a result -- but it
    is said, with why)."""

    def __init__(self, process: Any, output: Any) -> None:
        self.process = process
        self.output = output

    @classmethod
    def start(cls) -> "_VllmCacheWarmUp":
        from harness import vllm_cache

        command = vllm_cache.warm_command(sys.executable, vllm_cache.suite_architectures())
        # a file, not a pipe (nobody reads a pipe while it runs: full, it would block);
        # closed by finish()
        output = tempfile.TemporaryFile("w+")  # noqa: SIM115
        return cls(subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT), output)

    def finish(self) -> str:
        """One line on what it did; still running (a short session), it is stopped."""
        from harness import vllm_cache

        try:
            try:
                self.process.wait(timeout=3)  # a cache warmed before: the marker, read at once
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                return "vLLM's model-class cache: warm-up stopped with the session, unfinished"
            self.output.seek(0)
            said = self.output.read()
            return vllm_cache.parse(self.process.returncode, said, "").describe()
        except RuntimeError as exc:
            return str(exc)
        finally:
            self.output.close()


_WARMING: list[_VllmCacheWarmUp] = []
_WARM_SAID: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for said in _WARM_SAID:
        terminalreporter.write_line(said)


def pytest_report_header(config: pytest.Config) -> str:
    """What the machine has, at the top of the output (a CI log may keep only its ends)."""
    import shutil

    pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    free = shutil.disk_usage(config.rootpath).free
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"machine: {os.cpu_count()} cores, {pages * page / 2**30:.1f} GiB memory, "
        f"{free / 2**30:.1f} GiB free on the checkout's disk, load {load}"
    )


_DEADLINE = _deadline.TestDeadline()
_WATCH: list[_deadline.Silence] = []
_SCHEDULER: list[Any] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Every test's call runs under a deadline (``tests/_deadline.py``)."""
    _DEADLINE.arm(item.nodeid)
    try:
        yield
    finally:
        _DEADLINE.disarm()


def pytest_sessionstart(session: pytest.Session) -> None:
    """The xdist controller watches for a session that stops moving (``tests/_deadline``)."""
    config = session.config
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("dsession"):
        return
    from harness.engine import _leftovers

    def write(text: str) -> None:
        capture = config.pluginmanager.get_plugin("capturemanager")
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        with capture.global_and_fixture_disabled():
            reporter.write_line(text)

    def state() -> str:
        return _SCHEDULER[0].describe() if _SCHEDULER else "(no scheduler yet)"

    def reap() -> None:
        left = _leftovers.reap(os.environ.get(_leftovers.RUN_VAR, ""), grace=0)
        write(f"killed {len(left)} engine processes of this run")
        kept = _leftovers.end_run(passed=False)
        if kept:
            write(f"{_leftovers.KEPT_SAID}{kept}")

    _WATCH.append(_deadline.Silence(write=write, state=state, on_fire=reap).start())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for watch in _WATCH:
        watch.heard()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In the main process, once every test is done: no engine process is left (vLLM's
    engine cores and workers, a second node's tree, Ray's daemons); any that outlives a grace
    is killed, and fails the run. The engines' temporary directory goes with a run that
    passed (``_leftovers.end_run``)."""
    from harness.engine import _leftovers

    for watch in _WATCH:
        watch.stop()
    if hasattr(session.config, "workerinput") or _leftovers.MARK_VAR in os.environ:
        return  # an xdist worker, or a pytest an engine test started (in an engine venv)
    _WARM_SAID.extend(warming.finish() for warming in _WARMING)  # (said in the summary)
    _WARMING.clear()
    left = _leftovers.reap(os.environ.get(_leftovers.RUN_VAR, ""))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if left:
        lines = "\n".join(f"  {pid}: {line}" for pid, line in sorted(left.items()))
        if reporter is not None:
            reporter.write_line(f"engine processes outlived the suite (killed now):\n{lines}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    kept = _leftovers.end_run(passed=session.exitstatus == pytest.ExitCode.OK)
    if kept and reporter is not None:
        reporter.write_line(f"{_leftovers.KEPT_SAID}{kept}")


@pytest.hookimpl(optionalhook=True)  # an engine venv's pytest has no xdist
def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """With pytest-xdist (``-n 2`` in pyproject's addopts): the engine tests in the units of
    ``tests.engine._units`` (a unit's tests on one worker, in collection order), every other
    test a unit of its own (or of its file's: ``_units.scope_of``) on whichever worker is
    free, and two units held back: ``beside-the-rest`` until no worker holds a test of a
    steady engine unit (it then goes to the next worker with room, ahead of the rest of the
    suite, which the other worker goes on with), ``timed`` until no other test is left to
    run. (xdist's own ``--dist loadgroup`` groups by a suffix it adds to node ids, which
    pytest 9 no longer keeps.)

    A worker never runs the last test it was sent until it gets more or is told to stop
    (pytest needs the next item to tear fixtures down), so "nothing else left" is: no worker
    holds more than that one test. The other workers are then stopped (each runs its last
    test and exits), and once their last tests are done the held-back units still queued go
    to the one kept, in order.
    """
    from xdist.scheduler import LoadScopeScheduling

    from tests.engine import _units

    MORE_AT = 2
    """xdist's own threshold: a worker holding this many tests or fewer is sent its next unit.
    The held-back unit is sent at the same point -- at a lower one it would never be sent
    while units of the rest are queued (xdist tops a worker up to more), and waited for the
    whole rest of the suite."""

    class EngineUnits(LoadScopeScheduling):
        keeper = None
        """The worker the timed unit goes to (chosen when nothing else is left)."""

        def _split_scope(self, nodeid: str) -> str:
            return _units.scope_of(nodeid)

        def schedule(self) -> None:
            self.config.option.loadscopereorder = False  # collection order is the plan
            super().schedule()

        def mark_test_complete(self, node, item_index, duration=0):  # type: ignore[no-untyped-def]
            super().mark_test_complete(node, item_index, duration)
            for other in list(self.nodes):  # a worker waiting for a held-back unit
                if other is not node:
                    self._reschedule(other)

        def _pending(self, node) -> int:  # type: ignore[no-untyped-def]
            return self._pending_of(self.assigned_work.get(node, {}))

        def _steady_left(self) -> bool:
            """Whether a steady engine unit is still queued, or a worker holds one of its
            tests not yet done."""
            return any(unit in self.workqueue for unit in _units.STEADY) or any(
                not all(tests.values())
                for n in self.nodes
                for unit, tests in self.assigned_work.get(n, {}).items()
                if unit in _units.STEADY
            )

        def _reschedule(self, node) -> None:  # type: ignore[no-untyped-def]
            queue = self.workqueue
            if (
                _units.BESIDE in queue
                and not node.shutting_down
                and self._pending(node) <= MORE_AT
                and not self._steady_left()
            ):
                queue.move_to_end(_units.BESIDE, last=False)  # ahead of the rest
                self._assign_work_unit(node)
                return
            if not queue or next(iter(queue)) not in _units.HELD:
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

        def describe(self) -> str:
            """What each worker holds and what waits (for a session that stopped moving)."""
            lines = []
            for node in self.nodes:
                held = [
                    nodeid
                    for unit in self.assigned_work.get(node, {}).values()
                    for nodeid, done in unit.items()
                    if not done
                ]
                down = " (stopping)" if node.shutting_down else ""
                first = ", ".join(held[:3])
                lines.append(f"  worker {node.gateway.id}{down} holds {len(held)}: {first}")
            queued = list(self.workqueue)
            keeper = self.keeper.gateway.id if self.keeper is not None else "none"
            lines.append(f"  waiting: {len(queued)} units {queued[:3]}; timed unit keeper {keeper}")
            return "\n".join(lines)

    scheduler = EngineUnits(config, log)
    _SCHEDULER.append(scheduler)
    return scheduler
