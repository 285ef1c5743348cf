"""Reviewed-plan mode (``KVPLAN_PLAN_DIR=DIR``): bind only the plan that was reviewed.

``DIR`` is a golden directory as ``kvplan golden`` writes it (``DIR/<org>__<name>/plan.json``)
or one model's folder of it. The reviewed plan of global rank ``N`` is
``<folder>/rank<N>.plan.json`` (the name ``KVPLAN_DUMP_DIR`` gives it); rank 0 may instead be
``<folder>/plan.json`` (the name ``kvplan golden`` gives it), not both. A live plan that
differs from it in any pool, view, alias, summary or source field refuses with ``KVP503``
and the semantic diff; the fingerprint alone (it hashes the input's free-form metadata,
which differs between ``kvplan inspect`` and the plugin) does not count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.integrations.vllm.pipeline import refusals
from kvplan.schemas.plan import BindingPlan

GOLDEN_PLAN = "plan.json"


def slug(model: str) -> str:
    """A model's folder name, as ``kvplan golden add`` makes it: ``org__name``."""
    return model.strip("/").replace("/", "__") if "/" in model else Path(model).name


def model_of(vllm_config: Any) -> str | None:
    """The model id or path vLLM serves (``vllm_config.model_config.model``)."""
    model = getattr(getattr(vllm_config, "model_config", None), "model", None)
    return str(model) if model else None


def _is_model_folder(folder: Path) -> bool:
    return (folder / GOLDEN_PLAN).is_file() or any(folder.glob("rank*.plan.json"))


def reviewed_plan_path(plan_dir: Path, model: str | None, label: str) -> Path:
    """Where the reviewed plan of worker ``label`` (``rank<N>``) serving ``model`` lives.

    Raises ``KVP504`` when there is none (or two for rank 0).
    """
    if _is_model_folder(plan_dir):
        folder = plan_dir
    elif model is None:
        raise refusals.reviewed_plan_missing(
            plan_dir, "holds one folder per model, and this worker's model is unknown"
        )
    else:
        folder = plan_dir / slug(model)
    per_rank = folder / f"{label}.plan.json"
    golden = folder / GOLDEN_PLAN
    if label == "rank0" and golden.is_file():
        if per_rank.is_file():
            raise refusals.reviewed_plan_missing(
                folder, f"holds both {GOLDEN_PLAN} and {per_rank.name} for rank 0; keep one"
            )
        return golden
    if not per_rank.is_file():
        raise refusals.reviewed_plan_missing(per_rank, "does not exist")
    return per_rank


def check_reviewed(plan: BindingPlan, plan_dir: Path, model: str | None, label: str) -> Path:
    """The reviewed plan's path if ``plan`` is the same plan; else ``KVP503`` with the diff."""
    from kvplan.planner import diff_plans
    from kvplan.planner.diff import PlanDiff
    from kvplan.schemas.loading import load_plan

    path = reviewed_plan_path(plan_dir, model, label)
    reviewed = load_plan(path, own=True)  # a reviewed plan steers the bind: ours or root's
    diff = diff_plans(reviewed, plan)
    meaningful = PlanDiff([c for c in diff.changes if c.section != "input"])
    if not meaningful.same:
        raise refusals.reviewed_plan_differs(
            path, label, meaningful.to_markdown(), len(meaningful.changes)
        )
    return path
