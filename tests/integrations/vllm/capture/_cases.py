"""Differential cases: shrunk copies of real HF configs, built and planned by the real vLLM.

Each case is a model from kvplan's bundled catalog with fewer layers (fast on two CPU cores)
plus the ``vllm serve`` flags to plan it with. :func:`build_case` runs vLLM's own steps
(``kvplan.integrations.vllm.inspect._build``) and returns every rank's worker and runner configs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvplan.catalog import lookup

MiB = 1 << 20


def default_block_size() -> int:
    """The installed vLLM's default block size (``CacheConfig.DEFAULT_BLOCK_SIZE``, read from
    the releases' sources): 16 tokens up to 0.33, 64 from 0.34."""
    import vllm

    release = tuple(int(part) for part in vllm.__version__.split(".")[:2])
    return 64 if release >= (0, 34) else 16


@dataclass(frozen=True)
class Case:
    """A model (catalog id, shrunk) and the options vLLM plans it with."""

    model: str
    layers: int | None = None
    """``num_hidden_layers`` of the shrunk copy (``None``: the real count)."""
    config_overrides: dict[str, Any] = field(default_factory=dict)
    drop_keys: tuple[str, ...] = ()
    memory: int = 16 * MiB
    max_model_len: int = 256
    kv_cache_dtype: str = "auto"
    layout: str | None = None
    tp: int = 1
    disable_hybrid: bool = False
    skip_layers: tuple[str, ...] = ()
    text_architecture: str | None = None
    """Build the text model alone: the config's ``text_config`` as this architecture (no
    vision/audio towers to import: vLLM 0.31-0.32's CPU builds cannot import gemma-4's)."""


CASES: dict[str, Case] = {
    "llama": Case("meta-llama/Llama-3.1-8B-Instruct", layers=4),
    "llama-fp8": Case("meta-llama/Llama-3.1-8B-Instruct", layers=4, kv_cache_dtype="fp8"),
    "llama-int8-per-token-head": Case(
        "meta-llama/Llama-3.1-8B-Instruct", layers=4, kv_cache_dtype="int8_per_token_head"
    ),
    "llama-BLHNC": Case("meta-llama/Llama-3.1-8B-Instruct", layers=4, layout="BLHNC"),
    "gemma3-hybrid": Case("google/gemma-3-1b-it", layers=8, memory=32 * MiB),
    "gemma3-no-hybrid": Case(
        "google/gemma-3-1b-it", layers=8, memory=32 * MiB, disable_hybrid=True
    ),
    "gemma3-fp8-skip-sliding": Case(
        "google/gemma-3-1b-it",
        layers=8,
        memory=32 * MiB,
        kv_cache_dtype="fp8",
        skip_layers=("sliding_window",),
    ),
    "gemma4-e2b-LBNHC": Case("google/gemma-4-E2B-it", memory=32 * MiB, layout="LBNHC"),
    "gemma4-e2b-BLHNC": Case("google/gemma-4-E2B-it", memory=32 * MiB, layout="BLHNC"),
    "gemma4-text": Case(
        "google/gemma-4-E2B-it", memory=32 * MiB, text_architecture="Gemma4ForCausalLM"
    ),
    "mla-bf16": Case("deepseek-ai/DeepSeek-V2-Lite", layers=2),
    "mla-fp8": Case("deepseek-ai/DeepSeek-V2-Lite", layers=2, kv_cache_dtype="fp8"),
    "jamba-hybrid": Case("ai21labs/Jamba-v0.1", layers=8, memory=64 * MiB),
    "llama4-chunked": Case("meta-llama/Llama-4-Scout-17B-16E-Instruct", layers=4),
    "gpt-oss-sinks": Case(
        "openai/gpt-oss-20b", layers=4, drop_keys=("quantization_config",), memory=32 * MiB
    ),
    "llama-tp2": Case("meta-llama/Llama-3.1-8B-Instruct", layers=2, tp=2),
}
"""Every differential case, by name."""


def shrunk_config(case: Case, folder: Path) -> Path:
    """Write the case's ``config.json`` (fewer layers) into ``folder``; return ``folder``."""
    entry = lookup(case.model)
    assert entry is not None, case.model
    config = json.loads((entry.path / "config.json").read_text())
    for key in case.drop_keys:
        config.pop(key, None)
    if case.text_architecture is not None:
        config = {**config["text_config"], "architectures": [case.text_architecture]}
    text = config.get("text_config", config)
    if case.layers is not None:
        text["num_hidden_layers"] = case.layers
        if isinstance(text.get("layer_types"), list):
            text["layer_types"] = text["layer_types"][: case.layers]
    text.update(case.config_overrides)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@dataclass
class Built:
    """One case, as vLLM planned it: per rank, the worker and runner configs."""

    case: Case
    layout: str
    worker_configs: list[Any]
    runner_configs: list[Any]
    kernel_block_sizes: list[list[int]]
    shared: list[dict[str, str]]
    workers: list[Any]


def build_case(case: Case, folder: Path) -> Built:
    """vLLM's engine-core and runner steps for ``case`` (inside ``cuda_platform``)."""
    from kvplan.integrations.vllm.inspect._build import (
        BuildOptions,
        collect_worker_specs,
        kernel_block_sizes,
        make_vllm_config,
        plan_kv_cache,
        runner_config,
    )

    options = BuildOptions(
        model=str(shrunk_config(case, folder)),
        max_model_len=case.max_model_len,
        kv_cache_dtype=case.kv_cache_dtype,
        tp=case.tp,
        layout=case.layout,
        disable_hybrid_kv_cache_manager=case.disable_hybrid,
        kv_cache_dtype_skip_layers=case.skip_layers,
    )
    vllm_config = make_vllm_config(options)
    workers = collect_worker_specs(options, vllm_config)
    planned = plan_kv_cache(vllm_config, workers, [case.memory] * case.tp)
    runners = [
        runner_config(config, worker.shared_kv_cache_layers)
        for config, worker in zip(planned.worker_configs, workers, strict=True)
    ]
    return Built(
        case=case,
        layout=planned.layout,
        worker_configs=planned.worker_configs,
        runner_configs=runners,
        kernel_block_sizes=[
            kernel_block_sizes(runner, worker)
            for runner, worker in zip(runners, workers, strict=True)
        ],
        shared=[dict(worker.shared_kv_cache_layers) for worker in workers],
        workers=workers,
    )
