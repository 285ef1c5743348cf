"""Real vLLM KV-cache configs for the plugin tests, built by vLLM's own planning code.

Each model is built on the ``meta`` device by the real vLLM model classes (under kvplan's
CUDA emulation of the CPU platform), so the forward context holds real attention/Mamba
layers and the sharing map is vLLM's. Where vLLM has the extensible KV cache (0.34 on), it is
off, as in an engine kvplan serves (kvplan turns it off; vLLM's padding of the layers'
segments for it would be a second layout). The HF configs are the public ``config.json`` files
of kvplan's bundled catalog; layer counts are cut with ``hf_overrides``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvplan.catalog import lookup


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model_id: str
    """A model of kvplan's catalog (``kvplan.catalog``)."""
    overrides: dict[str, Any] | None
    memory: int
    layout: str | None = None


MODELS: dict[str, ModelSpec] = {
    "gemma4-e2b": ModelSpec("gemma4-e2b", "google/gemma-4-E2B-it", None, 16 << 20),
    "gemma4-e2b-blhnc": ModelSpec(
        "gemma4-e2b-blhnc", "google/gemma-4-E2B-it", None, 16 << 20, layout="BLHNC"
    ),
    "llama": ModelSpec(
        "llama", "meta-llama/Llama-3.1-8B-Instruct", {"num_hidden_layers": 4}, 16 << 20
    ),
    "mla": ModelSpec("mla", "deepseek-ai/DeepSeek-V2-Lite", {"num_hidden_layers": 4}, 16 << 20),
    "hybrid": ModelSpec(
        "hybrid", "ai21labs/Jamba-v0.1", {"num_hidden_layers": 8, "num_experts": 2}, 32 << 20
    ),
}


@dataclass
class ModelCase:
    """One model's worker config (engine side), runner copy and what the runner knows."""

    name: str
    vllm_config: Any
    engine_config: Any
    """The worker's ``KVCacheConfig`` as the engine core sends it (layout stamped)."""
    shared: dict[str, str]
    kernel_block_sizes: list[int]
    layout: Any
    """The resolved ``KVCacheLayout`` enum (what the runners pass to allocate_kv_cache)."""

    def runner_config(self) -> Any:
        """A fresh runner-side copy (KV-sharing layers appended), as both runners make it."""
        from kvplan.integrations.vllm.inspect._build import runner_config

        return runner_config(self.engine_config, self.shared)

    @property
    def forward_context(self) -> dict[str, Any]:
        return self.vllm_config.compilation_config.static_forward_context

    def profiling_config(self, num_blocks: int = 4) -> Any:
        """vLLM's minimal profiling config: same groups, few blocks, no layout stamped."""
        from vllm.config import set_current_vllm_config
        from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder

        groups = copy.deepcopy(self.engine_config.kv_cache_groups)
        with set_current_vllm_config(self.vllm_config):
            builder = get_kv_cache_config_builder(self.vllm_config)
            config = builder.get_kv_cache_config_from_groups(
                self.vllm_config, groups, num_blocks=num_blocks
            )
        assert config.kv_cache_layout is None
        return config


def init_distributed(store_dir: Path) -> None:
    """A world of one (gloo) on a store that lives as long as the test session."""
    import torch.distributed as dist
    from vllm.distributed.parallel_state import init_distributed_environment

    if not dist.is_initialized():
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{store_dir / 'store'}",
            backend="gloo",
        )


def has_extensible_kv_cache() -> bool:
    """Whether the installed vLLM has the extensible KV cache (0.34 on)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return "enable_extensible_kv_cache" in {f.name for f in dataclasses.fields(EngineArgs)}


def build_case(spec: ModelSpec) -> ModelCase:
    """Build ``spec`` with vLLM: engine config, worker specs, the engine core's plan."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        destroy_model_parallel,
        initialize_model_parallel,
    )

    from kvplan.integrations.vllm.inspect import _build as b
    from kvplan.integrations.vllm.inspect._emulation import cuda_platform

    entry = lookup(spec.model_id)
    assert entry is not None, f"{spec.model_id} is not in kvplan's catalog"
    options = b.BuildOptions(
        model=str(entry.path),
        max_model_len=256,
        hf_overrides=spec.overrides,
        layout=spec.layout,
        enable_extensible_kv_cache=False if has_extensible_kv_cache() else None,
    )
    with cuda_platform():
        vllm_config = b.make_vllm_config(options)
        with set_current_vllm_config(vllm_config):
            # As in a fresh worker: the groups (e.g. MoE's EP group) follow this model.
            destroy_model_parallel()
            initialize_model_parallel(1, 1)
        worker = b.build_worker_specs(vllm_config, 0)
        planned = b.plan_kv_cache(vllm_config, [worker], [spec.memory])
        engine_config = planned.worker_configs[0]
        runner = b.runner_config(engine_config, worker.shared_kv_cache_layers)
        kernel_block_sizes = b.kernel_block_sizes(runner, worker)
    return ModelCase(
        name=spec.name,
        vllm_config=vllm_config,
        engine_config=engine_config,
        shared=dict(worker.shared_kv_cache_layers),
        kernel_block_sizes=kernel_block_sizes,
        layout=vllm_config.cache_config.get_resolved_kv_cache_layout(),
    )
