"""Lossless conversion between vLLM's own ``KVCacheConfig`` and kvplan's input document.

Both directions walk dataclass fields generically, so every ``KVCacheSpec`` subclass of the
installed vLLM is handled without a per-class table: ``capture`` writes a spec's class name as
``kind`` and each field's value in kvplan's JSON form (dtype names, enum member names,
``Fraction`` as ``"n/d"``, ``MultipleOf`` as ``{"multiple_of": n}``); ``to_vllm`` reads the
field types back from the vLLM classes' annotations.

Which releases are supported, and the fields a release lacks, come from its version adapter
(:mod:`kvplan.integrations.vllm.versions`): such a field is neither read from nor passed to
that release. Public through ``kvplan.integrations.vllm.convert`` and the package:
``from kvplan.integrations.vllm import capture``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from enum import Enum
from fractions import Fraction
from functools import cache
from typing import TYPE_CHECKING, Any

import torch

from kvplan.schemas.canonical import to_data
from kvplan.schemas.errors import Code, KVPlanError, error
from kvplan.schemas.input import InputDocument
from kvplan.schemas.layout import parse_layout
from kvplan.schemas.loading import parse_input

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

    from kvplan.integrations.vllm.versions import VersionAdapter


def installed_adapter() -> tuple[VersionAdapter, str]:
    """The adapter of the installed vLLM and its version; ``KVP501`` if it is unsupported."""
    import vllm

    from kvplan.integrations.vllm.versions import adapter_for, supported_range

    version = str(getattr(vllm, "__version__", "unknown"))
    adapter = adapter_for(version)
    if adapter is None:
        raise KVPlanError(
            error(
                Code.INTEGRATION,
                "vllm.__version__",
                f"kvplan does not support vLLM {version}; it supports vLLM {supported_range()}.",
                "install a supported vLLM (pip install 'kvplan[vllm]')",
            )
        )
    return adapter, version


def _adapter_here(adapter: VersionAdapter | None) -> tuple[VersionAdapter, str]:
    installed, version = installed_adapter()
    if adapter is None:
        return installed, version
    if not adapter.covers(version):
        raise KVPlanError(
            error(
                Code.INTEGRATION,
                "vllm.__version__",
                f"the {adapter.name} adapter does not cover the installed vLLM {version}.",
                f"use the installed release's adapter ({installed.name})",
            )
        )
    return adapter, version


# -- vLLM -> document ---------------------------------------------------------------------


def _is_spec(value: Any) -> bool:
    """A vLLM ``KVCacheSpec`` instance (by class name: works for every vLLM version)."""
    return any(cls.__name__ == "KVCacheSpec" for cls in type(value).__mro__)


def encode_value(value: Any) -> Any:
    """A vLLM value (spec, dtype, enum, Fraction, MultipleOf, containers) in kvplan's JSON form.

    Imports nothing from vLLM, so it serves the 0.22-0.24 capture too.
    """
    if value is None or isinstance(value, bool | str | float):
        return value
    if isinstance(value, Enum):  # before int: KVQuantMode is an IntEnum
        return value.name
    if isinstance(value, int):
        return value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return value.numerator
        return f"{value.numerator}/{value.denominator}"
    if type(value).__name__ == "MultipleOf":
        return {"multiple_of": value.base}
    if _is_spec(value):
        return {"kind": type(value).__name__, **encode_fields(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return encode_fields(value)
    if isinstance(value, Mapping):
        return {str(key): encode_value(item) for key, item in value.items()}
    if isinstance(value, Sequence):
        return [encode_value(item) for item in value]
    raise TypeError(f"kvplan cannot encode a {type(value).__name__} ({value!r})")


DERIVED_FIELDS = {"KVCacheConfig": ("needs_kv_cache_zeroing",)}
"""vLLM fields declared ``init=False`` that a document records all the same (0.34: derived in
``__post_init__``, then OR-ed across workers): captured when the class has them, set on the
rebuilt object after construction."""


def _derived(cls: type) -> tuple[str, ...]:
    names = {f.name for f in dataclasses.fields(cls) if not f.init}
    return tuple(n for n in DERIVED_FIELDS.get(cls.__name__, ()) if n in names)


def encode_fields(obj: Any) -> dict[str, Any]:
    """Each init field of dataclass ``obj`` (and its :data:`DERIVED_FIELDS`), encoded by
    :func:`encode_value`."""
    names = [f.name for f in dataclasses.fields(obj) if f.init] + list(_derived(type(obj)))
    return {name: encode_value(getattr(obj, name)) for name in names}


def worker_form(
    kv_cache_config: KVCacheConfig, shared_kv_cache_layers: Mapping[str, str]
) -> tuple[KVCacheConfig, bool]:
    """``kv_cache_config`` without runner-appended KV-sharing layers, and whether it had them.

    The runner's KV-sharing append puts each sharer in its target's group (``layer_names``
    only); the scheduler/worker form has no sharers anywhere. The input is not modified.
    """
    sharers = set(shared_kv_cache_layers)
    appended = any(
        name in sharers for group in kv_cache_config.kv_cache_groups for name in group.layer_names
    )
    for tensor in kv_cache_config.kv_cache_tensors:
        backed = sharers.intersection(tensor.layers)
        if backed:
            raise KVPlanError(
                error(
                    Code.INTEGRATION,
                    "kv_cache_config.kv_cache_tensors",
                    f"KV-sharing layers own cache tensors: {sorted(backed)}.",
                    "a sharer must not appear in kv_cache_tensors; pass the map of the "
                    "layers that read another layer's cache.",
                )
            )
    if not appended:
        return kv_cache_config, False
    groups = []
    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        owned = [name for name in group.layer_names if name not in sharers]
        for name in group.layer_names:
            target = shared_kv_cache_layers.get(name)
            if target is not None and target not in group.layer_names:
                raise KVPlanError(
                    error(
                        Code.INTEGRATION,
                        f"kv_cache_config.kv_cache_groups[{gid}]",
                        f"{name} shares {target}'s cache but sits in another group.",
                        "vLLM appends each sharer to its target's group.",
                    )
                )
        groups.append(dataclasses.replace(group, layer_names=owned))
    return dataclasses.replace(kv_cache_config, kv_cache_groups=groups), True


def _refuse_unmodelled_specs(config: Any, adapter: VersionAdapter, version: str) -> None:
    """``KVP501`` naming each spec class of the release that kvplan does not model."""
    if not adapter.unmodelled_specs:
        return
    problems = []
    for gid, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        inner = getattr(spec, "kv_cache_specs", None)
        for each in inner.values() if isinstance(inner, Mapping) else (spec,):
            kind = type(each).__name__
            why = adapter.unmodelled_specs.get(kind)
            if why is not None:
                problems.append(
                    error(
                        Code.INTEGRATION,
                        f"kv_cache_config.kv_cache_groups[{gid}].kv_cache_spec",
                        f"vLLM {version}'s {kind} is {why}.",
                        f"run this model without kvplan on vLLM {version} (unset "
                        "KVPLAN_ENABLE), or on a release kvplan supports without that spec",
                    )
                )
                break
    if problems:
        raise KVPlanError(problems)


def capture(
    kv_cache_config: KVCacheConfig,
    *,
    shared_kv_cache_layers: Mapping[str, str],
    kernel_block_sizes: Sequence[int] | None = None,
    layout: object | None = None,
    metadata: Mapping[str, Any] | None = None,
    adapter: VersionAdapter | None = None,
) -> InputDocument:
    """The input document of one worker's ``KVCacheConfig`` (lossless).

    ``kv_cache_config`` may be the worker's config or the runner's copy after its KV-sharing
    append: appended sharers are removed from the groups (the map keeps them). ``layout`` is
    a vLLM ``KVCacheLayout`` or its name; it fills a config whose ``kv_cache_layout`` is unset
    and must agree with one that is set. ``adapter`` defaults to the installed vLLM's
    (``KVP501`` when that release is unsupported); the document records ``vllm_version``.
    """
    adapter, version = _adapter_here(adapter)
    if adapter.form != "placement":
        raise KVPlanError(
            error(
                Code.INTEGRATION,
                "kv_cache_config",
                f"vLLM {version} uses the {adapter.form} config form; kvplan.input/1 holds the "
                "placement form.",
                "capture it with kvplan.integrations.vllm.convert.legacy",
            )
        )
    _refuse_unmodelled_specs(kv_cache_config, adapter, version)
    config, appended = worker_form(kv_cache_config, shared_kv_cache_layers)
    data = encode_fields(config)
    if layout is not None:
        wanted = parse_layout(layout).name
        stamped = data.get("kv_cache_layout")
        if stamped is not None and parse_layout(stamped).name != wanted:
            raise KVPlanError(
                error(
                    Code.INTEGRATION,
                    "kv_cache_config.kv_cache_layout",
                    f"the config says {stamped} but layout={wanted} was passed.",
                )
            )
        data["kv_cache_layout"] = wanted
    meta = dict(metadata or {})
    if appended:
        meta.setdefault("captured_from", "runner")
    document = {
        "vllm_version": version,
        "kv_cache_config": data,
        "shared_kv_cache_layers": dict(shared_kv_cache_layers),
        "kernel_block_sizes": None if kernel_block_sizes is None else list(kernel_block_sizes),
        "metadata": meta,
    }
    try:
        return parse_input(document, f"vLLM {version}'s KVCacheConfig")
    except KVPlanError as exc:  # the schema's findings, led by what they mean here
        lead = error(
            Code.INTEGRATION,
            "kv_cache_config",
            f"vLLM {version} produced values kvplan's schema rejects",
            "kvplan may not know this vLLM version's spec fields yet",
        )
        raise KVPlanError([lead, *exc.diagnostics]) from None


# -- document -> vLLM ---------------------------------------------------------------------


def _all_subclasses(cls: type) -> list[type]:
    found: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


def spec_classes() -> dict[str, type[KVCacheSpec]]:
    """Every ``KVCacheSpec`` class the installed vLLM has loaded, by class name."""
    from vllm.v1.kv_cache_interface import KVCacheSpec

    return {cls.__name__: cls for cls in _all_subclasses(KVCacheSpec)}


def spec_class(kind: str) -> type[KVCacheSpec]:
    """The vLLM spec class called ``kind``."""
    classes = spec_classes()
    if kind not in classes:
        raise KVPlanError(
            error(
                Code.UNKNOWN_SPEC_KIND,
                "kind",
                f"the installed vLLM has no KV-cache spec class {kind!r}.",
                f"known: {', '.join(sorted(classes))}.",
            )
        )
    return classes[kind]


@cache
def _hints(cls: type) -> dict[str, Any]:
    from vllm.v1.attention.backend import MultipleOf

    localns = {"MultipleOf": MultipleOf, "VllmConfig": Any}
    return typing.get_type_hints(cls, localns=localns)


def _decode(hint: Any, value: Any) -> Any:
    """``value`` (kvplan's JSON form) as the vLLM type ``hint``."""
    from vllm.v1.kv_cache_interface import KVCacheSpec

    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        if isinstance(value, dict):
            options = [o for o in options if dataclasses.is_dataclass(o) or o is dict]
        elif isinstance(value, str) and Fraction in options:
            return Fraction(value)
        elif any(isinstance(o, type) and isinstance(value, o) for o in options):
            return value
        return _decode(options[0], value)
    if hint is torch.dtype:
        dtype = getattr(torch, value, None)
        if not isinstance(dtype, torch.dtype):
            raise KVPlanError(error(Code.UNKNOWN_DTYPE, "dtype", f"torch has no dtype {value!r}."))
        return dtype
    if isinstance(hint, type) and issubclass(hint, Enum):
        if isinstance(value, str) and value in hint.__members__:
            return hint[value]
        return hint(value)
    if hint is Fraction:
        return Fraction(value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], item) for item in value)
        return tuple(_decode(arg, item) for arg, item in zip(args, value, strict=True))
    if origin is list:
        return [_decode(args[0], item) for item in value]
    if origin is dict:
        return {key: _decode(args[1], item) for key, item in value.items()}
    if isinstance(hint, type) and issubclass(hint, KVCacheSpec):
        return _decode_spec(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hint.__name__ == "MultipleOf":
            return typing.cast(Any, hint)(value["multiple_of"])
        return _decode_dataclass(hint, value)
    return value


def _absent_in_release(cls: type, data: Mapping[str, Any], absent: Mapping[str, Any]) -> dict:
    """``data`` without the fields the release lacks (declared by its adapter for ``cls`` or a
    base class); ``KVP505`` if the document sets one to anything but its unset value."""
    lacking: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        lacking.update(absent.get(base.__name__, {}))
    out = dict(data)
    for name, unset in lacking.items():
        if name not in out:
            continue
        value = out.pop(name)
        if value != unset:
            raise KVPlanError(
                error(
                    Code.FIELD_NOT_IN_RELEASE,
                    f"{cls.__name__}.{name}",
                    f"the document sets {name}={value!r}, but this vLLM release's "
                    f"{cls.__name__} has no {name} field to hold it.",
                    "rebuild the document on the vLLM release that captured it "
                    "(its vllm_version), or leave the field unset",
                )
            )
    return out


_ABSENT: ContextVar[Mapping[str, Mapping[str, Any]] | None] = ContextVar(
    "kvplan_absent", default=None
)
"""The fields the target release lacks, while :func:`to_vllm` decodes."""


def _decode_dataclass(cls: type, data: Mapping[str, Any]) -> Any:
    hints = _hints(cls)
    data = _absent_in_release(cls, data, _ABSENT.get() or {})
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    derived = {name: data[name] for name in _derived(cls) if name in data}
    unknown = set(data) - known - set(derived) - {"kind"}
    if unknown:
        raise KVPlanError(
            error(
                Code.INTEGRATION,
                cls.__name__,
                f"vLLM's {cls.__name__} has no field(s) {sorted(unknown)}.",
                "the document was written for another vLLM version.",
            )
        )
    kwargs = {name: _decode(hints[name], value) for name, value in data.items() if name in known}
    obj = cls(**kwargs)
    for name, value in derived.items():
        setattr(obj, name, _decode(hints[name], value))
    return obj


def _decode_spec(data: Mapping[str, Any]) -> KVCacheSpec:
    return typing.cast("KVCacheSpec", _decode_dataclass(spec_class(data["kind"]), data))


def to_vllm(
    document: InputDocument, *, with_sharers: bool = False, adapter: VersionAdapter | None = None
) -> KVCacheConfig:
    """vLLM's ``KVCacheConfig`` for ``document`` (``==`` the captured one).

    ``with_sharers`` reproduces the runner's copy: each KV-sharing layer appended to its
    target's group, as ``add_kv_sharing_layers_to_kv_cache_groups`` does. Fields the
    installed release lacks (see its adapter) are left out when unset, else ``KVP505``.
    """
    from vllm.v1.kv_cache_interface import KVCacheConfig

    adapter, version = _adapter_here(adapter)
    token = _ABSENT.set(adapter.fields_absent_in(version))
    try:
        config = _decode_dataclass(KVCacheConfig, to_data(document.kv_cache_config))
    finally:
        _ABSENT.reset(token)
    if with_sharers:
        from vllm.v1.worker.utils import add_kv_sharing_layers_to_kv_cache_groups

        add_kv_sharing_layers_to_kv_cache_groups(
            dict(document.shared_kv_cache_layers), config.kv_cache_groups
        )
    return typing.cast("KVCacheConfig", config)


def request_blocks(kv_cache_config: Any, vllm_config: Any) -> int:
    """The block ids one request of ``max_model_len`` tokens takes, summed over the config's
    KV cache groups: what vLLM's own ``max_memory_usage_bytes`` admits per group, in pages
    (see :mod:`kvplan.elastic.floor`)."""
    blocks = 0
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        page = int(spec.page_size_bytes)
        if page > 0:
            blocks += -(-int(spec.max_memory_usage_bytes(vllm_config)) // page)
    return blocks
