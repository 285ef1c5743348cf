"""What a member's join would refuse, found without joining: nothing is written, no lock is
taken (the group is read as ``kvplan top`` reads it), dead members are not counted.

The vLLM plugin asks this when it registers (``kvplan.integrations.vllm.elastic``), before
vLLM loads the model, so that an engine the group cannot take is refused in a second instead
of after loading and profiling — with the code and text :meth:`GroupMember.join
<kvplan.elastic.group.GroupMember.join>` gives:

* ``KVP540``: the group directory cannot be used (missing, a link, not this user's...);
* ``KVP541``: its ledger cannot be read;
* ``KVP544``: the group has no ledger yet and no budget to create it with;
* ``KVP542``: the guarantee asked does not fit the budget beside the live members'.

A join can still be refused for what is not known yet (a guarantee defaulting to the floor,
a name taken, a member that joins in between). No torch, no vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvplan.elastic import _group_files as files
from kvplan.elastic import grants
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError


def join_refusals(
    directory: Path | str,
    name: str,
    *,
    guarantee: int | None,
    factor: int = 1,
    budget: int | None = None,
) -> list[Diagnostic]:
    """The refusals ``GroupMember.join(directory, name, guarantee=..., factor=...,
    budget=...)`` would give now, as far as they can be told without the member's floor."""
    try:
        paths = files.check_directory(Path(directory))
        if not os.path.lexists(paths.ledger):
            if budget is not None:
                return []  # the join creates the group
            raise files.fail(
                Code.GROUP_BUDGET_MISSING,
                paths.directory,
                "the group has no ledger yet and no budget was given to create it with.",
                "set the group's budget (KVPLAN_GROUP_BUDGET, or kvplan limit DIR SIZE) before "
                "the first engine joins",
            )
        ledger = files.read_ledger(paths)
    except KVPlanError as exc:
        return list(exc.diagnostics)
    if ledger is None or guarantee is None:
        return []
    state = files.to_state(ledger)
    for record in ledger.members:
        alive = files.probe_lease(paths, record.lease, record.lease_inode) != files.Liveness.DEAD
        if record.name == name or not alive:
            state.members.pop(record.name, None)  # a dead member is reaped by the join
    me = grants.MemberState(name=name, factor=factor, guarantee=guarantee, ceiling=guarantee)
    try:
        grants.join(state, me)
    except grants.PolicyError as exc:
        if exc.kind == "guarantees":
            return list(files.policy_error(exc, paths.directory).diagnostics)
    return []
