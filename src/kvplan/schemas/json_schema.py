"""JSON schemas generated from the models (committed under ``schemas/`` at the repo root)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kvplan.schemas.input import InputDocument
from kvplan.schemas.plan import BindingPlan

SCHEMA_FILES = {"input": "kvplan.input.schema.json", "plan": "kvplan.plan.schema.json"}


def schema_of(which: str) -> dict[str, Any]:
    """``input`` or ``plan``: the JSON schema (draft 2020-12) of that document."""
    model: type[BaseModel] = InputDocument if which == "input" else BindingPlan
    schema = model.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"kvplan.{which}/1"
    return schema
