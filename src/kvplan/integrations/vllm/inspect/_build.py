"""Ask the installed vLLM to build a model's KV-cache configuration, on the CPU.

The steps are vLLM's own, in vLLM's order:

1. :func:`make_vllm_config`: ``EngineArgs(...).create_engine_config()`` (what ``vllm serve``
   does with the same flags);
2. :func:`collect_worker_specs`: each TP rank builds the model on the ``meta`` device and
   collects its per-layer ``KVCacheSpec`` s and the KV-sharing map, as a GPU worker's
   runner does (ranks > 1 run in spawned processes joined by a gloo group);
3. :func:`plan_kv_cache`: the engine core's ``_initialize_kv_caches`` — layout resolution,
   ``get_global_kv_cache_groups``, ``get_kv_cache_configs``, the scheduler config and the
   hash block sizes;
4. :func:`runner_config` and :func:`kernel_block_sizes`: the runner's copy after its
   KV-sharing append, and ``prepare_kernel_block_sizes`` over the runner's attention groups.

Everything runs inside :func:`~kvplan.integrations.vllm.inspect._emulation.cuda_platform`.

Vision and audio towers are skipped (``language_model_only``): vLLM still runs a skipped
tower's constructor, then replaces the tower with a placeholder that it never calls. When
that constructor fails on this machine (a package it needs is missing, or it computes on
meta tensors), :func:`skipped_towers_tolerated` drops the
tower and records why, provided the tower registered no layer that owns a KV cache
before failing (otherwise the build fails as vLLM's would).

Some layers compute a constant from the config while they are built (Gemma 3n's sparse GELU:
``torch.tensor(0.95)`` then ``.item()``). On a GPU that tensor is real; on the ``meta``
device it has no value. :func:`scalar_constants_on_cpu` makes tensors built from one Python
number on the CPU (a 0-dim tensor mixes with tensors of any device); weights stay on meta.
"""

from __future__ import annotations

import copy
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.inspect._emulation import cuda_platform
from kvplan.schemas.errors import Code, KVPlanError, error

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

    from kvplan.integrations.vllm.versions import EngineCorePlanning


@dataclass(frozen=True)
class BuildOptions:
    """The ``vllm serve`` flags kvplan plans with (``None``: vLLM's default)."""

    model: str
    """Directory holding the model's ``config.json``."""
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    tp: int = 1
    layout: str | None = None
    """A ``KVCacheLayout`` name to pre-set (``None``: vLLM resolves one)."""
    num_blocks: int | None = None
    """``--num-gpu-blocks-override``."""
    disable_hybrid_kv_cache_manager: bool = False
    attention_backend: str | None = None
    dtype: str = "auto"
    hf_overrides: Mapping[str, Any] | None = None
    kv_cache_dtype_skip_layers: tuple[str, ...] = ()
    """Layer indices or ``sliding_window`` left unquantized (mixed precision, padded pages)."""
    trust_remote_code: bool = False
    """Let transformers/vLLM run the model repository's own Python code (``auto_map``)."""
    language_model_only: bool = True
    """Skip vision/audio towers: they hold no KV cache (and may need extra packages)."""
    enable_extensible_kv_cache: bool | None = None
    """vLLM 0.34's setting (``None``: vLLM decides; a release without it is refused when set)."""

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments of vLLM's ``EngineArgs``."""
        args: dict[str, Any] = {
            "model": self.model,
            "skip_tokenizer_init": True,
            "enforce_eager": True,
            "disable_log_stats": True,
            "dtype": self.dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
            "tensor_parallel_size": self.tp,
            "disable_hybrid_kv_cache_manager": self.disable_hybrid_kv_cache_manager,
            "language_model_only": self.language_model_only,
            "trust_remote_code": self.trust_remote_code,
        }
        if self.kv_cache_dtype_skip_layers:
            args["kv_cache_dtype_skip_layers"] = list(self.kv_cache_dtype_skip_layers)
        optional = {
            "max_model_len": self.max_model_len,
            "block_size": self.block_size,
            "num_gpu_blocks_override": self.num_blocks,
            "attention_backend": self.attention_backend,
            "hf_overrides": dict(self.hf_overrides) if self.hf_overrides else None,
            "enable_extensible_kv_cache": self.enable_extensible_kv_cache,
        }
        args.update({key: value for key, value in optional.items() if value is not None})
        return args


@dataclass
class WorkerSpecs:
    """What one TP rank's runner reports: per-layer specs and the KV-sharing map."""

    rank: int
    specs: dict[str, KVCacheSpec]
    shared_kv_cache_layers: dict[str, str]
    backends: dict[str, type[AttentionBackend]]
    """Attention backend of every attention layer (sharers included)."""
    num_heads_q: dict[str, int]
    weight_bytes: int
    """Bytes of the rank's parameters and buffers, as built (a weight-memory estimate)."""
    architecture: str = ""
    num_layers: int = 0
    cache_config: Any = field(default=None, repr=False)
    dropped_towers: list[str] = field(default_factory=list)
    """Skipped towers whose constructor failed here, with the reason (no KV cache)."""


def make_vllm_config(options: BuildOptions) -> VllmConfig:
    """vLLM's engine config for ``options`` (call inside :func:`cuda_platform`)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    args = options.engine_args()
    known = {f.name for f in dataclasses.fields(EngineArgs)}
    if "enable_extensible_kv_cache" in args and "enable_extensible_kv_cache" not in known:
        import vllm

        raise KVPlanError(
            error(
                Code.INTEGRATION,
                "--enable-extensible-kv-cache",
                f"vLLM {vllm.__version__} has no extensible KV cache (vLLM 0.34 added it).",
                "drop --[no-]enable-extensible-kv-cache, or inspect with vLLM 0.34 or later",
            )
        )
    config = EngineArgs(**args).create_engine_config()
    if options.layout is not None:
        # "Tests and standalone tools may pre-set a value" (vllm/config/cache.py).
        from kvplan.schemas.layout import parse_layout

        config.cache_config.kv_cache_layout = parse_layout(options.layout).name
    return config


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _init_parallel(vllm_config: VllmConfig, rank: int, init_method: str) -> None:
    import torch.distributed as dist
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )

    # vLLM's CPU worker names its process group after the init method before it joins it;
    # 0.32's CPU communicator reads that name (0.33's no longer needs it).
    os.environ.setdefault("VLLM_DIST_IDENT", init_method.rsplit(":", 1)[-1].rsplit("/", 1)[-1])
    tp = vllm_config.parallel_config.tensor_parallel_size
    with set_current_vllm_config(vllm_config):
        if not dist.is_initialized():
            init_distributed_environment(
                world_size=tp,
                rank=rank,
                local_rank=rank,
                distributed_init_method=init_method,
                backend="gloo",
            )
        if model_parallel_is_initialized():
            # Groups depend on the model (the EP group exists only for MoE models).
            destroy_model_parallel()
        initialize_model_parallel(tp, 1)


def build_worker_specs(vllm_config: VllmConfig, rank: int = 0) -> WorkerSpecs:
    """Build the model on ``meta`` and collect what the GPU runner would (this process)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec, get_shared_kv_cache_layers

    # As BaseModelLoader.load_model does, with the meta device as the target.
    dtype: torch.dtype = vllm_config.model_config.dtype  # type: ignore[assignment]  # resolved
    dropped: list[str] = []
    with (
        set_current_vllm_config(vllm_config),
        set_default_torch_dtype(dtype),
        torch.device("meta"),
        scalar_constants_on_cpu(),
        skipped_towers_tolerated(dropped),
    ):
        model = initialize_model(vllm_config=vllm_config)
    with set_current_vllm_config(vllm_config):
        # What the executor does after load_model (uniproc_executor.py, multiproc_executor.py).
        current_platform.update_block_size_for_backend(vllm_config)
        specs = get_kv_cache_spec(vllm_config)
        shared = dict(get_shared_kv_cache_layers(vllm_config))
        layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)  # type: ignore[type-abstract]
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    weights += sum(t.numel() * t.element_size() for t in model.buffers())
    return WorkerSpecs(
        rank=rank,
        specs=specs,
        shared_kv_cache_layers=shared,
        backends={name: layer.get_attn_backend() for name, layer in layers.items()},
        num_heads_q={
            name: int(getattr(layer, "num_heads", 0) or 0) for name, layer in layers.items()
        },
        weight_bytes=int(weights),
        architecture=type(model).__name__,
        num_layers=len(layers),
        cache_config=copy.deepcopy(vllm_config.cache_config),
        dropped_towers=dropped,
    )


@contextmanager
def scalar_constants_on_cpu() -> Iterator[None]:
    """Within this block, ``torch.tensor(<number>)`` with no device is made on the CPU."""
    import torch
    from torch.overrides import TorchFunctionMode

    class ScalarConstantsOnCPU(TorchFunctionMode):
        def __torch_function__(
            self,
            func: Any,
            types: Any,
            args: Sequence[Any] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            kwargs = dict(kwargs or {})
            if (
                func is torch.tensor
                and kwargs.get("device") is None
                and len(args) == 1
                and isinstance(args[0], bool | int | float)
            ):
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    with ScalarConstantsOnCPU():
        yield


def _kv_layers(vllm_config: VllmConfig) -> set[str]:
    """Names of the layers registered so far that may own a KV cache."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    context = vllm_config.compilation_config.static_forward_context
    return {name for name, layer in context.items() if isinstance(layer, AttentionLayerBase)}


@contextmanager
def skipped_towers_tolerated(dropped: list[str]) -> Iterator[None]:
    """Within this block, a skipped tower whose constructor fails is dropped (see module doc).

    ``dropped`` receives one line per dropped tower. A tower that is not skipped, or that
    registered an attention layer before failing, fails the build as before.
    """
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.models.interfaces import SupportsMultiModal

    original = SupportsMultiModal.__dict__["_mark_tower_model"]

    @contextmanager
    def mark_tower_model(
        self: Any, vllm_config: VllmConfig, modalities: set[str] | str, **kwargs: Any
    ) -> Iterator[None]:
        wanted = {modalities} if isinstance(modalities, str) else set(modalities)
        mm_config = vllm_config.model_config.get_multimodal_config()
        # vLLM's own test for replacing the tower by a placeholder.
        skipped = all(mm_config.get_limit_per_prompt(m) == 0 for m in wanted)
        before = _kv_layers(get_current_vllm_config())
        with original(self, vllm_config, modalities, **kwargs):
            if not skipped:
                yield
                return
            try:
                yield
            except Exception as exc:
                registered = _kv_layers(get_current_vllm_config()) - before
                if registered:
                    raise
                text = str(exc).strip().splitlines()
                reason = f"{type(exc).__name__}: {text[0] if text else ''}".strip(": ")
                dropped.append(f"{type(self).__name__} {'/'.join(sorted(wanted))} tower: {reason}")

    SupportsMultiModal._mark_tower_model = mark_tower_model  # type: ignore[method-assign]
    try:
        yield
    finally:
        SupportsMultiModal._mark_tower_model = original  # type: ignore[method-assign]


def _rank_main(options: BuildOptions, rank: int, init_method: str) -> WorkerSpecs:
    """What one TP rank runs (in its own process)."""
    with cuda_platform():
        vllm_config = make_vllm_config(options)
        _init_parallel(vllm_config, rank, init_method)
        return build_worker_specs(vllm_config, rank)


def collect_worker_specs(options: BuildOptions, vllm_config: VllmConfig) -> list[WorkerSpecs]:
    """Every TP rank's :class:`WorkerSpecs` (rank 0 first).

    ``tp == 1`` builds in this process (as vLLM's uniproc executor does, so ``vllm_config``
    receives the worker's block-size update); ``tp > 1`` starts one Python process per rank
    (``python -m kvplan.integrations.vllm.inspect._rank``), joined by a gloo group.
    """
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    if options.tp == 1:
        # The world (size 1) stays up for the process; model-parallel groups are rebuilt.
        _init_parallel(vllm_config, 0, init_method)
        return [build_worker_specs(vllm_config, 0)]
    with tempfile.TemporaryDirectory(prefix="kvplan-tp-") as tmp:
        request = Path(tmp) / "request.pkl"
        request.write_bytes(pickle.dumps((options, init_method)))
        logs = [(Path(tmp) / f"rank{rank}.log").open("wb") for rank in range(options.tp)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "kvplan.integrations.vllm.inspect._rank", tmp, str(rank)],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            for rank, log in enumerate(logs)
        ]
        _wait_all(procs)
        results = []
        for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
            log.close()
            if proc.returncode != 0:
                text = (Path(tmp) / f"rank{rank}.log").read_text(errors="replace")
                tail = text.strip().splitlines()[-5:]
                raise RuntimeError(f"TP rank {rank} failed: " + " | ".join(tail))
            results.append(pickle.loads((Path(tmp) / f"rank{rank}.pkl").read_bytes()))
    return results


RANK_TIMEOUT_S = 900.0


def _wait_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Wait for every rank; when one fails (or time runs out), stop the others."""
    deadline = time.monotonic() + RANK_TIMEOUT_S
    while any(proc.poll() is None for proc in procs):
        failed = any(proc.returncode not in (None, 0) for proc in procs)
        if failed or time.monotonic() > deadline:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            return
        time.sleep(0.1)


@dataclass
class KVCachePlan:
    """The engine core's result: one ``KVCacheConfig`` per worker, plus the scheduler's."""

    worker_configs: list[KVCacheConfig]
    scheduler_config: KVCacheConfig
    layout: str
    available_memory: list[int]
    capacity_tokens: int = 0
    """vLLM's "KV cache size" in tokens (group-aware)."""
    max_concurrency: float = 0.0
    """Requests of ``max_model_len`` tokens that fit at once."""


def engine_core_planning() -> EngineCorePlanning:
    """The installed vLLM's engine-core planning steps, from its version adapter."""
    import vllm

    from kvplan.integrations.vllm.versions import adapter_for, all_adapters, supported_range
    from kvplan.schemas.errors import Code, KVPlanError, error

    version = str(getattr(vllm, "__version__", "unknown"))
    adapter = adapter_for(version)
    planning = adapter.engine_core_planning(version) if adapter else None
    if planning is None:
        replayed = ", ".join(r for a in all_adapters() for r in a.engine_core)
        raise KVPlanError(
            error(
                Code.INTEGRATION,
                "vllm.__version__",
                f"kvplan cannot replay the engine core's KV planning of vLLM {version} "
                f"(it builds models with vLLM {replayed}; the plugin supports "
                f"{supported_range()}).",
                "install vLLM 0.33 (pip install 'kvplan[vllm]') to inspect models",
            )
        )
    return planning


def plan_kv_cache(
    vllm_config: VllmConfig, workers: Sequence[WorkerSpecs], available_memory: Sequence[int]
) -> KVCachePlan:
    """``EngineCore._initialize_kv_caches`` up to ``initialize_from_config``."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        record_kv_cache_layout,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_kv_cache_capacity,
    )
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

    planning = engine_core_planning()
    kv_cache_specs = [dict(worker.specs) for worker in workers]
    cache_config = vllm_config.cache_config
    with set_current_vllm_config(vllm_config):
        register_all_kvcache_specs(vllm_config)
        all_specs = [spec for specs in kv_cache_specs for spec in specs.values()]
        if any(getattr(spec, "non_causal", False) for spec in all_specs):
            vllm_config.scheduler_config.enable_chunked_prefill = False
            cache_config.enable_prefix_caching = False
        supported = [
            [layout.name for layout in get_supported_kv_cache_layouts(_distinct(w.backends))]
            for w in workers
        ]
        layout = resolve_kv_cache_layout(vllm_config, supported, all_specs)
        groups = planning.groups(vllm_config, kv_cache_specs)
        record_kv_cache_layout(cache_config, layout.name)
        memory = list(available_memory) if any(kv_cache_specs) else [0] * len(workers)
        configs = planning.configs(vllm_config, kv_cache_specs, memory, groups)
        for config in configs:
            config.kv_cache_layout = cache_config.kv_cache_layout
        scheduler = generate_scheduler_kv_cache_config(configs)
        cache_config.num_gpu_blocks = scheduler.num_blocks
        if scheduler.kv_cache_groups:
            sizes = [g.kv_cache_spec.block_size for g in scheduler.kv_cache_groups]
            cacheable = [
                g.kv_cache_spec.block_size
                for g in scheduler.kv_cache_groups
                if g.kv_cache_spec.prefix_cacheable or not planning.block_size_of_cacheable_groups
            ]
            cache_config.block_size = min(cacheable or sizes)
        vllm_config.validate_block_size()
        if planning.resolves_hash_block_size:
            _resolve_hash_block_sizes(vllm_config, scheduler, configs)
        tokens, concurrency = (
            get_kv_cache_capacity(vllm_config, scheduler) if scheduler.kv_cache_groups else (0, 0.0)
        )
    return KVCachePlan(configs, scheduler, layout.name, memory, tokens, concurrency)


def _resolve_hash_block_sizes(
    vllm_config: VllmConfig, scheduler: KVCacheConfig, configs: Sequence[KVCacheConfig]
) -> None:
    """``hash_block_size`` and ``cache_hit_alignment_tokens`` into every config (vLLM 0.32+:
    0.29–0.31 have no ``resolve_cache_hit_alignment_tokens``)."""
    from vllm.v1.core.kv_cache_utils import (
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
    )

    block_size, hash_block_size = resolve_kv_cache_block_sizes(scheduler, vllm_config)
    alignment = resolve_cache_hit_alignment_tokens(
        scheduler, vllm_config, block_size, hash_block_size
    )
    for config in (*configs, scheduler):
        config.hash_block_size = hash_block_size
        config.cache_hit_alignment_tokens = alignment


def _distinct(backends: Mapping[str, type[AttentionBackend]]) -> list[type[AttentionBackend]]:
    seen: dict[str, type[AttentionBackend]] = {}
    for backend in backends.values():
        seen.setdefault(f"{backend.__module__}.{backend.__qualname__}", backend)
    return list(seen.values())


def runner_config(
    kv_cache_config: KVCacheConfig, shared_kv_cache_layers: Mapping[str, str]
) -> KVCacheConfig:
    """The runner's deep copy after ``add_kv_sharing_layers_to_kv_cache_groups``."""
    from vllm.v1.worker.utils import add_kv_sharing_layers_to_kv_cache_groups

    config = copy.deepcopy(kv_cache_config)
    add_kv_sharing_layers_to_kv_cache_groups(
        dict(shared_kv_cache_layers), config.kv_cache_groups, set()
    )
    return config


def kernel_block_sizes(
    runner_kv_cache_config: KVCacheConfig,
    worker: WorkerSpecs,
) -> list[int]:
    """``prepare_kernel_block_sizes`` over the runner's attention groups.

    The groups are formed as the V2 runner's ``init_attn_backend`` (phase 1) forms them:
    keyed by backend, layer spec and query heads. A KV-sharing layer in a
    ``UniformTypeKVCacheSpecs`` group has no entry of its own there (vLLM would raise a
    ``KeyError``); kvplan resolves it through its target's spec.
    """
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
    from vllm.v1.worker.utils import AttentionGroup, prepare_kernel_block_sizes

    shared = worker.shared_kv_cache_layers
    attn_groups: list[list[AttentionGroup]] = []
    for gid, group in enumerate(runner_kv_cache_config.kv_cache_groups):
        if not getattr(group.kv_cache_spec, "has_layer_views", True):  # 0.29: every spec has
            attn_groups.append([])
            continue
        by_key: dict[tuple[Any, ...], AttentionGroup] = {}
        for name in group.layer_names:
            spec = group.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                spec = spec.kv_cache_specs.get(name) or spec.kv_cache_specs[shared[name]]
            backend = worker.backends[name]
            key = (backend.full_cls_name(), spec, worker.num_heads_q.get(name, 0))
            if key in by_key:
                by_key[key].layer_names.append(name)
            else:
                by_key[key] = AttentionGroup(backend, [name], spec, gid)
        attn_groups.append(list(by_key.values()))
    return list(prepare_kernel_block_sizes(runner_kv_cache_config, attn_groups))
