"""What each engine test model runs: one driver process per model, one engine per variant.

The first variant is kvplan's (activated by vLLM's plugin loader through the entry point);
then vanilla, the other backends and modes, and the negative controls (bindings broken on
purpose, which must change the tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.engine._models import BLOCK_SIZE, write_model
from tests.engine.harness import EngineRun, Variant, kvplan_env, run_engines

KVPLAN_VARIANTS = (
    ("torch-eager", "torch", "eager"),
    ("host-vmm-eager", "host-vmm", "eager"),
    ("host-vmm-elastic", "host-vmm", "elastic"),
)
"""(variant name, ``KVPLAN_BACKEND``, ``KVPLAN_MODE``): each must give vanilla's tokens.
The torch backend commits its memory up front: it refuses elastic mode (``KVP501``)."""

LONG = [(7 * i) % 500 + 3 for i in range(80)]
"""80 tokens: two full blocks of 32 and part of a third."""
SHARED = LONG[: 2 * BLOCK_SIZE] + [(11 * i) % 500 + 3 for i in range(9)]
"""Shares LONG's first two blocks; sent after LONG, so prefix caching serves them."""
PROMPTS = [LONG, SHARED]
BATCHES = [[0], [1]]

ENGINE_ARGS = {
    "load_format": "dummy",
    "skip_tokenizer_init": True,
    "enforce_eager": True,
    "block_size": BLOCK_SIZE,
    "max_model_len": 256,
    "max_num_seqs": 4,
    "enable_prefix_caching": True,
    "seed": 0,
    "gpu_memory_utilization": 0.05,
    "kv_cache_memory_bytes": 16 << 20,
    "num_gpu_blocks_override": 256,
}
"""256 blocks: every model's pool is then a multiple of the 2 MiB VMM granularity. Else
host-vmm warns (``KVP308``, the last chunk partly unused) and ``KVPLAN_STRICT=1`` refuses."""


@dataclass(frozen=True)
class ModelCase:
    model: str
    breakages: tuple[str, ...]
    """Negative controls run on this model (``swap``, ``private-sharers``)."""

    def variants(self, work: Path) -> list[Variant]:
        kvplan = [
            Variant(name, kvplan_env(backend, mode, work / f"dump-{name}"))
            for name, backend, mode in KVPLAN_VARIANTS
        ]
        broken = [Variant(k, kvplan_env("torch", "eager"), breakage=k) for k in self.breakages]
        return [kvplan[0], Variant("vanilla"), *kvplan[1:], *broken]


MODEL_CASES = {
    "llama": ModelCase("llama", ("swap",)),
    "gemma4": ModelCase("gemma4", ("swap", "private-sharers")),
    "gemma3n": ModelCase("gemma3n", ("private-sharers",)),
}
"""Every engine model case, by name (``tests.engine._models`` writes the configs)."""


def run_model_case(python: Path, name: str, work: Path) -> EngineRun:
    case = MODEL_CASES[name]
    model = write_model(case.model, work / "model")
    return run_engines(
        python,
        model,
        case.variants(work),
        work,
        prompts=PROMPTS,
        batches=BATCHES,
        engine=ENGINE_ARGS,
        max_tokens=6,
    )
