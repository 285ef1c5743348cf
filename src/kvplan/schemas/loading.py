"""Reading and writing documents (JSON or YAML by suffix), with KVP errors instead of tracebacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from kvplan.schemas.canonical import to_json, to_yaml
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error
from kvplan.schemas.input import INPUT_FORMAT, InputDocument
from kvplan.schemas.legacy import LegacyInputDocument
from kvplan.schemas.plan import PLAN_FORMAT, BindingPlan
from kvplan.schemas.specs import SPEC_KINDS

_M = TypeVar("_M", bound=BaseModel)
YAML_SUFFIXES = (".yaml", ".yml")


def read_data(path: str | Path) -> Any:
    """Parse a JSON or YAML file (``-`` reads stdin); KVP002 if unreadable, KVP001 if malformed."""
    import sys

    name = str(path)
    try:
        text = sys.stdin.read() if name == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise KVPlanError(
            error(Code.UNREADABLE, name, f"cannot read the file: {reason}", "check the path")
        ) from None
    return parse_text(text, name)


def parse_text(text: str, name: str = "<text>") -> Any:
    """Parse JSON, or YAML when ``name`` ends in .yaml/.yml (or the text is not JSON)."""
    if not name.endswith(YAML_SUFFIXES):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            if name.endswith(".json") or text.lstrip()[:1] in ("{", "["):
                raise KVPlanError(
                    error(
                        Code.MALFORMED,
                        name,
                        f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                        "fix the syntax",
                    )
                ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise KVPlanError(
            error(Code.MALFORMED, name, f"not valid YAML: {problem}{where}", "fix the syntax")
        ) from None


def _loc(parts: tuple[int | str, ...]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def diagnostics_from_validation(exc: ValidationError, source: str) -> list[Diagnostic]:
    """Turn pydantic's errors into KVP diagnostics with the offending field as location."""
    out: list[Diagnostic] = []
    for item in exc.errors(include_url=False):
        loc = tuple(p for p in item["loc"])
        # discriminated unions insert the tag value into loc; drop it for readability
        clean = tuple(p for p in loc if not (isinstance(p, str) and p in SPEC_KINDS))
        where = _loc(clean) or source
        kind = item["type"]
        msg = item["msg"]
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            tag = (item.get("ctx") or {}).get("tag", "")
            if kind == "union_tag_not_found":
                out.append(
                    error(
                        Code.SCHEMA,
                        where,
                        "spec has no 'kind'",
                        "add kind: the vLLM spec class name, e.g. FullAttentionSpec",
                    )
                )
            else:
                out.append(
                    error(
                        Code.UNKNOWN_SPEC_KIND,
                        where,
                        f"unknown spec kind {tag!r}; kvplan knows: " + ", ".join(SPEC_KINDS),
                        "use a vLLM 0.33 KVCacheSpec class name",
                    )
                )
            continue
        last = clean[-1] if clean else ""
        parent = clean[-2] if len(clean) > 1 else ""
        if kind == "literal_error" and (last == "dtype" or parent == "dtypes"):
            out.append(
                error(
                    Code.UNKNOWN_DTYPE,
                    where,
                    f"unknown dtype {item.get('input')!r}",
                    "write a torch dtype without 'torch.', e.g. bfloat16, float8_e4m3fn, uint8",
                )
            )
        elif last == "kv_cache_layout":
            out.append(
                error(
                    Code.UNKNOWN_LAYOUT,
                    where,
                    msg.removeprefix("Value error, "),
                    "use LBNHC, LBHNC, LHBNC, BLHNC, BLNHC, BHLNC (or NHD/HND)",
                )
            )
        elif last == "format" and kind == "literal_error":
            out.append(
                error(
                    Code.WRONG_FORMAT,
                    where,
                    f"format is {item.get('input')!r}, expected {item['ctx']['expected']}",
                    "pass the right kind of document",
                )
            )
        elif kind == "value_error" and "unknown" in msg and "expected one of" in msg:
            out.append(
                error(
                    Code.UNKNOWN_ENUM,
                    where,
                    msg.removeprefix("Value error, "),
                    "write enum members by name",
                )
            )
        else:
            text = msg.removeprefix("Value error, ")
            if kind in ("missing", "extra_forbidden"):
                text = {"missing": "required field is missing", "extra_forbidden": "unknown field"}[
                    kind
                ]
            else:
                text = f"{text} (got {item.get('input')!r})" if "input" in item else text
            out.append(error(Code.SCHEMA, where, text, "see docs/formats.md"))
    return out


def _parse(model: type[_M], data: Any, source: str, fmt: str) -> _M:
    if isinstance(data, dict) and data.get("format") not in (None, fmt):
        raise KVPlanError(
            error(
                Code.WRONG_FORMAT,
                f"{source}: format",
                f"format is {data.get('format')!r}, expected {fmt!r}",
                "pass an input document to plan, a plan to show/apply",
            )
        )
    if not isinstance(data, dict):
        raise KVPlanError(
            error(
                Code.SCHEMA,
                source,
                f"expected a {fmt} document (a mapping), got {type(data).__name__}",
                "see docs/formats.md",
            )
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise KVPlanError(diagnostics_from_validation(exc, source)) from None


def parse_input(data: Any, source: str = "<input>") -> InputDocument:
    return _parse(InputDocument, data, source, INPUT_FORMAT)


def parse_plan(data: Any, source: str = "<plan>") -> BindingPlan:
    return _parse(BindingPlan, data, source, PLAN_FORMAT)


def load_input(path: str | Path) -> InputDocument:
    """Read a ``kvplan.input/1`` document from JSON or YAML."""
    return parse_input(read_data(path), str(path))


def load_plan(path: str | Path) -> BindingPlan:
    """Read a ``kvplan.plan/1`` document from JSON or YAML."""
    return parse_plan(read_data(path), str(path))


def load_any(path: str | Path) -> InputDocument | LegacyInputDocument | BindingPlan:
    """Read any document kind, chosen by its ``format`` field (input, legacy input, plan)."""
    from kvplan.schemas.legacy import LEGACY_INPUT_FORMAT, parse_legacy

    data = read_data(path)
    if isinstance(data, dict) and data.get("format") == PLAN_FORMAT:
        return parse_plan(data, str(path))
    if isinstance(data, dict) and data.get("format") == LEGACY_INPUT_FORMAT:
        return parse_legacy(data, str(path))
    return parse_input(data, str(path))


def dumps(obj: BaseModel, *, yaml_format: bool = False) -> str:
    return to_yaml(obj) if yaml_format else to_json(obj)


def dump(obj: BaseModel, path: str | Path) -> None:
    """Write ``obj`` canonically: YAML for .yaml/.yml, JSON otherwise."""
    Path(path).write_text(
        dumps(obj, yaml_format=str(path).endswith(YAML_SUFFIXES)), encoding="utf-8"
    )
