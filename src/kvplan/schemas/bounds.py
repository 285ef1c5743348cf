"""How large the parts of a document may be: checked by the schema when a document is read.

A document is already bounded as a whole (16 MiB, a million values: ``loading``); these
bound what one name or one list may hold, so that no single field makes a command's work or
output (an ``--html`` page, a table) grow past what real models need. A name longer than
:data:`MAX_NAME_CHARS` is ``KVP025``; a list or mapping longer than its bound is ``KVP026``
(mapped from pydantic's ``string_too_long`` / ``too_long`` by ``diagnostics_from_validation``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

MAX_NAME_CHARS = 256
"""Longest string in a document (a layer, pool, backend or version name). vLLM's longest
layer names are under 100 characters (``model.language_model.layers.47.self_attn.attn``)."""
MAX_ITEMS = 16384
"""Most layers in a list (a group, a tensor, the sharing map), views, aliases, pools, groups
or tensors in one document: over a hundred times the layers of the largest real model (118,
Nemotron-H 56B), and what ``kvplan show``/``--html`` still draw in about 2 s of CPU."""
MAX_DIMS = 16
"""Most dimensions of a view, a Mamba state or a backend's cache shape (vLLM's have 4 to 6)."""

FROZEN = ConfigDict(frozen=True, extra="forbid", str_max_length=MAX_NAME_CHARS)
"""The model configuration of every document model: immutable, no unknown fields, every
string bounded."""


def items(**kwargs: Any) -> Any:
    """``Field(max_length=MAX_ITEMS, ...)``: a bounded list or mapping field."""
    return Field(max_length=MAX_ITEMS, **kwargs)


Dims = Annotated[list[int], Field(max_length=MAX_DIMS)]
"""A shape or stride: at most :data:`MAX_DIMS` entries."""


class OmitsLaterFields(BaseModel):
    """A document model with fields a later vLLM release added: each field named in
    ``LATER_FIELDS`` is left out of the dumped document while it holds its default, so every
    document written before the field existed (golden plans, fingerprints) stays byte for byte
    what it was, and one that needs the field says so."""

    LATER_FIELDS: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_later_fields_at_default(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        fields = type(self).model_fields
        for name in self.LATER_FIELDS:
            if (
                isinstance(data, dict)
                and name in data
                and getattr(self, name) == fields[name].default
            ):
                del data[name]
        return data
