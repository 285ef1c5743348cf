"""Pure planning: an input document in, a validated :class:`BindingPlan` out.

No torch, no vLLM. ``plan`` raises :class:`KVPlanError` with every error found;
``validate`` returns the diagnostics (errors and warnings) instead.
"""

from __future__ import annotations

from kvplan.planner._bind import POOL_NAME, bind
from kvplan.planner._input_rules import check_input
from kvplan.planner._overlap import Budget, find_overlaps
from kvplan.planner._plan_rules import check_plan
from kvplan.planner._text import num
from kvplan.planner.diff import Change, PlanDiff, diff_plans
from kvplan.schemas.canonical import fingerprint
from kvplan.schemas.errors import Findings
from kvplan.schemas.input import InputDocument
from kvplan.schemas.legacy import LegacyInputDocument
from kvplan.schemas.plan import BindingPlan, Source, Summary
from kvplan.units import VMM_GRANULARITY

__all__ = [
    "POOL_NAME",
    "VMM_GRANULARITY",
    "Budget",
    "Change",
    "PlanDiff",
    "build_plan",
    "check_plan",
    "diff_plans",
    "find_overlaps",
    "num",
    "plan",
    "validate",
]


def build_plan(
    doc: InputDocument | LegacyInputDocument,
    *,
    granularity: int = VMM_GRANULARITY,
) -> tuple[BindingPlan | None, Findings]:
    """Plan ``doc``; return the plan (None if it could not be built) and every finding.

    ``granularity`` (bytes) is the allocation granularity pools are checked against
    (``KVP308`` warning); 0 skips the check, e.g. for the ``torch`` backend.
    """
    if isinstance(doc, LegacyInputDocument):  # vLLM 0.22-0.28: strategy from doc.binding
        from kvplan.planner.legacy import build_legacy_plan

        return build_legacy_plan(doc, granularity=granularity)
    problems = Findings(check_input(doc))
    if not problems.ok:
        return None, problems
    binding = bind(doc)
    problems.extend(binding.problems)
    if not problems.ok:
        return None, problems
    cfg = doc.kv_cache_config
    pool_bytes = sum(p.size_bytes for p in binding.pools)
    saved = sum(binding.page_bytes.get(a.target, 0) for a in binding.aliases) * cfg.num_blocks
    result = BindingPlan(
        fingerprint=fingerprint(doc),
        source=Source(
            vllm_version=doc.vllm_version,
            layout=cfg.kv_cache_layout.name if cfg.kv_cache_layout else None,
            num_blocks=cfg.num_blocks,
        ),
        pools=binding.pools,
        views=binding.views,
        aliases=binding.aliases,
        summary=Summary(
            tensor_backed_layers=len(binding.views),
            aliased_layers=len(binding.aliases),
            bytes_per_block=(binding.pools[0].size_bytes // cfg.num_blocks) if binding.pools else 0,
            pool_bytes=pool_bytes,
            alias_saved_bytes=saved,
        ),
    )
    problems.extend(check_plan(result, granularity=granularity))
    return result, problems


def plan(doc: InputDocument | LegacyInputDocument) -> BindingPlan:
    """The binding vLLM 0.33 would make for ``doc``, with KV-sharing aliases.

    A ``kvplan.input-legacy/1`` document is planned by :func:`kvplan.planner.legacy.plan_legacy`.

    Raises :class:`KVPlanError` carrying every error (warnings do not raise).
    """
    result, problems = build_plan(doc)
    problems.raise_for_errors()
    assert result is not None  # no errors: built
    return result


def validate(
    obj: InputDocument | LegacyInputDocument | BindingPlan,
    *,
    granularity: int = VMM_GRANULARITY,
) -> Findings:
    """Every error and warning for an input document or a plan (empty: all good)."""
    if isinstance(obj, BindingPlan):
        return Findings(check_plan(obj, granularity=granularity))
    return build_plan(obj, granularity=granularity)[1]
