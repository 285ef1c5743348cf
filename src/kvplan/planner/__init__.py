"""Pure planning: an input document in, a validated :class:`BindingPlan` out.

No torch, no vLLM. ``plan`` raises :class:`KVPlanError` with every error found;
``validate`` returns the diagnostics (errors and warnings) instead.
"""

from __future__ import annotations

from kvplan.planner._bind import POOL_NAME, bind
from kvplan.planner._input_rules import check_input
from kvplan.planner._overlap import Budget, find_overlaps
from kvplan.planner._plan_rules import RAW_STORAGE_KINDS, VMM_GRANULARITY, check_plan
from kvplan.planner._text import num
from kvplan.planner.diff import Change, PlanDiff, diff_plans
from kvplan.schemas.canonical import fingerprint
from kvplan.schemas.errors import Diagnostic, KVPlanError
from kvplan.schemas.input import InputDocument
from kvplan.schemas.legacy import LegacyInputDocument
from kvplan.schemas.plan import BindingPlan, Source, Summary

__all__ = [
    "POOL_NAME",
    "RAW_STORAGE_KINDS",
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
) -> tuple[BindingPlan | None, list[Diagnostic]]:
    """Plan ``doc``; return the plan (None if it could not be built) and every diagnostic.

    ``granularity`` (bytes) is the allocation granularity pools are checked against
    (``KVP308`` warning); 0 skips the check, e.g. for the ``torch`` backend.
    """
    if isinstance(doc, LegacyInputDocument):  # vLLM 0.22-0.28: strategy from doc.binding
        from kvplan.planner.legacy import build_legacy_plan

        return build_legacy_plan(doc, granularity=granularity)
    problems = check_input(doc)
    if any(d.is_error for d in problems):
        return None, problems
    binding = bind(doc)
    problems.extend(binding.problems)
    if any(d.is_error for d in problems):
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
    errors = [d for d in problems if d.is_error]
    if errors or result is None:
        raise KVPlanError(errors)
    return result


def validate(
    obj: InputDocument | LegacyInputDocument | BindingPlan,
    *,
    granularity: int = VMM_GRANULARITY,
) -> list[Diagnostic]:
    """Every error and warning for an input document or a plan (an empty list: all good)."""
    if isinstance(obj, BindingPlan):
        return check_plan(obj, granularity=granularity)
    return build_plan(obj, granularity=granularity)[1]
