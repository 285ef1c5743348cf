"""One KV-cache allocation, as the plugin handles it: capture → plan → reviewed-plan check →
bind → verify, in the worker that allocates.

Above ``versions``, ``convert`` and the core (planner, executor); below elastic serving and
the plugin, which hand it the mode (``Mode``: eager here, elastic from its own room) and the
settings. ``settings`` and ``refusals`` are public modules (the other rooms word their checks
with them); everything else is reached through the names below.
"""

from __future__ import annotations

from kvplan.integrations.vllm.pipeline._handlers import HANDLERS
from kvplan.integrations.vllm.pipeline._lifetime import live_caches, release_all, release_owner
from kvplan.integrations.vllm.pipeline._modes import EagerMode, Handler, Mode
from kvplan.integrations.vllm.pipeline._runtime import (
    Call,
    CallContext,
    Record,
    Runtime,
    current_context,
    current_vllm_config,
    plan_step,
    positions_of,
    rank_label,
    with_aliases,
)

__all__ = [
    "HANDLERS",
    "Call",
    "CallContext",
    "EagerMode",
    "Handler",
    "Mode",
    "Record",
    "Runtime",
    "current_context",
    "current_vllm_config",
    "live_caches",
    "plan_step",
    "positions_of",
    "rank_label",
    "release_all",
    "release_owner",
    "with_aliases",
]
