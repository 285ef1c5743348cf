"""kvplan's refusal as the first thing a user reads of a refused engine.

vLLM prints a refused engine's error as tracebacks — the engine core's ``EngineCore failed to
start``, its process's, then the front end's ``RuntimeError: Engine core initialization
failed`` — with kvplan's paragraphs deep inside the first. :func:`announce` logs the refusal
once per process, on vLLM's own logger (``vllm.kvplan``, so it reaches vLLM's log however it
is configured), between two rules, as it is raised: before any of vLLM's tracebacks. The
exception raised is unchanged.
"""

from __future__ import annotations

import logging
import threading

from kvplan.schemas.errors import KVPlanError

logger = logging.getLogger("vllm.kvplan")

RULE = "=" * 78
HEADING = "kvplan refused this vLLM engine:"

_LOCK = threading.Lock()
_ANNOUNCED: set[str] = set()
MAX_ANNOUNCED = 64
"""Distinct refusals remembered per process (a refusal is logged once however often raised)."""


def text_of(refusal: KVPlanError) -> str:
    """The refusal's paragraphs, one per diagnostic (the KVP501 lead first)."""
    return "\n".join(d.render() for d in refusal.diagnostics)


def announce(refusal: KVPlanError) -> KVPlanError:
    """Log ``refusal`` (once per process) as its own block on vLLM's log; return it to raise."""
    text = text_of(refusal)
    with _LOCK:
        if text in _ANNOUNCED:
            return refusal
        if len(_ANNOUNCED) < MAX_ANNOUNCED:
            _ANNOUNCED.add(text)
    logger.error("%s\n%s\n%s\n%s", HEADING, RULE, text, RULE)
    return refusal
