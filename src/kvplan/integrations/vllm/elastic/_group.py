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

import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.elastic._settings import ENV_ENGINE_NAME, ElasticSettings
from kvplan.schemas.errors import Code, KVPlanError, error

if TYPE_CHECKING:
    from kvplan.elastic.group import GroupMember, Lease

logger = logging.getLogger("vllm.kvplan")

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


def close_quietly(obj: Any) -> None:
    try:
        obj.close()
    except Exception as exc:  # shutdown goes on
        logger.warning("kvplan: closing a group lease failed: %s", exc)
