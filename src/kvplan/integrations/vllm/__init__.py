"""kvplan ⇄ vLLM: capture real ``KVCacheConfig`` objects, ask vLLM to plan models, and bind
vLLM's KV caches from validated plans (the start-up plugin, eager or elastic).

The integration is a house of rooms, each importing only from the rooms below it
(``docs/architecture.md``; ``tests/test_layering.py`` checks it):

``versions/`` which release does what → ``environment`` is vLLM here → ``convert/`` vLLM
objects ⇄ ``kvplan.input/1`` → ``inspect/`` a model's KV config built on the CPU →
``pipeline/`` one allocation: capture → plan → reviewed → bind → verify → ``elastic/`` live
elastic serving → ``plugin/`` the entry point, composing the modes → ``doctor``.

Importing this package does not import vLLM or torch; the names below load their module on
first use. Everything here needs the ``vllm`` extra (``pip install 'kvplan[vllm]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.environment import (
    VLLM_EXTRA_HINT,
    prepare_environment,
    require_vllm,
    vllm_available,
)

if TYPE_CHECKING:
    from kvplan.integrations.vllm.convert import capture, to_vllm
    from kvplan.integrations.vllm.inspect import InspectOptions, InspectResult, inspect_model

__all__ = [
    "VLLM_EXTRA_HINT",
    "InspectOptions",
    "InspectResult",
    "capture",
    "inspect_model",
    "prepare_environment",
    "require_vllm",
    "to_vllm",
    "vllm_available",
]


def __getattr__(name: str) -> Any:
    if name in ("capture", "to_vllm"):
        from kvplan.integrations.vllm import convert

        return getattr(convert, name)
    if name in ("InspectOptions", "InspectResult", "inspect_model"):
        from kvplan.integrations.vllm import inspect

        return getattr(inspect, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
