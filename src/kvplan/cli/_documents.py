"""Loading the documents commands take: a plan, or an input document planned on the fly."""

from __future__ import annotations

from pathlib import Path

from kvplan.cli._output import report
from kvplan.planner import build_plan
from kvplan.schemas.errors import KVPlanError
from kvplan.schemas.input import InputDocument
from kvplan.schemas.legacy import LegacyInputDocument
from kvplan.schemas.loading import load_any
from kvplan.schemas.plan import BindingPlan


def as_plan(obj: InputDocument | LegacyInputDocument | BindingPlan) -> BindingPlan:
    """A plan as it is, or the plan of an input document (errors raise, warnings print)."""
    if isinstance(obj, BindingPlan):
        return obj
    result, problems = build_plan(obj)
    errors = [d for d in problems if d.is_error]
    if errors or result is None:
        raise KVPlanError(errors)
    report(problems)
    return result


def load_document_as_plan(path: Path) -> BindingPlan:
    return as_plan(load_any(path))
