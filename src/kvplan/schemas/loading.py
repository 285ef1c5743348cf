"""Reading and writing documents (JSON or YAML by suffix), with KVP errors instead of tracebacks.

The one reader (:func:`read_bytes`, in the private ``_reading``), the one writer
(:func:`write_text_atomic`, in ``_writing``) and pydantic's errors as diagnostics
(:func:`diagnostics_from_validation`, in ``_validation``) are importable from here; this module
adds what turns their bytes into documents: ``parse_*``, ``load_*``, ``dump``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kvplan.schemas._reading import (
    INT64_MAX,
    INT64_MIN,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_VALUES,
    YAML_SUFFIXES,
    decode_text,
    file_kind,
    is_trusted_owner,
    open_below,
    owner_text,
    parse_text,
    read_bytes,
    read_data,
)
from kvplan.schemas._validation import diagnostics_from_validation
from kvplan.schemas._writing import (
    OutputError,
    check_output,
    refuse_output_over_input,
    same_file,
    write_text_atomic,
)
from kvplan.schemas.canonical import Document, fingerprint, to_json, to_yaml
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, error, show_value
from kvplan.schemas.input import INPUT_FORMAT, InputDocument
from kvplan.schemas.legacy import LEGACY_INPUT_FORMAT, LegacyInputDocument, parse_legacy
from kvplan.schemas.plan import PLAN_FORMAT, BindingPlan

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_VALUES",
    "YAML_SUFFIXES",
    "Code",
    "OutputError",
    "check_output",
    "decode_text",
    "diagnostics_from_validation",
    "dump",
    "dumps",
    "file_kind",
    "is_bundle",
    "is_trusted_owner",
    "load_any",
    "load_input",
    "load_plan",
    "open_below",
    "owner_text",
    "parse_any",
    "parse_input",
    "parse_plan",
    "parse_text",
    "read_bytes",
    "read_data",
    "refuse_output_over_input",
    "same_file",
    "write_text_atomic",
]

_M = TypeVar("_M", bound=BaseModel)
BUNDLE_KEYS = frozenset({"input", "plan"})
"""What ``kvplan inspect -o``/``--json`` writes: ``{"input": <input>, "plan": <its plan>}``."""


def _parse(model: type[_M], data: Any, source: str, fmt: str) -> _M:
    if isinstance(data, dict) and data.get("format") not in (None, fmt):
        raise KVPlanError(
            error(
                Code.WRONG_FORMAT,
                f"{source}: format",
                f"format is {show_value(data.get('format'))}, expected {fmt!r}",
                "pass an input document to plan, a plan to show/apply",
            )
        )
    if not isinstance(data, dict):
        raise KVPlanError(
            error(
                Code.SCHEMA,
                source,
                f"expected a {fmt} document (a mapping), got {show_value(data)}",
                "see docs/formats.md",
            )
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise KVPlanError(diagnostics_from_validation(exc, source, data)) from None


def parse_input(data: Any, source: str = "<input>") -> InputDocument:
    return _parse(InputDocument, data, source, INPUT_FORMAT)


def parse_plan(data: Any, source: str = "<plan>") -> BindingPlan:
    return _parse(BindingPlan, data, source, PLAN_FORMAT)


def is_bundle(data: Any) -> bool:
    """Whether ``data`` is what ``kvplan inspect -o`` writes: an input document and its plan."""
    return isinstance(data, dict) and set(data) == BUNDLE_KEYS


def _in_half(exc: KVPlanError, half: str) -> KVPlanError:
    """``exc`` with every location inside the bundle's ``half`` (``plan.views``)."""
    out = []
    for d in exc.diagnostics:
        where = d.location if d.location.startswith(half) else f"{half}.{d.location}"
        out.append(Diagnostic(**{**d.model_dump(), "location": where.rstrip(".")}))
    return KVPlanError(out)


def _parse_bundle(data: dict[str, Any], source: str) -> BindingPlan:
    """The plan of an inspect bundle, once its input is valid and is the plan's input."""
    inner = data["input"]
    try:
        if isinstance(inner, dict) and inner.get("format") == LEGACY_INPUT_FORMAT:
            document: InputDocument | LegacyInputDocument = parse_legacy(inner, "input")
        else:
            document = parse_input(inner, "input")
    except KVPlanError as exc:
        raise _in_half(exc, "input") from None
    try:
        plan = parse_plan(data["plan"], "plan")
    except KVPlanError as exc:
        raise _in_half(exc, "plan") from None
    if plan.fingerprint != fingerprint(document):
        raise KVPlanError(
            error(
                Code.BUNDLE_MISMATCH,
                f"{source}: plan.fingerprint",
                "this `kvplan inspect` bundle's plan was not made from its input (the "
                "fingerprints differ): one of the two was edited.",
                "re-run kvplan inspect -o, or split the bundle and re-plan the input with "
                "kvplan plan",
            )
        )
    return plan


def parse_any(data: Any, source: str) -> InputDocument | LegacyInputDocument | BindingPlan:
    """Any document kind, chosen by its ``format`` field (input, legacy input, plan), or the
    plan of a ``kvplan inspect`` bundle (``{"input": ..., "plan": ...}``, ``KVP027`` when the
    plan is not its input's)."""
    if is_bundle(data):
        return _parse_bundle(data, source)
    if isinstance(data, dict) and data.get("format") == PLAN_FORMAT:
        return parse_plan(data, source)
    if isinstance(data, dict) and data.get("format") == LEGACY_INPUT_FORMAT:
        return parse_legacy(data, source)
    return parse_input(data, source)


def load_input(path: str | Path, *, within: str | Path | None = None) -> InputDocument:
    """Read a ``kvplan.input/1`` document from JSON or YAML (``within``: see ``read_bytes``)."""
    return parse_input(read_data(path, within=within), str(path))


def load_plan(
    path: str | Path, *, within: str | Path | None = None, own: bool = False
) -> BindingPlan:
    """Read a ``kvplan.plan/1`` document from JSON or YAML (``within``, ``own``: see
    ``read_bytes``)."""
    return parse_plan(read_data(path, within=within, own=own), str(path))


def load_any(path: str | Path) -> InputDocument | LegacyInputDocument | BindingPlan:
    """Read any document kind (see :func:`parse_any`)."""
    return parse_any(read_data(path), str(path))


def dumps(obj: Document, *, yaml_format: bool = False) -> str:
    return to_yaml(obj) if yaml_format else to_json(obj)


def dump(
    obj: Document,
    path: str | Path,
    *,
    inputs: Sequence[str | Path] = (),
    within: str | Path | None = None,
    make_dirs: bool = False,
    own: bool = False,
) -> None:
    """Write ``obj`` canonically (YAML for .yaml/.yml, JSON otherwise), atomically, through
    the one writer (:func:`write_text_atomic`, with its refusals; ``own`` there)."""
    text = dumps(obj, yaml_format=str(path).endswith(YAML_SUFFIXES))
    write_text_atomic(path, text, inputs=inputs, within=within, make_dirs=make_dirs, own=own)
