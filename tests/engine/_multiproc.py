"""Engines on vLLM's multiprocess executor: its default at TP=1, and tensor parallelism.

The tiny llama with real re-drawn weights (the ``llama_checkpoint`` fixture: the workers run
in processes vLLM spawns, which the driver's in-process re-draw cannot reach), float32, four
prompts in two rounds (pairs share two blocks; the second round is served from the prefix
cache after the first round's blocks were freed). ``run_mp`` runs one driver process with
``VLLM_ENABLE_V1_MULTIPROCESSING`` left at vLLM's default; at TP=2 each worker is bound to one
of the machine's two cores (``VLLM_CPU_OMP_THREADS_BIND='0|1'``: without it vLLM asserts "Not
enough allowed NUMA nodes to bind threads of 2 local CPUWorkers").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.engine._models import BLOCK_SIZE
from tests.engine.cases import ENGINE_ARGS
from tests.engine.harness import EngineRun, Variant, run_engines

NUM_BLOCKS = 256
LAYERS, KV_HEADS, HEAD_DIM, DTYPE_BYTES = 4, 2, 64, 4
BLOCK_BYTES_TP1 = LAYERS * 2 * KV_HEADS * HEAD_DIM * BLOCK_SIZE * DTYPE_BYTES
"""One block of the tiny llama in float32 (every layer, K and V): 128 KiB at TP=1."""
ENGINE: dict[str, Any] = {
    **ENGINE_ARGS,
    "load_format": "safetensors",
    "dtype": "float32",
    "max_model_len": 128,
    "kv_cache_memory_bytes": NUM_BLOCKS * BLOCK_BYTES_TP1,
    "num_gpu_blocks_override": NUM_BLOCKS,
}
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}

_A = [(7 * i) % 500 + 3 for i in range(80)]
_C = [(13 * i) % 500 + 5 for i in range(72)]
PROMPTS = [
    _A,
    _A[: 2 * BLOCK_SIZE] + [(11 * i) % 500 + 3 for i in range(9)],
    _C,
    _C[: 2 * BLOCK_SIZE] + [(17 * i) % 500 + 3 for i in range(12)],
]
ROUNDS = [[0, 1, 2, 3], [0, 1, 2, 3]]
REQUESTS = sum(len(r) for r in ROUNDS)
"""Requests per engine: the driver returns their tokens by prompt index, round after round."""
MAX_TOKENS = 24


def block_bytes(tp: int) -> int:
    """Bytes of one block on each rank: the KV heads are split across the ranks."""
    return BLOCK_BYTES_TP1 // tp


def run_mp(
    python: Path,
    model: Path,
    variants: list[Variant],
    work: Path,
    *,
    tp: int = 1,
    max_tokens: int = MAX_TOKENS,
    engine: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 3600,
) -> EngineRun:
    """Every variant's engine in one driver process, on vLLM's multiprocess executor."""
    return run_engines(
        python,
        model,
        variants,
        work,
        prompts=PROMPTS,
        batches=ROUNDS,
        engine={**ENGINE, "tensor_parallel_size": tp, **(engine or {})},
        max_tokens=max_tokens,
        multiprocessing=True,
        extra_env={**(TP2_ENV if tp == 2 else {}), **(extra_env or {})},
        timeout=timeout,
    )


def dumped(folder: Path) -> dict[str, Any]:
    """The JSON files of a dump directory, by name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
