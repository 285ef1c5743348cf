"""kvplan's vLLM stat logger (entry point ``vllm.stat_logger_plugins``: ``kvplan``).

vLLM builds its stat loggers in the API server's process, one per engine index, with the
engine's ``VllmConfig``: the same place and the same labels as its own
``PrometheusStatLogger`` (``model_name``: the served model name, ``engine``: the index). This
one records nothing per step (``record`` returns at once): it only points kvplan's collector
(``_publish``) at the engine's dump directory, when the kvplan plugin is active in this
process (``KVPLAN_ENABLE=1``, its checks passed) with a ``KVPLAN_DUMP_DIR``. Importing this
module imports vLLM.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from kvplan.integrations.vllm.metrics._collector import EngineSource
from kvplan.integrations.vllm.metrics._publish import Published, publish

logger = logging.getLogger("vllm.kvplan")


class KVPlanStatLogger(StatLoggerBase):
    """Registers kvplan's series for one engine (see the module doc); logs nothing."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        from kvplan.integrations.vllm.plugin import active_settings

        self.published: Published | None = None
        settings = active_settings()
        if settings is None:
            return
        if settings.dump_dir is None:
            logger.info("kvplan: KVPLAN_DUMP_DIR is unset: no kvplan series on /metrics")
            return
        model = vllm_config.model_config
        name = getattr(model, "served_model_name", None) or getattr(model, "model", "")
        if isinstance(name, list | tuple):  # a list before vLLM's config resolves it
            name = name[0] if name else ""
        api_rank = int(getattr(vllm_config.parallel_config, "_api_process_rank", 0) or 0)
        source = EngineSource(str(name), str(engine_index), settings.dump_dir)
        self.published = publish(source, api_rank=max(0, api_rank))

    def record(self, *args: Any, **kwargs: Any) -> None:
        """Per step: nothing (kvplan's figures are read at scrape time)."""

    def log_engine_initialized(self) -> None:
        """Nothing to say."""
