"""JSON schemas generated from the models (committed under ``schemas/`` at the repo root)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kvplan.schemas.errors import Code, KVPlanError, error, show_value
from kvplan.schemas.input import INPUT_FORMAT, InputDocument
from kvplan.schemas.legacy import LEGACY_INPUT_FORMAT, LegacyInputDocument
from kvplan.schemas.plan import PLAN_FORMAT, BindingPlan

SCHEMAS: dict[str, tuple[type[BaseModel], str]] = {
    "input": (InputDocument, INPUT_FORMAT),
    "legacy": (LegacyInputDocument, LEGACY_INPUT_FORMAT),
    "plan": (BindingPlan, PLAN_FORMAT),
}
"""Schema name → the model and the document format it describes."""

SCHEMA_FILES = {name: f"{fmt.removesuffix('/1')}.schema.json" for name, (_, fmt) in SCHEMAS.items()}
"""Schema name → its file under ``schemas/``."""


def schema_of(which: str) -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of the document ``which`` names (:data:`SCHEMAS`);
    ``KVP021`` for any other name."""
    if which not in SCHEMAS:
        raise KVPlanError(
            error(
                Code.UNKNOWN_SCHEMA,
                "NAME",
                f"no schema named {show_value(which)}; known: {', '.join(SCHEMAS)}",
                "run `kvplan schema input`, `kvplan schema legacy` or `kvplan schema plan`",
            )
        )
    model, fmt = SCHEMAS[which]
    schema = model.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = fmt
    return schema
