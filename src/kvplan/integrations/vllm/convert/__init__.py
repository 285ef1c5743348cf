"""vLLM objects ⇄ kvplan's documents: ``capture`` a real ``KVCacheConfig`` (the placement form,
vLLM 0.29 and later) as ``kvplan.input/1`` and rebuild it with ``to_vllm``; ``legacy`` captures
the ``shared_by`` releases (vLLM 0.22–0.24) as ``kvplan.input-legacy/1``.

Above ``versions`` (which fields each release has) and nothing else of the integration. The
names load their module (and torch) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvplan.integrations.vllm.convert._capture import (
        capture,
        encode_fields,
        installed_adapter,
        request_blocks,
        spec_class,
        spec_classes,
        to_vllm,
        worker_form,
    )

__all__ = [
    "capture",
    "encode_fields",
    "installed_adapter",
    "request_blocks",
    "spec_class",
    "spec_classes",
    "to_vllm",
    "worker_form",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kvplan.integrations.vllm.convert import _capture

        return getattr(_capture, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
