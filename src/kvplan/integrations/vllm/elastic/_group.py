"""An elastic engine as a member of a group (``KVPLAN_GROUP=DIR``): engines naming the same
directory draw their mapped KV bytes from one budget (``kvplan.elastic.group``: the ledger,
the leases, the policy of guarantees, borrowing and claims; ``docs/elastic.md``).

The engine core joins when it has sized the KV cache — before any worker maps its null block
— with its floor (default guarantee), its reservation (ceiling) and its charge factor; every
worker process that maps memory holds the member's lease too, so the member is alive while
any of them is. The scheduler side (``_scheduler``) keeps its mapped bytes within the grant,
grows the grant when admission is short, gives bytes back once the workers have unmapped
them, and gets under its effective limit when another member claims its guarantee. When the
engine core shuts down (its workers stopped), the member leaves; a member killed outright is
reaped by the next accounting operation of any other member.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.elastic._settings import ENV_ENGINE_NAME, ElasticSettings
from kvplan.schemas.errors import Code, KVPlanError, error

if TYPE_CHECKING:
    from kvplan.elastic.group import GroupMember, Lease

logger = logging.getLogger("vllm.kvplan")

STOP_GRACE_SECONDS = 5.0
"""Seconds the API server's process manager waits for its engine core to stop in order (its
workers stopped, its caches closed, the group left) before it kills it. vLLM's default
(``--shutdown-timeout 0``: abort requests at once) passes 0 and kills the core as soon as it
has sent SIGTERM, so the core never left its group and its member stayed ``dead`` until
another member reaped it; vLLM itself widens the wait the same way on ROCm. The requests
are still aborted at once (that is the core's own decision); a core that stops sooner ends
the wait sooner."""

STOP_POLL_SECONDS = 0.02
STATS_FILE = re.compile(r"rank[0-9]{1,9}\.stats\.json")

JOIN_TIMEOUT = 30.0
"""Seconds a joining engine waits for the bytes its null block needs (claims are served by
the borrowers within a few of their steps)."""


def member_name(dump_dir: Path | None) -> str:
    """The member's name: ``KVPLAN_ENGINE_NAME``, else the dump directory's name — the same
    in every process of the engine (workers attach to the lease by it)."""
    name = os.environ.get(ENV_ENGINE_NAME, "").strip()
    if not name and dump_dir is not None:
        name = re.sub(r"[^A-Za-z0-9._:@+-]", "-", dump_dir.name).lstrip("._:@+-")[:128]
    if not name:
        raise KVPlanError(
            error(
                Code.GROUP_MEMBER_REFUSED,
                ENV_ENGINE_NAME,
                "an engine in a group needs a name its processes share, and it has none "
                f"({ENV_ENGINE_NAME} and KVPLAN_DUMP_DIR are unset).",
                f"set {ENV_ENGINE_NAME}=NAME (or KVPLAN_DUMP_DIR) for each engine of the group",
            )
        )
    return name


def charge_factor(backend: str, world_size: int) -> int:
    """Ranks whose memory the group's memory holds: a backend on host memory maps every rank
    there; on a GPU each rank maps its own device, and a group is one device's budget."""
    from kvplan.executor.backends import backend_info

    return max(1, world_size) if "cpu" in backend_info(backend).devices else 1


def nodes_of(vllm_config: Any) -> int:
    """The nodes an engine's ranks run on (vLLM's ``--nnodes``; 1 when it does not say)."""
    parallel = getattr(vllm_config, "parallel_config", None)
    return max(1, int(getattr(parallel, "nnodes", 1) or 1))


def check_one_host(settings: ElasticSettings, nodes: int) -> None:
    """``KVP548``: an engine whose ranks run on several nodes cannot be a member. A group is
    one host's memory: its ledger and leases are files on that host, and what it charges is
    what that host maps. The ranks on another node map that node's memory, which no group
    there accounts for (its scheduler, the only one that grants, runs on node 0)."""
    if settings.group is None or nodes <= 1:
        return
    raise KVPlanError(
        error(
            Code.GROUP_SPANS_NODES,
            "KVPLAN_GROUP",
            f"this engine's ranks run on {nodes} nodes (--nnodes {nodes}), and a group is one "
            f"host's memory budget: group {settings.group} cannot account for what the other "
            "nodes map.",
            "serve a multi-node engine without KVPLAN_GROUP (KVPLAN_MEMORY_LIMIT bounds what "
            "each rank maps), or put the engine on one node",
        )
    )


def join(
    settings: ElasticSettings,
    *,
    name: str,
    floor: int,
    ceiling: int,
    initial: int,
    factor: int,
) -> GroupMember:
    """Join the group and wait for ``initial`` bytes (the null block every worker maps at
    bind). ``KVP54x`` when it cannot (the group's guarantees would not fit, no budget...)."""
    from kvplan.elastic.group import GroupMember

    assert settings.group is not None
    member = GroupMember.join(
        settings.group,
        name,
        floor=floor,
        ceiling=ceiling,
        guarantee=settings.group_guarantee,
        factor=factor,
        initial=initial,
        budget=settings.group_budget,
    )
    try:
        member.acquire(initial, JOIN_TIMEOUT)
    except BaseException:
        member.leave()
        raise
    if settings.group_budget is not None and member.budget != settings.group_budget:
        logger.warning(
            "kvplan: group %s already has a budget of %d bytes; KVPLAN_GROUP_BUDGET=%d is "
            "not applied (change it with `kvplan limit --group DIR SIZE`)",
            settings.group, member.budget, settings.group_budget,
        )  # fmt: skip
    logger.info(
        "kvplan: %s joined group %s (budget %d, guarantee %d, charge x%d, granted %d)",
        name, settings.group, member.budget, member.guarantee, factor, member.granted,
    )  # fmt: skip
    return member


def attach_worker(settings: ElasticSettings, name: str) -> Lease | None:
    """A worker process that maps memory holds the member's lease while it lives."""
    if settings.group is None:
        return None
    from kvplan.elastic.group import attach

    return attach(settings.group, name)


def stop_engine_processes(settings: ElasticSettings, dump_dir: Path | None, call: Any) -> Any:
    """``CoreEngineProcManager.shutdown(timeout)`` in the API server. vLLM sends SIGTERM to
    the engine core and, past ``timeout`` (0 by default), kills it: the core never got to its
    own shutdown. Here SIGTERM goes first, then this waits -- until the core has stopped in
    order (its workers' caches closed, the last stats snapshots ``closed``, the group left),
    it exited, or :data:`STOP_GRACE_SECONDS` passed -- and then vLLM does what it does (the
    rest of the core's teardown is vLLM's; the requests were aborted at once all the same)."""
    manager = call.argument("self")
    timeout = call.argument("timeout")
    procs = [p for p in getattr(manager, "processes", None) or [] if p.is_alive()]
    waits = settings.group is not None or dump_dir is not None
    if procs and waits and (timeout is None or timeout < STOP_GRACE_SECONDS):
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while time.monotonic() < deadline and any(p.is_alive() for p in procs):
            if stopped_in_order(settings, dump_dir):
                break
            time.sleep(STOP_POLL_SECONDS)
    return call.run()


def stopped_in_order(settings: ElasticSettings, dump_dir: Path | None) -> bool:
    """Whether this engine's elastic part has stopped: every stats file in its dump directory
    ``closed``, and its member no longer in its group's ledger."""
    from kvplan.elastic.files import ElasticStats, read_stats
    from kvplan.elastic.group import read_snapshot

    if dump_dir is not None:
        try:
            names = [n for n in os.listdir(dump_dir) if STATS_FILE.fullmatch(n)]
        except OSError:
            names = []
        for name in names:
            stats = read_stats(dump_dir / name, within=dump_dir)
            if not isinstance(stats, ElasticStats) or stats.state != "closed":
                return False
    if settings.group is not None:
        try:
            members = read_snapshot(settings.group).members
        except KVPlanError:
            return False
        name = member_name(dump_dir)
        if any(m.name == name for m in members):
            return False
    return True


CLOSE_WORKERS_SECONDS = 0.5
"""How long a shutting-down engine core waits for its workers to close their caches."""


def close_workers(engine_core: Any) -> bool:
    """Ask every worker of ``engine_core`` to close its elastic cache (``collective_rpc``:
    each rank runs it in its RPC order, after any step sent before); whether every rank
    answered. ``False`` when the engine has no executor or a rank did not answer in
    :data:`CLOSE_WORKERS_SECONDS` (gone, or stopped by the same signal)."""
    from kvplan.integrations.vllm.elastic._worker import close_for_shutdown

    executor = getattr(engine_core, "model_executor", None)
    if executor is None:
        return False
    try:
        closed = executor.collective_rpc(close_for_shutdown, timeout=CLOSE_WORKERS_SECONDS)
    except Exception as exc:  # a worker gone or stopping: vLLM stops them, then we leave
        logger.info("kvplan: the workers did not close their caches at shutdown (%s)", exc)
        return False
    logger.info("kvplan: shutdown: %d rank(s) closed their elastic caches", sum(closed or []))
    return True


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT held while the engine core closes its workers' caches and leaves its
    group, then delivered again (to whatever handled them before). vLLM's engine core resets
    both to their default action before its shutdown, so a second signal -- Ctrl-C reaches
    every process of the server, then the API server's SIGTERM -- killed it mid-leave. Only in
    the main thread (elsewhere Python allows no handler: nothing is held)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[int, Any] = {}
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
    except (ValueError, OSError):
        pass
    try:
        yield
    finally:
        for number, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(number, handler)
        for number in dict.fromkeys(held):
            os.kill(os.getpid(), number)


def close_quietly(obj: Any) -> None:
    try:
        obj.close()
    except Exception as exc:  # shutdown goes on
        logger.warning("kvplan: closing a group lease failed: %s", exc)
