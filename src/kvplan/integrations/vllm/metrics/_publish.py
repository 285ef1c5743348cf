"""Where this process shows kvplan's series: in the registry vLLM's ``/metrics`` serves, or,
in vLLM's multiprocess metrics mode, through the mirror's files (``_multiproc``)."""

from __future__ import annotations

import threading
from typing import Any, Literal

from kvplan.integrations.vllm.metrics._collector import EngineSource, KVPlanCollector, Reader
from kvplan.integrations.vllm.metrics._multiproc import Mirror, multiproc_dir

Published = Literal["registry", "multiprocess"]

_LOCK = threading.Lock()
_READER = Reader()
_WHERE: dict[str, Any] = {}


def publish(source: EngineSource, *, api_rank: int = 0, registry: Any = None) -> Published | None:
    """Show ``source``'s figures on this process's ``/metrics``: through one collector in
    ``registry`` (default: prometheus_client's ``REGISTRY``, what vLLM serves with one API
    server), or, when ``PROMETHEUS_MULTIPROC_DIR`` is set, through the mirror of API server
    ``api_rank`` 0 alone (``None`` for the others: their ``/metrics`` reads the same files).
    Idempotent per process: a second engine index adds its source to the same reader."""
    _READER.add(source)
    with _LOCK:
        if "how" in _WHERE:
            how: Published | None = _WHERE["how"]
            return how
        directory = multiproc_dir()
        if directory is not None:
            if api_rank != 0:
                _WHERE["how"] = None
                return None
            _WHERE["mirror"] = Mirror(_READER, directory)
            _WHERE["how"] = "multiprocess"
            return "multiprocess"
        if registry is None:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        collector = KVPlanCollector(_READER)
        registry.register(collector)
        _WHERE.update(how="registry", collector=collector, registry=registry)
        return "registry"


def unpublish() -> None:
    """Forget what :func:`publish` did in this process (tests)."""
    with _LOCK:
        mirror = _WHERE.pop("mirror", None)
        if mirror is not None:
            mirror.stop()
        collector, registry = _WHERE.pop("collector", None), _WHERE.pop("registry", None)
        if collector is not None and registry is not None:
            registry.unregister(collector)
        _WHERE.clear()
        _READER.sources.clear()


def reader() -> Reader:
    return _READER
