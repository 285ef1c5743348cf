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
        quiet_vllm_import()


def quiet_vllm_import() -> None:
    """Keep vLLM's import warnings out of kvplan's output; its errors still print.

    vLLM imports its kernels lazily and, before its own logging is set up, warns through
    Python's last-resort handler: on a machine without its CUDA kernels the first line a user
    reads is ``Failed to import from vllm._C: ModuleNotFoundError(...)``, which is harmless
    for ``inspect`` and ``doctor`` (they never run a kernel). A handler on the ``vllm`` logger
    that prints errors only takes the last resort's place; vLLM's own logging set-up, when it
    runs, replaces it.
    """
    import logging

    log = logging.getLogger("vllm")
    if log.handlers:
        return
    handler = logging.StreamHandler()
    handler.setLevel(logging.ERROR)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)


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
