"""The :class:`~kvplan.integrations.vllm.pipeline.Call` kvplan's wrapper makes for a call of one
of vLLM's methods, for tests that drive a mode's handler without the plugin."""

from __future__ import annotations

import inspect
from typing import Any

from kvplan.integrations.vllm.pipeline import Call, positions_of


def wrapped_call(owner: Any, method: str, *args: Any) -> Call:
    """``owner.method(*args)`` as the wrapper of ``type(owner).method`` receives it."""
    original = getattr(type(owner), method)
    signature = inspect.signature(original)
    return Call(original, signature, None, (owner, *args), {}, positions_of(signature))  # type: ignore[arg-type]
