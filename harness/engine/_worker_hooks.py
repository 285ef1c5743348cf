"""Test-only hooks inside the worker processes vLLM starts itself (run by vLLM, engine venv).

With vLLM's multiprocess executor (its default, tensor parallelism, the OpenAI server) the
model runs in worker processes the CPU platform starts with ``spawn``: what the driver patches
in its own process does not reach them. vLLM's own ``worker_cls`` option does:
``--worker-cls _worker_hooks.HookedWorker`` (engine argument ``worker_cls``) makes each worker
a :class:`HookedWorker`, vLLM's ``CPUWorker`` that first installs the hooks
``ENGINE_TEST_HOOKS`` names (comma-separated), with the driver's own functions:

* ``break=swap`` / ``break=private-sharers``: the binding broken on purpose
  (``driver.install_break``; a negative control, the tokens must change);
* ``reported-map-failure``: the map ``KVPLAN_DEBUG_FAIL_MAP`` names is made, then reported as
  failed (``driver.install_reported_map_failure``; the reference of a real failure);
* ``fail-map=R:N``: map N (1-based) of rank R alone fails, as ``KVPLAN_DEBUG_FAIL_MAP=N``
  fails it on every rank (the chunks are mapped, granting access fails, the map is rolled
  back): a failure that the rank whose output reaches the scheduler does not see;
* ``slow-steps=MS``: every step of the worker waits MS milliseconds first, so a load lasts
  long enough for something to happen while it runs whatever the machine's speed (timing
  alone does not change greedy tokens without preemption).

Without hooks it is ``CPUWorker`` unchanged. The folder of this file must be on the workers'
``sys.path`` (``PYTHONPATH``; the driver's children inherit its ``sys.path``): it is imported
as the top-level module ``_worker_hooks``, and imports ``driver`` the same way. The class is
made on first access (vLLM's ``resolve_obj_by_qualname`` is a ``getattr``), so the test suite
imports the names above without importing vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

HOOKS_ENV = "ENGINE_TEST_HOOKS"
WORKER_CLS = "_worker_hooks.HookedWorker"
FOLDER = str(Path(__file__).resolve().parent)
"""What a server's workers need on ``PYTHONPATH`` to import this module (and ``driver``): a
process the driver did not start does not inherit its ``sys.path``."""


def install(hooks: str) -> list[str]:
    """Install each hook named in ``hooks``; the names installed."""
    import driver  # harness/engine/driver.py, a top-level module here

    installed = []
    for hook in (h.strip() for h in hooks.split(",")):
        if not hook:
            continue
        if hook.startswith("break="):
            driver.install_break(hook.removeprefix("break="))
        elif hook == "reported-map-failure":
            driver.install_reported_map_failure(True)
        elif hook.startswith("slow-steps="):
            pass  # HookedWorker reads it (step_delay)
        elif hook.startswith("fail-map="):
            rank, _, number = hook.removeprefix("fail-map=").partition(":")
            install_rank_failure(int(rank), int(number))
        else:
            raise SystemExit(f"_worker_hooks: unknown hook {hook!r} in {HOOKS_ENV}")
        installed.append(hook)
    return installed


def install_rank_failure(rank: int, number: int) -> None:
    """Fail map ``number`` of rank ``rank`` only (what ``KVPLAN_DEBUG_FAIL_MAP`` does)."""
    import logging

    from kvplan.executor.backends.faults import FaultyBackend
    from kvplan.integrations.vllm import elastic as _elastic

    real = _elastic.WorkerSide._map

    def failing(self: Any, blocks: tuple[int, ...], inject: bool) -> None:
        made = self.count["map_calls"] + self.count["busy_ahead_calls"]  # as the setting counts
        if self.label != f"rank{rank}" or made != number:
            return real(self, blocks, inject)
        logging.getLogger("vllm.kvplan").warning(
            "_worker_hooks: %s fails map #%d on purpose", self.label, number
        )
        cache, backend = self.cache, self.cache.backend
        cache.backend = FaultyBackend(backend, fail_ops={"set_access", "map_run"})
        try:
            cache.ensure_mapped(blocks)
        finally:
            cache.backend = backend
        return None

    _elastic.WorkerSide._map = failing


def step_delay(hooks: str) -> float:
    """The seconds ``slow-steps=MS`` in ``hooks`` asks each step to wait (0: none)."""
    for hook in (h.strip() for h in hooks.split(",")):
        if hook.startswith("slow-steps="):
            return int(hook.removeprefix("slow-steps=")) / 1000
    return 0.0


def _hooked_worker() -> type:
    import time

    from vllm.v1.worker.cpu_worker import CPUWorker

    class HookedWorker(CPUWorker):  # type: ignore[misc]
        """vLLM's CPU worker with the hooks of ``ENGINE_TEST_HOOKS`` installed first."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.test_hooks = install(os.environ.get(HOOKS_ENV, ""))
            self.step_delay = step_delay(os.environ.get(HOOKS_ENV, ""))
            super().__init__(*args, **kwargs)

        def execute_model(self, *args: Any, **kwargs: Any) -> Any:
            if self.step_delay:
                time.sleep(self.step_delay)
            return super().execute_model(*args, **kwargs)

    HookedWorker.__module__ = __name__
    return HookedWorker


def __getattr__(name: str) -> Any:
    if name == "HookedWorker":
        cls = _hooked_worker()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
