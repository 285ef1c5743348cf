"""kvplan: declarative, inspectable, testable KV-cache binding plans for vLLM.

Importing ``kvplan`` imports neither torch nor vLLM.
"""

from kvplan.planner import diff_plans, plan, validate
from kvplan.schemas import BindingPlan, Diagnostic, InputDocument, KVPlanError
from kvplan.schemas.loading import dump, dumps, load_input, load_plan

__version__ = "0.2.0"
"""kvplan's version: the one place it is written (pyproject.toml reads it)."""

__all__ = [
    "BindingPlan",
    "Diagnostic",
    "InputDocument",
    "KVPlanError",
    "__version__",
    "diff_plans",
    "dump",
    "dumps",
    "load_input",
    "load_plan",
    "plan",
    "validate",
]
