"""No test hangs the suite: a test that runs too long fails, and a session that stops moving
ends, both saying where they were.

- :class:`TestDeadline`, in each process that runs tests (an xdist worker, or a run without
  xdist): a test whose call runs past :data:`TEST_DEADLINE_S` fails with the stacks of every
  thread of its process (``SIGUSR2`` to the main thread, whose handler raises
  ``pytest.fail``: a ``BaseException``, which ``except Exception`` does not swallow); if the
  test is still running :data:`KILL_AFTER_S` later (a call that does not return to Python),
  the process prints the stacks and exits, which xdist reports as the test crashing its worker.
  Engine drivers have tighter bounds of their own (``harness.run_engines``): this is the net
  under every test, fixtures' own subprocess bounds aside.
- :class:`Silence`, in the xdist controller: when no test has reported for
  :data:`SILENCE_S` (a scheduler that holds work back forever, a worker that never answers),
  it writes what each worker holds and what waits, kills the engine processes of the run and
  exits with 3.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

import pytest

TEST_DEADLINE_S = 1200.0
"""The longest a test's call may run: the longest one seen took 529 s (an elastic suite's
engines for one release, the first test that asks for them, on a loaded 2-core machine)."""
KILL_AFTER_S = 60.0
"""How long a test past its deadline has to get back to Python before its process ends."""
SILENCE_S = float(os.environ.get("KVPLAN_TESTS_SILENCE_S", "1800"))
"""The longest the session may go without a test report: longer than one test's deadline
plus its kill, and than the longest fixture setup (the engine venvs of a unit, built in turn).
``KVPLAN_TESTS_SILENCE_S`` sets it (the test of this watch runs a session with a short one)."""


def stacks() -> str:
    """Where every thread of this process is now."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        where = "".join(traceback.format_stack(frame))
        parts.append(f"--- thread {names.get(ident, ident)}:\n{where}")
    return "\n".join(parts)


class TestDeadline:
    """The deadline of the test running in this process now (one at a time)."""

    __test__ = False  # not a test class

    def __init__(self, seconds: float = TEST_DEADLINE_S, kill_after: float = KILL_AFTER_S):
        self.seconds, self.kill_after = seconds, kill_after
        self._timers: list[threading.Timer] = []
        self._nodeid = ""
        self._report = ""
        self._armed = False
        self._previous: object = signal.SIG_DFL

    def arm(self, nodeid: str) -> None:
        self._nodeid, self._armed = nodeid, True
        self._previous = signal.signal(signal.SIGUSR2, self._raise)
        self._start(self.seconds, self._expire)

    def disarm(self) -> None:
        self._armed = False
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        signal.signal(signal.SIGUSR2, self._previous)  # type: ignore[arg-type]

    def _start(self, seconds: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def _expire(self) -> None:
        if not self._armed:
            return
        self._report = (
            f"{self._nodeid} ran past its deadline of {self.seconds:.0f} s "
            f"(tests/_deadline.py); where its process was:\n{stacks()}"
        )
        self._start(self.kill_after, self._kill)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR2)

    def _raise(self, signum: int, frame: object) -> None:
        if not self._armed:  # the test ended as the deadline passed
            return
        pytest.fail(self._report, pytrace=True)

    def _kill(self) -> None:
        os.write(2, f"{self._report}\n... and it did not stop: exiting now\n".encode())
        os._exit(3)


class Silence:
    """The controller's watch for a session that stopped moving."""

    def __init__(self, seconds: float | None = None, *, write: Callable[[str], None],
                 state: Callable[[], str], on_fire: Callable[[], None]):  # fmt: skip
        self.seconds = SILENCE_S if seconds is None else seconds
        self.write, self.state, self.on_fire = write, state, on_fire
        self.last = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kvplan-silence", daemon=True)

    def start(self) -> Silence:
        self._thread.start()
        return self

    def heard(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(min(30.0, self.seconds / 4)):
            quiet = time.monotonic() - self.last
            if quiet >= self.seconds:
                self.write(
                    f"no test reported for {quiet:.0f} s (tests/_deadline.py): the session "
                    f"is stuck; stopping it.\n{self.state()}"
                )
                self.on_fire()
                os._exit(3)
