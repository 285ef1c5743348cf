"""Giving memory back while vLLM does not step: the engine core's watcher.

vLLM steps an engine only while it has requests. An idle engine therefore never ran
``Scheduler.schedule``, where kvplan looks at its group and its limit file and gives memory
back: a borrower idling for an hour kept what it borrowed, and a claim of another member
waited for it (``docs/elastic.md``, "Reclaim without a step").

:class:`Watcher` is a thread of the engine-core process. While no request is unfinished
(``SchedulerSide.quiet``, which the steps keep) it looks every :data:`WATCH_SECONDS`; while the
engine steps it sleeps until a step's output leaves no request unfinished (each step looks
itself; a thread waking every 50 ms took the GIL and a core from a stepping engine). It looks
without any lock at what could make the idle engine owe memory: the group's ledger changed
since the member last read it (another member claims, the budget moved), ``limit.json``
changed, or the engine maps more than its effective limit. When one did and no request is
unfinished, it has :func:`reclaim_idle` run, which gives back exactly as a step would (the
tick, the trim: cached pages, then the reserve, their cache entries evicted through vLLM's own
pool), sends the unmaps to every rank through vLLM's ``collective_rpc`` (each rank runs it in
its RPC order) and, once every rank returned, gives the grant back to the group.

The same path **maps ahead**: when the reserve of free, backed pages (``KVPLAN_RESERVE``) is
short after a burst and the limit (the grant included) has room, the idle engine backs the
blocks at the front of vLLM's free queue -- the ones it hands out next -- so the next burst's
first blocks need no map inside its step. A map ahead that fails on a rank is undone on every
rank and is no request's concern (no block of a request is involved).

Where the reclaim runs is vLLM's own choice of thread for engine-core work:

* **the engine core's busy loop** (``EngineCoreProc``: vLLM's default, and the OpenAI
  server's): the watcher puts :data:`WAKE` on the loop's input queue, the queue vLLM's clients
  and its executor-failure callback use; the loop, blocked on that queue while idle, wakes and
  handles it (``EngineCoreProc._handle_client_request``, wrapped) on its own thread, between
  requests, never during a step;
* **the in-process engine core** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the caller's thread
  steps it, and nothing runs while the caller does not): the watcher runs the reclaim itself,
  holding the scheduler side's lock, which kvplan's ``schedule`` and ``update_from_output``
  hooks hold too; it acts only while no request is unfinished, so no step is in flight (a
  step's ``execute_model`` runs between the two hooks, while its requests are unfinished).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from kvplan.schemas.errors import KVPlanError

if TYPE_CHECKING:
    from kvplan.integrations.vllm.elastic._scheduler import SchedulerSide

logger = logging.getLogger("vllm.kvplan")

WATCH_SECONDS = 0.05
"""How often the watcher looks while no request is unfinished (two ``lstat`` calls when
nothing changed)."""
BUSY_WATCH_SECONDS = 1.0
"""How often it looks while requests are unfinished and no step told it that none is (the
engine steps then, and each step looks itself): a safety net, not the way it wakes."""
WAKE = "kvplan-elastic-reclaim"
"""The request type the watcher puts on ``EngineCoreProc.input_queue``."""


def idle(engine_core: Any, scheduler: Any, side: SchedulerSide) -> bool:
    """No request is unfinished and nothing is in flight, so vLLM may not step this engine
    again until a request arrives. (Finished requests not yet reported to the workers do not
    count: ``LLM.generate`` stops stepping an in-process engine once none is unfinished, so
    the step that would report them -- and carry the last unmaps -- may never run; their
    blocks are free already.) A step scheduled and not yet through ``update_from_output``
    (the step that reports finished requests runs with none unfinished) is in flight."""
    if side.stepping or scheduler.get_num_unfinished_requests():
        return False
    return not getattr(engine_core, "batch_queue", None)


def reclaim_idle(engine_core: Any, scheduler: Any, side: SchedulerSide) -> bool:
    """Give back what an idle engine owes, as its next step would, without one. Runs on the
    engine loop's thread, or under ``side.lock`` (see the module doc). True when it sent
    operations to the workers."""
    with side.lock:
        if not idle(engine_core, scheduler, side):
            return False  # it steps: ``schedule`` gives back (and preempts) there
        side.before_schedule(scheduler, force_tick=True)
        if side.wants_ahead():
            side.map_ahead()
        ops = side.ops()
        if ops is None:
            side.confirm(side.seq, idle=True)
            return False
        send(engine_core, side, ops)
        side.confirm(ops.seq, idle=True)  # every rank returned: the unmaps ran
        return True


def send(engine_core: Any, side: SchedulerSide, ops: Any) -> None:
    """``ops`` to every rank (``collective_rpc``), in its RPC order; when a rank could not
    map -- ahead, or a busy engine's map ahead that these operations join (mapped again with
    them) -- every rank unmaps those blocks again (the ones that mapped them) and the
    scheduler unbacks them (:meth:`SchedulerSide.ahead_failed`): free blocks, no request's
    concern (no step ran since that map ahead: the scheduler sends the step after one that
    maps ahead operations, which would have joined it)."""
    import dataclasses

    from kvplan.integrations.vllm.elastic._worker import apply_between_steps

    executor = engine_core.model_executor
    failures = [f for f in executor.collective_rpc(apply_between_steps, args=(ops,)) if f]
    blocks = ops.map + ops.joins(side.joining)
    if not failures or not blocks:
        return
    side.ahead_failed(blocks, failures[0])
    side.seq += 1
    undo = dataclasses.replace(ops, seq=side.seq, unmap=blocks, map=())
    executor.collective_rpc(apply_between_steps, args=(undo,))


class Watcher:
    """The engine core's thread that gives memory back while vLLM does not step (module
    doc). Started with the elastic scheduler, stopped when the engine core shuts down."""

    def __init__(self, engine_core: Any, scheduler: Any, side: SchedulerSide) -> None:
        self.engine_core = engine_core
        self.scheduler = scheduler
        self.side = side
        self.queue = getattr(engine_core, "input_queue", None)
        """The busy loop's input queue (``None``: the in-process engine core)."""
        self.woken = threading.Event()
        """Set while a :data:`WAKE` is queued and not yet handled (one at a time)."""
        self.reclaims = 0
        """Reclaims that sent operations to the workers (for tests)."""
        self.failed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvplan-reclaim", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.side.quiet.set()  # wakes a watcher waiting for the engine to go quiet
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2)

    def due(self) -> bool:
        """Something may make the idle engine owe memory, or its reserve is short (no lock:
        plain reads)."""
        side = self.side
        if side.ledger.mapped_bytes > side.effective_limit() or side.wants_ahead():
            return True
        if side.reserve_bytes > side.reserve:  # a busy engine's reserve, now idle
            return True
        group = side.group
        if group is not None and not side.group_failed and group.changed():
            return True
        return side.limit_file_changed()

    def _run(self) -> None:
        quiet = self.side.quiet
        while True:
            if not quiet.is_set():  # requests are unfinished: the engine's steps look
                quiet.wait(BUSY_WATCH_SECONDS)
            if self._stop.wait(WATCH_SECONDS):
                return
            try:
                if self.woken.is_set() or not self.due():
                    continue
                if not idle(self.engine_core, self.scheduler, self.side):
                    continue  # it steps: the step's own look acts
                if self.queue is not None:
                    self.woken.set()
                    self.queue.put_nowait((WAKE, None))
                elif reclaim_idle(self.engine_core, self.scheduler, self.side):
                    self.reclaims += 1
            except Exception as exc:  # the watcher must never take the engine down
                self._failed(exc)
                return

    def handle(self) -> None:
        """The busy loop took :data:`WAKE` off its queue: reclaim on the loop's thread."""
        self.woken.clear()
        try:
            if reclaim_idle(self.engine_core, self.scheduler, self.side):
                self.reclaims += 1
        except KVPlanError as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.failed = True
        self._stop.set()
        logger.error(
            "kvplan: giving memory back while the engine idles failed (%s: %s); an idle "
            "engine now gives back at its next step only",
            type(exc).__name__, exc,
        )  # fmt: skip
