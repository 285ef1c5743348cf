"""Whether vLLM is here, and the environment it reads at import (no vLLM, no torch imported).

Every room of the vLLM integration that imports vLLM asks this module first; the package
``kvplan.integrations.vllm`` re-exports its names.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from kvplan.integrations.vllm.versions import supported_range
from kvplan.schemas.errors import Code, KVPlanError, error

VLLM_EXTRA_HINT = "pip install 'kvplan[vllm]'"
"""How a user gets the real vLLM that this integration needs."""


def vllm_available() -> bool:
    """Whether vLLM is importable (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def prepare_environment(quiet: bool = False) -> None:
    """Environment vLLM reads at import: the CPU platform when there is no CUDA GPU.

    ``quiet`` lowers vLLM's and transformers' logging to errors (unless the user set them).
    Call before vLLM is first imported.
    """
    if "VLLM_TARGET_DEVICE" not in os.environ and shutil.which("nvidia-smi") is None:
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    if quiet:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TORCH_LOGS", "-all")


def require_vllm() -> None:
    """Raise :class:`KVPlanError` (``KVP401``) naming the extra when vLLM is missing."""
    if not vllm_available():
        raise KVPlanError(
            error(
                Code.BACKEND_UNAVAILABLE,
                "vllm",
                f"this needs vLLM {supported_range()}, which is not installed.",
                f"{VLLM_EXTRA_HINT}",
            )
        )
