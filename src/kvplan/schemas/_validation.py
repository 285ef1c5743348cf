"""pydantic's validation errors as KVP diagnostics, located at the offending document field.

Private to :mod:`kvplan.schemas`: the document parsers (``loading``, ``legacy``) use it, and
:mod:`kvplan.schemas.loading` re-exports :func:`diagnostics_from_validation`. It imports only
``errors`` and ``specs``, so no parser module imports another to report its errors.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from kvplan.schemas.errors import Code, Diagnostic, error, show_value
from kvplan.schemas.specs import SPEC_KINDS

_BOUND_CODES = {"string_too_long": Code.NAME_TOO_LONG, "too_long": Code.TOO_MANY_ITEMS}
"""pydantic's length errors, which the schema's bounds raise (``kvplan.schemas.bounds``)."""
_BOUND_HINTS = {
    "string_too_long": "kvplan documents name layers and pools in a few dozen characters; "
    "pass the right file",
    "too_long": "no vLLM model has that many layers, pools or dimensions; pass the right file",
}


def _loc(parts: tuple[int | str, ...]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _document_loc(data: Any, loc: tuple[int | str, ...], kind: str) -> tuple[int | str, ...]:
    """The part of pydantic's ``loc`` that names places in the document itself.

    pydantic inserts union members (``constrained-int``, ``MultipleOf``, a spec kind) into
    ``loc``; they are dropped by walking ``data``. A missing field keeps its name.
    """
    out: list[int | str] = []
    current = data
    for index, part in enumerate(loc):
        inside = isinstance(current, dict) and part in current
        if inside or (
            isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current)
        ):
            out.append(part)
            current = current[part]
        elif index == len(loc) - 1 and kind == "missing" and isinstance(current, dict):
            out.append(part)
    return tuple(out)


def diagnostics_from_validation(
    exc: ValidationError, source: str, data: Any = None
) -> list[Diagnostic]:
    """Turn pydantic's errors into KVP diagnostics with the offending field as location.

    With ``data`` (the document as parsed), locations name only document fields, and a field
    gets one diagnostic even when several union members refused it.
    """
    out: list[Diagnostic] = []
    seen: set[tuple[int | str, ...]] = set()
    for item in exc.errors(include_url=False):
        loc = tuple(p for p in item["loc"])
        kind = item["type"]
        if isinstance(data, dict):
            clean = _document_loc(data, loc, kind)
            if clean in seen:
                continue
            seen.add(clean)
        else:
            # discriminated unions insert the tag value into loc; drop it for readability
            clean = tuple(p for p in loc if not (isinstance(p, str) and p in SPEC_KINDS))
        where = _loc(clean) or source
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
                        f"unknown spec kind {show_value(tag)}; kvplan knows: "
                        + ", ".join(SPEC_KINDS),
                        "use a vLLM 0.33 KVCacheSpec class name",
                    )
                )
            continue
        if kind in _BOUND_CODES:
            got = item.get("input")
            size = f" ({len(got):,} given)" if isinstance(got, str | list | dict) else ""
            out.append(error(_BOUND_CODES[kind], where, f"{msg}{size}", _BOUND_HINTS[kind]))
            continue
        last = clean[-1] if clean else ""
        parent = clean[-2] if len(clean) > 1 else ""
        if kind == "literal_error" and (last == "dtype" or parent == "dtypes"):
            out.append(
                error(
                    Code.UNKNOWN_DTYPE,
                    where,
                    f"unknown dtype {show_value(item.get('input'))}",
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
                    f"format is {show_value(item.get('input'))}, "
                    f"expected {item['ctx']['expected']}",
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
                got = show_value(item.get("input"))
                if "input" in item and got not in text:
                    text = f"{text} (got {got})"
            out.append(error(Code.SCHEMA, where, text, "see docs/formats.md"))
    return out
