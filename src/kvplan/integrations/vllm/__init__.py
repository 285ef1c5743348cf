"""kvplan ⇄ vLLM: capture real ``KVCacheConfig`` objects and ask vLLM to plan models.

Which vLLM releases are supported, and how each differs, is decided in ``versions/`` (one
adapter per version family). Importing this package does not import vLLM or torch; the names
below load their module on first use. No public submodule is named like a public function
(``capture`` and ``to_vllm`` live in ``_capture``), so ``from kvplan.integrations.vllm import
capture`` is always the function. Everything here needs the ``vllm`` extra
(``pip install 'kvplan[vllm]'``).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from kvplan.schemas.errors import Code, KVPlanError, error

if TYPE_CHECKING:
    from kvplan.integrations.vllm._capture import capture, to_vllm
    from kvplan.integrations.vllm.inspect import InspectOptions, InspectResult, inspect_model

VLLM_EXTRA_HINT = "pip install 'kvplan[vllm]'"
"""How a user gets the real vLLM that this integration needs."""

_LAZY: dict[str, str] = {
    "capture": "kvplan.integrations.vllm._capture",
    "to_vllm": "kvplan.integrations.vllm._capture",
    "InspectOptions": "kvplan.integrations.vllm.inspect",
    "InspectResult": "kvplan.integrations.vllm.inspect",
    "inspect_model": "kvplan.integrations.vllm.inspect",
}

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


def vllm_available() -> bool:
    """Whether vLLM is importable (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def prepare_environment(quiet: bool = False) -> None:
    """Environment vLLM reads at import: the CPU platform when there is no CUDA GPU.

    ``quiet`` lowers vLLM's and transformers' logging to errors (unless the user set them).
    Call before vLLM is first imported.
    """
    import os

    if "VLLM_TARGET_DEVICE" not in os.environ and not _cuda_visible():
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    if quiet:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TORCH_LOGS", "-all")


def _cuda_visible() -> bool:
    import shutil

    return shutil.which("nvidia-smi") is not None


def require_vllm() -> None:
    """Raise :class:`KVPlanError` (``KVP401``) naming the extra when vLLM is missing."""
    if not vllm_available():
        raise KVPlanError(
            error(
                Code.BACKEND_UNAVAILABLE,
                "vllm",
                f"this needs vLLM {_supported()}, which is not installed.",
                f"{VLLM_EXTRA_HINT}",
            )
        )


def _supported() -> str:
    from kvplan.integrations.vllm.versions import supported_range

    return supported_range()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
