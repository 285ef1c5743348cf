"""The options ``kvplan inspect`` and ``kvplan golden add`` share, defined once.

:class:`InspectFlags` declares each option (name, default, help) as a field;
:func:`with_inspect_flags` adds those fields to a command's parameters and hands the command
one ``flags: InspectFlags``. Both commands therefore accept the same options, record the same
:class:`~kvplan.integrations.vllm.inspect.InspectOptions`, and a new option is one field here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, get_type_hints

import typer

from kvplan import units

if TYPE_CHECKING:
    from kvplan.integrations.vllm.inspect import InspectOptions

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class InspectFlags:
    """What to plan for, as typed on the command line (mirrors ``vllm serve`` flags)."""

    gpu_memory: Annotated[
        str, typer.Option("--gpu-memory", help="GPU memory to plan for, e.g. 80GiB")
    ] = "80GiB"
    gpu_memory_utilization: Annotated[
        str | None,
        typer.Option(
            "--gpu-memory-utilization",
            metavar="FRACTION",
            help="fraction of --gpu-memory for the KV cache (KV = memory x this); default: "
            "vLLM's (0.9; 0.34: 1.0 with its extensible KV cache, else 0.92)",
        ),
    ] = None
    reserve_weights: Annotated[
        bool,
        typer.Option(
            "--reserve-weights", help="subtract the weights (as built) from the KV memory"
        ),
    ] = False
    num_blocks: Annotated[
        str | None,
        typer.Option("--num-blocks", metavar="N", help="vLLM's --num-gpu-blocks-override"),
    ] = None
    max_model_len: Annotated[str | None, typer.Option("--max-model-len", metavar="N")] = None
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype")] = "auto"
    block_size: Annotated[str | None, typer.Option("--block-size", metavar="N")] = None
    tp: Annotated[str, typer.Option("--tp", metavar="N", help="tensor-parallel size")] = "1"
    layout: Annotated[
        str | None, typer.Option("--layout", help="KV cache layout, e.g. LBNHC, BLHNC")
    ] = None
    no_hybrid: Annotated[
        bool,
        typer.Option("--disable-hybrid-kv-cache-manager", help="as vLLM's flag of the same name"),
    ] = False
    attention_backend: Annotated[
        str | None, typer.Option("--attention-backend", help="vLLM backend name")
    ] = None
    trust_remote_code: Annotated[
        bool,
        typer.Option(
            "--trust-remote-code",
            help="as vLLM's flag: run the model repository's own code (config auto_map)",
        ),
    ] = False
    extensible_kv_cache: Annotated[
        bool | None,
        typer.Option(
            "--enable-extensible-kv-cache/--no-enable-extensible-kv-cache",
            help="vLLM 0.34+: as vLLM's flag (default: vLLM's choice, on for CUDA; kvplan's "
            "plugin turns it off)",
        ),
    ] = None

    def options(self) -> InspectOptions:
        """The :class:`InspectOptions` these flags ask for (``KVP020`` for a bad size,
        ``KVP406`` for a number that is not ASCII digits). Read before vLLM is imported."""
        values: dict[str, Any] = {}
        for f in fields(self):
            value, parse = getattr(self, f.name), _PARSERS.get(f.name)
            if parse is not None and value is not None:
                value = parse(value, "--" + f.name.replace("_", "-"))
            values[_RENAMED.get(f.name, f.name)] = value
        from kvplan.integrations.vllm.inspect import InspectOptions

        return InspectOptions(**values)


_PARSERS: dict[str, Callable[[str, str], object]] = {
    "gpu_memory": units.parse_size,
    "gpu_memory_utilization": units.parse_number,
    "num_blocks": units.parse_int,
    "max_model_len": units.parse_int,
    "block_size": units.parse_int,
    "tp": functools.partial(units.parse_int, minimum=1),
}
"""How the flags typed as text are read, each given its option name (``--`` and the field's
name) for the refusal; the other flags are passed as typed."""
_RENAMED = {"no_hybrid": "disable_hybrid_kv_cache_manager"}
"""Flags whose :class:`InspectOptions` field has another name."""


def with_inspect_flags(command: _F) -> _F:
    """``command`` with every :class:`InspectFlags` field as an option besides its own
    parameters; it is called with them collected as ``flags``."""
    hints = get_type_hints(InspectFlags, include_extras=True)
    keyword = inspect.Parameter.KEYWORD_ONLY
    shared = [
        inspect.Parameter(f.name, keyword, default=f.default, annotation=hints[f.name])
        for f in fields(InspectFlags)
    ]
    names = [p.name for p in shared]
    own = [
        p.replace(kind=keyword)
        for p in inspect.signature(command, eval_str=True).parameters.values()
        if p.name != "flags"
    ]

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        flags = InspectFlags(**{name: kwargs.pop(name) for name in names if name in kwargs})
        return command(*args, flags=flags, **kwargs)

    # typer calls with keywords only; the shared options are listed first in --help
    run.__signature__ = inspect.Signature([*shared, *own])  # type: ignore[attr-defined]
    return run  # type: ignore[return-value]
