"""``kvplan inspect MODEL``: ask the installed vLLM how it would lay out a model's KV cache.

The model is built on the ``meta`` device under the CPU platform answering as CUDA would (see
``_emulation``); vLLM groups and places the layers for the requested memory; the worker's
config is captured and planned. KV memory is ``gpu_memory * gpu_memory_utilization``
(minus the weights as built when ``reserve_weights`` is set) — vLLM's profiling of
activations is not modelled. Left unset, the utilisation is vLLM's own default (0.9 up to
0.33; 0.34: 1.0 with its extensible KV cache, else 0.92).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kvplan.catalog import lookup
from kvplan.schemas.errors import Code, KVPlanError, error
from kvplan.schemas.input import InputDocument
from kvplan.schemas.plan import BindingPlan

GiB = 1 << 30


@dataclass(frozen=True)
class InspectOptions:
    """What to plan for; mirrors ``vllm serve`` flags. Recorded in the document's metadata."""

    gpu_memory: int = 80 * GiB
    gpu_memory_utilization: float | None = None
    """``None``: vLLM's default for the engine config (see the module docstring)."""
    num_blocks: int | None = None
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    tp: int = 1
    layout: str | None = None
    disable_hybrid_kv_cache_manager: bool = False
    attention_backend: str | None = None
    reserve_weights: bool = False
    ignore_weight_quantization: bool = False
    """Build without the checkpoint's weight quantization (it does not change the KV cache)."""
    trust_remote_code: bool = False
    """vLLM's ``--trust-remote-code``: run the model repository's own Python code."""
    extensible_kv_cache: bool | None = None
    """vLLM 0.34's ``--[no-]enable-extensible-kv-cache`` (``None``: as vLLM decides)."""

    def to_metadata(self) -> dict[str, Any]:
        """The options as JSON data, defaults omitted."""
        default = InspectOptions()
        return {key: value for key, value in asdict(self).items() if getattr(default, key) != value}

    @classmethod
    def from_metadata(cls, data: Mapping[str, Any]) -> InspectOptions:
        """Options from :meth:`to_metadata` data (unknown keys are an error)."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise KVPlanError(
                error(
                    Code.SCHEMA,
                    "metadata.inspect.options",
                    f"unknown inspect option(s): {sorted(unknown)}.",
                )
            )
        return cls(**dict(data))

    def kv_memory_bytes(self, vllm_config: Any) -> int:
        """``gpu_memory`` times the utilisation asked for, else vLLM's default for
        ``vllm_config`` (0.34 resolves it: ``resolved_gpu_memory_utilization``)."""
        fraction = self.gpu_memory_utilization
        if fraction is None:
            cache = vllm_config.cache_config
            fraction = getattr(cache, "resolved_gpu_memory_utilization", None)
            if fraction is None:
                fraction = cache.gpu_memory_utilization
        return int(self.gpu_memory * float(fraction))


@dataclass(frozen=True)
class ResolvedModel:
    """Where a MODEL argument points."""

    name: str
    """What the user asked for (an id or a path), as recorded in metadata."""
    path: Path
    """Directory holding ``config.json``."""
    source: str
    """``local``, ``catalog`` or ``huggingface-cache``."""


def resolve_model(model: str) -> ResolvedModel:
    """A directory or ``config.json``, a bundled catalog name, or a Hugging Face id.

    Hugging Face ids not in the catalog are fetched through ``huggingface_hub`` (only
    ``config.json``); with ``HF_HUB_OFFLINE=1`` only its local cache is used.
    """
    candidate = Path(model).expanduser()
    if candidate.is_file() and candidate.name.endswith(".json"):
        return ResolvedModel(model, candidate.resolve().parent, "local")
    if candidate.is_dir():
        if not (candidate / "config.json").is_file():
            raise KVPlanError(error(Code.UNREADABLE, model, "the directory has no config.json."))
        return ResolvedModel(model, candidate.resolve(), "local")
    entry = lookup(model)
    if entry is not None:
        return ResolvedModel(entry.model_id, entry.path, "catalog")
    return ResolvedModel(model, _from_hub(model), "huggingface-cache")


def _from_hub(model_id: str) -> Path:
    offline = _offline()
    hint = "pass a local directory, a config.json, or a catalog name (`kvplan inspect --list`)."
    if model_id.count("/") != 1:
        raise KVPlanError(
            error(
                Code.UNREADABLE, model_id, "no such file, catalog model or Hugging Face id.", hint
            )
        )
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError as exc:  # pragma: no cover - vLLM depends on huggingface_hub
        raise KVPlanError(
            error(Code.UNREADABLE, model_id, "huggingface_hub is not installed.", hint)
        ) from exc
    if offline:
        cached = try_to_load_from_cache(model_id, "config.json")
        if isinstance(cached, str):
            return Path(cached).parent
        raise KVPlanError(
            error(
                Code.UNREADABLE,
                model_id,
                "not in the catalog and not in the Hugging Face cache (HF_HUB_OFFLINE is set).",
                hint,
            )
        )
    try:
        return Path(hf_hub_download(model_id, "config.json")).parent
    except Exception as exc:
        raise KVPlanError(
            error(Code.UNREADABLE, model_id, f"cannot fetch config.json: {exc}", hint)
        ) from exc


@dataclass
class InspectResult:
    """A model's KV cache as vLLM would lay it out, captured and planned."""

    model: ResolvedModel
    options: InspectOptions
    architecture: str
    attention_layers: int
    max_model_len: int
    layout: str
    kv_memory_bytes: int
    weight_bytes: int
    capacity_tokens: int
    max_concurrency: float
    documents: list[InputDocument]
    """One per TP rank (rank 0 first)."""
    plans: list[BindingPlan]
    request_blocks: int = 0
    """Block ids one request of ``max_model_len`` tokens takes (rank 0; the elastic floor)."""
    extensible_kv_cache: bool | None = None
    """Whether vLLM's extensible KV cache (0.34) is on in this binding (``None``: the release
    has none)."""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def document(self) -> InputDocument:
        return self.documents[0]

    @property
    def plan(self) -> BindingPlan:
        return self.plans[0]


Progress = Callable[[str], None]


def _quiet_progress(message: str) -> None:
    return None


def inspect_model(
    model: str, options: InspectOptions | None = None, progress: Progress | None = None
) -> InspectResult:
    """Build ``model`` with the installed vLLM, capture each rank's config and plan it."""
    from kvplan.integrations.vllm.environment import prepare_environment, require_vllm

    require_vllm()
    prepare_environment()
    options = options or InspectOptions()
    say = progress or _quiet_progress
    start = time.perf_counter()
    resolved = resolve_model(model)
    if options.trust_remote_code:
        check_remote_code(resolved)
    elif needs_remote_code(resolved.path):
        raise _remote_code_required(resolved)
    notes: list[str] = []
    try:
        result = _inspect(resolved, options, say)
    except KVPlanError:
        raise
    except Exception as exc:
        if options.ignore_weight_quantization or not _quantized(resolved.path):
            raise _build_error(resolved, exc) from exc
        say("retrying without the checkpoint's weight quantization")
        options = replace(options, ignore_weight_quantization=True)
        notes.append(
            f"vLLM could not build the quantized weights on this machine ({_first_line(exc)}); "
            "planned without weight quantization, which does not change the KV cache."
        )
        try:
            result = _inspect(resolved, options, say)
        except KVPlanError:
            raise
        except Exception as retry_exc:
            raise _build_error(resolved, retry_exc) from retry_exc
    result.notes = notes + result.notes
    result.seconds = time.perf_counter() - start
    return result


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 120 else line[:117] + "..."


def _config_json(folder: Path) -> Any:
    """A model's ``config.json`` through kvplan's one reader (a regular file, bounded size:
    a fifo or a device named config.json is refused, never read)."""
    from kvplan.schemas.loading import decode_text, read_bytes

    path = folder / "config.json"
    return json.loads(decode_text(read_bytes(path), str(path)))


def _quantized(path: Path) -> bool:
    try:
        config = _config_json(path)
    except (OSError, ValueError):
        return False
    text_config = config.get("text_config") or {}
    return "quantization_config" in config or "quantization_config" in text_config


REMOTE_CODE_KEYS = ("AutoConfig", "AutoModel")
"""``auto_map`` entries a build needs (the tokenizer is never loaded)."""


def remote_code_files(config: Mapping[str, Any]) -> list[str]:
    """The Python files of the model repository that ``auto_map`` names for a build."""
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict):
        return []
    files: list[str] = []
    for key, value in auto_map.items():
        if not str(key).startswith(REMOTE_CODE_KEYS):
            continue
        for reference in value if isinstance(value, list) else [value]:
            if not isinstance(reference, str) or "." not in reference:
                continue
            module = reference.split("--")[-1].rsplit(".", 1)[0]
            name = module.replace(".", "/") + ".py"
            if name not in files:
                files.append(name)
    return files


def needs_remote_code(path: Path) -> bool:
    """Whether loading the config needs the repository's code (as transformers decides).

    ``auto_map`` names an ``AutoConfig`` and neither transformers nor vLLM knows the
    ``model_type``.
    """
    try:
        config = _config_json(path)
    except (OSError, ValueError):
        return False
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict) or "AutoConfig" not in auto_map:
        return False
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    model_type = config.get("model_type")
    return model_type not in CONFIG_MAPPING and model_type not in _CONFIG_REGISTRY


def _remote_code_required(resolved: ResolvedModel) -> KVPlanError:
    return KVPlanError(
        error(
            Code.REMOTE_CODE_REQUIRED,
            resolved.name,
            "the model's config or model class is custom code from its repository "
            "(config.json `auto_map`), which vLLM runs only when trusted.",
            "pass --trust-remote-code if you trust that repository's code.",
        )
    )


def check_remote_code(resolved: ResolvedModel) -> None:
    """With ``--trust-remote-code``: the repository's code must be next to ``config.json``.

    For a Hugging Face id (not offline) the files are fetched with ``huggingface_hub``;
    a local directory or a catalog model must already hold them.
    """
    try:
        config = _config_json(resolved.path)
    except (OSError, ValueError):
        return  # vLLM reports an unreadable config itself
    missing = [name for name in remote_code_files(config) if not (resolved.path / name).is_file()]
    if missing and resolved.source == "huggingface-cache" and not _offline():
        missing = _fetch_remote_code(resolved.name, missing)
    if missing:
        raise _remote_code_unavailable(resolved, missing)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}


def _fetch_remote_code(model_id: str, names: list[str]) -> list[str]:
    """Download ``names`` from the model repository; return those that could not be."""
    from huggingface_hub import hf_hub_download

    missing = []
    for name in names:
        try:
            hf_hub_download(model_id, name)
        except Exception:
            missing.append(name)
    return missing


def _remote_code_unavailable(resolved: ResolvedModel, missing: list[str]) -> KVPlanError:
    where = {
        "catalog": "the bundled catalog holds only config.json",
        "local": "the directory holds no such file",
        "huggingface-cache": "not in the Hugging Face cache"
        + (" and HF_HUB_OFFLINE is set" if _offline() else " and it could not be fetched"),
    }[resolved.source]
    return KVPlanError(
        error(
            Code.REMOTE_CODE_UNAVAILABLE,
            resolved.name,
            f"--trust-remote-code needs the model repository's code, {', '.join(missing)}, "
            f"next to config.json ({where}).",
            "copy the repository's .py files into the model directory (or allow Hugging Face "
            "Hub access for a model id) and pass that directory.",
        )
    )


def _build_error(resolved: ResolvedModel, exc: BaseException) -> KVPlanError:
    message = str(exc).strip() or type(exc).__name__
    if "trust_remote_code" in message:  # a case needs_remote_code did not foresee
        return _remote_code_required(resolved)
    if isinstance(exc, OSError) and "does not appear to have a file named" in message:
        file = re.search(r"file named (\S+?)\.? ", message)
        return _remote_code_unavailable(resolved, [file.group(1) if file else "its .py files"])
    lines = [line for line in message.splitlines() if line.strip()]
    hint = ""
    if "max seq len" in message or "max_model_len" in message:
        hint = "pass a smaller --max-model-len, or more --gpu-memory."
    elif isinstance(exc, ImportError):
        hint = "vLLM needs a package that is not installed to build this model."
    return KVPlanError(
        error(
            Code.INTEGRATION,
            resolved.name,
            f"vLLM could not plan this model: {type(exc).__name__}: {' '.join(lines[:3])}",
            hint,
        )
    )


def _inspect(resolved: ResolvedModel, options: InspectOptions, say: Progress) -> InspectResult:
    from kvplan.integrations.vllm.convert import capture, request_blocks
    from kvplan.integrations.vllm.inspect._build import (
        BuildOptions,
        collect_worker_specs,
        kernel_block_sizes,
        make_vllm_config,
        plan_kv_cache,
        runner_config,
    )
    from kvplan.integrations.vllm.inspect._emulation import cuda_platform
    from kvplan.planner import plan as make_plan

    build = BuildOptions(
        model=str(resolved.path),
        max_model_len=options.max_model_len,
        kv_cache_dtype=options.kv_cache_dtype,
        block_size=options.block_size,
        tp=options.tp,
        layout=options.layout,
        num_blocks=options.num_blocks,
        disable_hybrid_kv_cache_manager=options.disable_hybrid_kv_cache_manager,
        attention_backend=options.attention_backend,
        hf_overrides={"quantization_config": None} if options.ignore_weight_quantization else None,
        trust_remote_code=options.trust_remote_code,
        enable_extensible_kv_cache=options.extensible_kv_cache,
    )
    with cuda_platform():
        say("reading the model config with vLLM")
        vllm_config = make_vllm_config(build)
        say(f"building {resolved.name} on the meta device ({options.tp} rank(s))")
        workers = collect_worker_specs(build, vllm_config)
        weight_bytes = max(worker.weight_bytes for worker in workers)
        memory = options.kv_memory_bytes(vllm_config) - (
            weight_bytes if options.reserve_weights else 0
        )
        if memory <= 0:
            raise KVPlanError(
                error(
                    Code.INTEGRATION,
                    resolved.name,
                    f"no memory left for the KV cache ({memory} bytes) after the weights.",
                    "raise --gpu-memory or drop --reserve-weights.",
                )
            )
        say("grouping and placing the KV cache with vLLM")
        kv_plan = plan_kv_cache(vllm_config, workers, [memory] * len(workers))
        longest = request_blocks(kv_plan.worker_configs[0], vllm_config)
        documents = []
        for worker, config in zip(workers, kv_plan.worker_configs, strict=True):
            runner = runner_config(config, worker.shared_kv_cache_layers)
            documents.append(
                capture(
                    runner,
                    shared_kv_cache_layers=worker.shared_kv_cache_layers,
                    kernel_block_sizes=kernel_block_sizes(runner, worker),
                    metadata=_metadata(resolved, options, worker.rank, vllm_config),
                )
            )
    extensible = getattr(vllm_config.cache_config, "enable_extensible_kv_cache", None)
    extensible_notes = _extensible_notes(
        extensible, options, kv_plan.worker_configs[0], str(vllm_config.cache_config.block_size)
    )
    say("planning")
    plans = [make_plan(document) for document in documents]
    return InspectResult(
        model=resolved,
        options=options,
        architecture=workers[0].architecture,
        attention_layers=workers[0].num_layers,
        max_model_len=int(vllm_config.model_config.max_model_len),
        layout=kv_plan.layout,
        kv_memory_bytes=memory,
        weight_bytes=weight_bytes,
        capacity_tokens=kv_plan.capacity_tokens,
        max_concurrency=kv_plan.max_concurrency,
        documents=documents,
        plans=plans,
        request_blocks=longest,
        extensible_kv_cache=extensible,
        notes=[
            *extensible_notes,
            *(
                f"not built: the {tower} (it holds no KV cache; vLLM skips it when serving "
                "the language model only)"
                for tower in workers[0].dropped_towers
            ),
        ],
    )


def _extensible_notes(
    extensible: bool | None, options: InspectOptions, config: Any, block_size: str
) -> list[str]:
    """What vLLM 0.34's extensible KV cache does to this binding, in words (nothing on a
    release without it)."""
    if extensible is None:
        return []
    if not extensible:
        why = (
            "--no-enable-extensible-kv-cache"
            if options.extensible_kv_cache is False
            else "vLLM turns it off with --num-gpu-blocks-override"
            if options.num_blocks is not None
            else "vLLM's choice for this configuration, or kvplan's plugin's where "
            "KVPLAN_ENABLE=1 loaded it"
        )
        return [
            f"vLLM's extensible KV cache: off ({why}): all {config.num_blocks:,} blocks are "
            "allocated up front; this is the binding kvplan's plugin makes (it turns the "
            "extensible cache off)."
        ]
    padded = config.kv_cache_tensors[0].size if config.kv_cache_tensors else 0
    regions = {
        tensor.offset + i * tensor.layer_stride: config.num_blocks * tensor.block_stride
        for tensor in config.kv_cache_tensors
        for i in range(len(tensor.layers))
    }
    per_layer = all(
        t.layer_stride >= config.num_blocks * t.block_stride for t in config.kv_cache_tensors
    )
    pad = padded - sum(regions.values()) if per_layer else 0
    how = (
        f"every layer's segment is padded to a 2 MiB granule ({pad:,} bytes in all)"
        if pad
        else "every layer's segment already starts on a 2 MiB granule (nothing padded)"
        if per_layer
        else "the layout keeps blocks outermost, one segment (nothing padded)"
    )
    return [
        f"vLLM's extensible KV cache: on (vLLM's default on CUDA): {how}; "
        f"{config.num_blocks:,} blocks of {block_size} tokens are reserved address space, and "
        "after warm-up vLLM commits a prefix of them sized from measured memory. kvplan's "
        "plugin turns it off: --no-enable-extensible-kv-cache shows that binding."
    ]


def _model_reference(resolved: ResolvedModel) -> str:
    """How to find the model again: its id, or a local path relative to the working dir."""
    path = Path(resolved.name)
    if resolved.source != "local" or not path.is_absolute():
        return resolved.name
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def _metadata(
    resolved: ResolvedModel, options: InspectOptions, rank: int, vllm_config: Any
) -> dict[str, Any]:
    """Deterministic facts only: the golden check regenerates plans from them."""
    return {
        "tool": "kvplan inspect",
        "model": _model_reference(resolved),
        "model_source": resolved.source,
        "architecture": vllm_config.model_config.architecture,
        "max_model_len": int(vllm_config.model_config.max_model_len),
        "tp_rank": rank,
        "inspect": {"options": options.to_metadata()},
    }
