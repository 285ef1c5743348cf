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


INLINE_WIDTH = 100
"""Lists of scalars (shapes, strides) that fit in this many characters stay on one line."""


def _format(value: Any, indent: int) -> str:
    pad = "  " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [
            f"{pad}{json.dumps(k, ensure_ascii=False)}: {_format(v, indent + 1)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        if all(not isinstance(v, (dict, list)) for v in value):
            inline = json.dumps(value, ensure_ascii=False)
            if len(inline) <= INLINE_WIDTH:
                return inline
        items = [pad + _format(v, indent + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    return json.dumps(value, ensure_ascii=False)


def to_json(model: BaseModel) -> str:
    """Canonical JSON text: fixed key order, two-space indent, short scalar lists inline."""
    return _format(to_data(model), 0) + "\n"


def to_yaml(model: BaseModel) -> str:
    """Canonical YAML text with the same key order as :func:`to_json`."""
    return yaml.safe_dump(to_data(model), sort_keys=False, default_flow_style=None, width=100)


def fingerprint(model: BaseModel) -> str:
    """``sha256:<hex>`` of the compact, key-sorted JSON of ``model``."""
    text = json.dumps(to_data(model), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
