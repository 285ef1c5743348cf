"""Canonical serialisation: the same document always gives the same bytes."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel

from kvplan.schemas.errors import UNSAFE_CHARS

Document = BaseModel | Mapping[str, Any]
"""What the canonical writers take: a model, or JSON-ready data made of models' data (such as
``kvplan inspect``'s ``{"input": ..., "plan": ...}`` bundle)."""


def to_data(model: BaseModel) -> dict[str, Any]:
    """JSON-ready data in field-declaration order (vLLM's field names, aliases applied)."""
    return model.model_dump(mode="json", by_alias=True)


def _data_of(obj: Document) -> Any:
    return to_data(obj) if isinstance(obj, BaseModel) else obj


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


# What json.dumps(ensure_ascii=False) leaves raw but a terminal acts on: DEL, C1 controls,
# bidirectional overrides. They occur only inside strings, so escaping them keeps valid JSON.
_TERMINAL_ACTIVE = re.compile(f"[{UNSAFE_CHARS}]")  # json.dumps escapes C0 itself


def escape_json_text(text: str) -> str:
    """JSON text with every character a terminal would act on written as a ``\\uXXXX`` escape."""
    return _TERMINAL_ACTIVE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def to_json(model: Document) -> str:
    """Canonical JSON text: fixed key order, two-space indent, short scalar lists inline.

    Control characters, DEL, C1 controls and bidirectional overrides are ``\\u`` escapes.
    """
    return escape_json_text(_format(_data_of(model), 0) + "\n")


def to_yaml(model: Document) -> str:
    """Canonical YAML text with the same key order as :func:`to_json`."""
    return yaml.safe_dump(_data_of(model), sort_keys=False, default_flow_style=None, width=100)


def fingerprint(model: BaseModel) -> str:
    """``sha256:<hex>`` of the compact, key-sorted JSON of ``model``."""
    text = json.dumps(to_data(model), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
