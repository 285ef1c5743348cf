"""Canonical serialisation: the same document always gives the same bytes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml
from pydantic import BaseModel


def to_data(model: BaseModel) -> dict[str, Any]:
    """JSON-ready data in field-declaration order (vLLM's field names, aliases applied)."""
    return model.model_dump(mode="json", by_alias=True)


def to_json(model: BaseModel) -> str:
    """Canonical JSON text: fixed key order, two-space indent, trailing newline."""
    return json.dumps(to_data(model), indent=2, ensure_ascii=False) + "\n"


def to_yaml(model: BaseModel) -> str:
    """Canonical YAML text with the same key order as :func:`to_json`."""
    return yaml.safe_dump(to_data(model), sort_keys=False, default_flow_style=None, width=100)


def fingerprint(model: BaseModel) -> str:
    """``sha256:<hex>`` of the compact, key-sorted JSON of ``model``."""
    text = json.dumps(to_data(model), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
