"""A group member refused before vLLM loads anything (``KVPLAN_GROUP``).

The engine core joins its group once it has sized the KV cache (``_group.join``): after vLLM
loaded the model and profiled, 45 s or more after start. What the join would refuse without
knowing the model — the group directory or its ledger unusable (``KVP540``, ``KVP541``), no
budget to create the group with (``KVP544``), an explicit ``KVPLAN_GROUP_GUARANTEE`` the
budget cannot hold beside the live members' (``KVP542``) — is refused when the plugin
registers, in every process, with the join's own code and text
(:func:`kvplan.elastic.join_check.join_refusals`). The guarantee is charged at factor 1: a
larger factor (ranks on host memory) only charges more, so nothing refused here would have
been taken at the join. A guarantee left to default to the engine's floor needs the model's
KV geometry and is checked at the join.
"""

from __future__ import annotations

from pathlib import Path

from kvplan.integrations.vllm.elastic._group import member_name
from kvplan.integrations.vllm.elastic._settings import ElasticSettings
from kvplan.schemas.errors import Diagnostic, KVPlanError


def group_refusals(settings: ElasticSettings, dump_dir: Path | None) -> list[Diagnostic]:
    """What the engine's join would refuse, found now (empty outside a group)."""
    if settings.group is None:
        return []
    from kvplan.elastic.join_check import join_refusals

    try:
        name = member_name(dump_dir)
    except KVPlanError as exc:
        return list(exc.diagnostics)
    return join_refusals(
        settings.group, name, guarantee=settings.group_guarantee, budget=settings.group_budget
    )
