"""Properties of the one document reader, for any bytes: a value or a ``KVPlanError``,
never another exception; and the JSON and YAML readers agree on what they accept."""

from __future__ import annotations

import json
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.schemas import loading
from kvplan.schemas.errors import KVPlanError

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
documents = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=30,
)


def _read(data: bytes, name: str) -> Any:
    return loading.parse_text(loading.decode_text(data, name), name)


@SETTINGS
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".json", ".yaml", ".txt"]))
def test_any_bytes_give_a_value_or_a_coded_error(data: bytes, suffix: str) -> None:
    try:
        _read(data, "doc" + suffix)
    except KVPlanError as exc:
        assert exc.diagnostics and exc.code.value.startswith("KVP0")


@SETTINGS
@given(text=st.text(alphabet="{}[]:,\"'&*!-? \n\t#abc019", max_size=200))
def test_structural_noise_gives_a_value_or_a_coded_error(text: str) -> None:
    for suffix in (".json", ".yaml"):
        try:
            _read(text.encode(), "doc" + suffix)
        except KVPlanError as exc:
            assert exc.code.value.startswith("KVP0")


def _in_range(value: Any) -> bool:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, int):
        return loading.INT64_MIN <= value <= loading.INT64_MAX
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, list):
        return all(_in_range(v) for v in value)
    return all(_in_range(v) for v in value.values())


@SETTINGS
@given(doc=documents)
def test_json_and_yaml_accept_the_same_documents(doc: Any) -> None:
    outcomes = []
    for name, text in (
        ("doc.json", json.dumps(doc)),
        ("doc.yaml", yaml.safe_dump(doc)),
    ):
        try:
            outcomes.append(("ok", _read(text.encode(), name)))
        except KVPlanError as exc:
            outcomes.append(("refused", exc.code))
    if (
        _in_range(doc)
        and doc not in (None, "", [], {})
        and not (isinstance(doc, str) and not doc.strip())
    ):
        assert outcomes[0][0] == outcomes[1][0] == "ok", outcomes
        assert outcomes[0][1] == outcomes[1][1] == doc or doc != doc
    elif not _in_range(doc):
        assert [o[1] for o in outcomes] == [loading.Code.NUMBER_OUT_OF_RANGE] * 2, outcomes
