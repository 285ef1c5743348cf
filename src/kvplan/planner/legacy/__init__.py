"""Planning vLLM 0.22–0.28 bindings (``kvplan.input-legacy/1``): vanilla vLLM or kvcached.

Every strategy reproduces 0.24's runner; a document naming another ``shared_by`` release is
planned the same way, and what that release binds differently is refused (``_checks``).

Pure: no torch, no vLLM. ``plan_legacy`` raises :class:`KVPlanError` carrying every error;
``build_legacy_plan`` returns the plan (or None) and every diagnostic. Strategy options left
``None`` come from the document's ``binding`` section (defaults: vanilla, noncontiguous;
kvcached layouts: noncontiguous, contiguous, per-layer).
A Mamba layer binds one tensor per state in vLLM 0.24: its views are ``<layer>#<i>``.
"""

from __future__ import annotations

from kvplan.planner._plan_rules import check_plan
from kvplan.planner.legacy._binding import LegacyBinding
from kvplan.planner.legacy._checks import check_legacy
from kvplan.planner.legacy._kvcached import (
    KvcachedGeometry,
    bind_kvcached,
    kvcached_geometry_of,
)
from kvplan.planner.legacy._resolve import ResolvedDocument, resolve
from kvplan.planner.legacy._vanilla import bind_vanilla
from kvplan.schemas.canonical import fingerprint
from kvplan.schemas.errors import Findings
from kvplan.schemas.legacy import BindingOptions, LegacyInputDocument, PoolLayout, Strategy
from kvplan.schemas.plan import BindingPlan, Source, Summary
from kvplan.units import VMM_GRANULARITY

__all__ = [
    "KvcachedGeometry",
    "build_legacy_plan",
    "effective_options",
    "kvcached_geometry",
    "plan_legacy",
]


def effective_options(
    doc: LegacyInputDocument,
    strategy: Strategy | None = None,
    pool_layout: PoolLayout | None = None,
    virtual_capacity_bytes: int | None = None,
) -> BindingOptions:
    """The document's ``binding`` with the given overrides applied."""
    update: dict[str, object] = {}
    if strategy is not None:
        update["strategy"] = strategy
    if pool_layout is not None:
        update["pool_layout"] = pool_layout
    if virtual_capacity_bytes is not None:
        update["virtual_capacity_bytes"] = virtual_capacity_bytes
    return BindingOptions.model_validate({**doc.binding.model_dump(), **update})


def build_legacy_plan(
    doc: LegacyInputDocument,
    *,
    strategy: Strategy | None = None,
    pool_layout: PoolLayout | None = None,
    virtual_capacity_bytes: int | None = None,
    granularity: int = VMM_GRANULARITY,
) -> tuple[BindingPlan | None, Findings]:
    """Plan ``doc``; return the plan (None if it could not be built) and every finding."""
    options = effective_options(doc, strategy, pool_layout, virtual_capacity_bytes)
    r = resolve(doc)
    problems = Findings(check_legacy(r, per_layer=options.pool_layout == "per-layer"))
    if not problems.ok:
        return None, problems
    if options.strategy == "kvcached":
        binding = bind_kvcached(
            r,
            options.pool_layout,
            options.virtual_capacity_bytes,
            options.page_size_bytes,
        )
    else:
        binding = bind_vanilla(r)
    problems += binding.problems
    if not problems.ok:
        return None, problems
    plan = _assemble(doc.model_copy(update={"binding": options}), binding, r)
    problems += check_plan(plan, granularity=granularity)
    return plan, problems


def plan_legacy(
    doc: LegacyInputDocument,
    *,
    strategy: Strategy | None = None,
    pool_layout: PoolLayout | None = None,
    virtual_capacity_bytes: int | None = None,
) -> BindingPlan:
    """The binding vLLM 0.24 (``vanilla``) or kvcached (``kvcached``) makes for ``doc``."""
    plan, problems = build_legacy_plan(
        doc,
        strategy=strategy,
        pool_layout=pool_layout,
        virtual_capacity_bytes=virtual_capacity_bytes,
    )
    problems.raise_for_errors()
    assert plan is not None  # no errors: built
    return plan


def kvcached_geometry(
    doc: LegacyInputDocument,
    *,
    pool_layout: PoolLayout | None = None,
    virtual_capacity_bytes: int | None = None,
) -> KvcachedGeometry:
    """kvcached's pool geometry (what scheduler and workers must agree on) for ``doc``."""
    options = effective_options(doc, "kvcached", pool_layout, virtual_capacity_bytes)
    r = resolve(doc)
    per_layer = options.pool_layout == "per-layer"
    Findings(check_legacy(r, per_layer=per_layer)).raise_for_errors()
    geometry, _ = kvcached_geometry_of(
        r,
        options.pool_layout,
        options.virtual_capacity_bytes,
        options.page_size_bytes,
    )
    return geometry


def _assemble(doc: LegacyInputDocument, binding: LegacyBinding, r: ResolvedDocument) -> BindingPlan:
    num_blocks = r.num_blocks
    page = {name: spec.page_size_bytes for name in r.backed_layers if (spec := r.spec_of(name))}
    layers = {v.layer.split("#", 1)[0] for v in binding.views}
    return BindingPlan(
        fingerprint=fingerprint(doc),
        source=Source(vllm_version=doc.vllm_version, layout=binding.layout, num_blocks=num_blocks),
        pools=binding.pools,
        views=binding.views,
        aliases=binding.aliases,
        summary=Summary(
            tensor_backed_layers=len(layers),
            aliased_layers=len(binding.aliases),
            bytes_per_block=binding.bytes_per_block,
            pool_bytes=sum(p.size_bytes for p in binding.pools),
            alias_saved_bytes=sum(page.get(a.target, 0) for a in binding.aliases) * num_blocks,
        ),
    )
