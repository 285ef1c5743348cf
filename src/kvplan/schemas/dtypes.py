"""Storage dtypes a KV cache can be viewed as, written as torch names without ``torch.``."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BeforeValidator

DTypeName = Literal[
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "bool",
]
"""Every torch dtype name kvplan accepts for a KV-cache view."""

DTYPE_NAMES: tuple[str, ...] = get_args(DTypeName)

_ITEMSIZE: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
}

DType = Annotated[DTypeName, BeforeValidator(lambda value: normalize_dtype(value))]
"""A dtype field: accepts ``bfloat16``, ``torch.bfloat16`` or a torch dtype object."""

_ALIASES: dict[str, str] = {"half": "float16", "float": "float32", "double": "float64"}


def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` (a name from :data:`DTYPE_NAMES`)."""
    return _ITEMSIZE[dtype]


def normalize_dtype(value: object) -> object:
    """Accept ``torch.bfloat16``-style strings and torch dtype objects; leave others alone."""
    if not isinstance(value, str):
        text = str(value)
        if not text.startswith("torch."):
            return value
        value = text
    name = value.removeprefix("torch.")
    return _ALIASES.get(name, name)
