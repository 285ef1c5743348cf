"""Regenerate ``tests/data/legacy/*.json`` with the real vLLM 0.24.0 planning and reshape code.

Run with a Python that has vLLM 0.24.0 (CPU wheel) and kvplan installed::

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 python tools/make_legacy_fixtures.py [--out DIR]

For each case the script:

1. builds a real ``VllmConfig`` from the model's HF ``config.json`` (``--hf-configs``);
2. hand-builds the per-layer specs the way 0.24's ``Attention.get_kv_cache_spec`` /
   ``MLAAttention.get_kv_cache_spec`` / ``MambaBase.get_kv_cache_spec`` do, with
   ``indexes_kv_by_block_stride`` asked of the CUDA backend class the model would use
   (FlashAttention, Triton for Gemma 4, FlashMLA) and the hybrid block/page alignment of
   ``Platform._align_hybrid_block_size``; the KV-sharing map follows the model's formula;
3. plans with 0.24's own ``get_kv_cache_configs`` and ``generate_scheduler_kv_cache_config``;
4. reproduces the runner: deepcopy, ``add_kv_sharing_layers_to_kv_cache_groups``, attention
   groups keyed like ``initialize_attn_backend``, the real ``prepare_kernel_block_sizes``;
5. runs the real V1 ``GPUModelRunner._allocate_kv_cache_tensors`` +
   ``_reshape_kv_cache_tensors`` on a stand-in runner (only the attributes they read) over CPU
   tensors, and the V2 ``_allocate_kv_cache`` + ``_reshape_kv_cache``; checks both agree, then
   applies the alias loop and records every layer's dtype/shape/stride/byte offset/allocation;
6. writes ``kvplan.input-legacy/1`` (``capture_legacy``) with the recorded views under
   ``metadata.vllm_0_24_views``.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import MethodType, SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch


def _v(module: str) -> Any:
    """A vLLM 0.24 module, typed ``Any``: type checkers see the project's vLLM 0.33."""
    return importlib.import_module(module)


def _use_cpu_platform() -> None:
    """The 0.24 CUDA wheel ignores VLLM_TARGET_DEVICE when detecting the platform: pin CPU."""
    platforms = _v("vllm.platforms")
    CpuPlatform = _v("vllm.platforms.cpu").CpuPlatform

    if not isinstance(platforms._current_platform, CpuPlatform):
        platforms._current_platform = CpuPlatform()


_use_cpu_platform()


def _allow_global_head_dim() -> None:
    """vLLM 0.24 reads Gemma 4's global ``head_dim``; newer transformers refuse by default."""
    try:
        from transformers.integrations.heterogeneity import configuration_utils as het
    except ImportError:
        return
    het.HeterogeneousConfigMixin.allow_global_per_layer_attribute_access = property(  # type: ignore[assignment]
        lambda self: True, lambda self, value: None
    )


_allow_global_head_dim()

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20

# name -> (hf config dir, attention backend, block size or None, memory, max_model_len, extra)
CASES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "hf": "meta-llama__Llama-3.1-8B",
        "backend": "flash_attn",
        "memory": 64 * MiB,
        "max_model_len": 512,
        "runner": "V2",
    },
    "qwen2.5-7b-hnd": {
        "hf": "Qwen__Qwen2.5-7B-Instruct",
        "backend": "flash_attn",
        "memory": 32 * MiB,
        "max_model_len": 512,
        "runner": "V1",
        "kv_layout": "HND",  # VLLM_KV_CACHE_LAYOUT=HND: FlashAttention's stride order permutes
    },
    "gemma-3-1b": {
        "hf": "google__gemma-3-1b-it",
        "backend": "flash_attn",
        "memory": 32 * MiB,
        "max_model_len": 1024,
        "runner": "V1",
    },
    "gemma-4-e2b": {
        "hf": "google__gemma-4-E2B-it",
        "backend": "triton_attn",
        "memory": 32 * MiB,
        "max_model_len": 1024,
        "runner": "V1",
        "prefix": "language_model.model.layers",
    },
    "gemma-4-e2b-nohma": {
        "hf": "google__gemma-4-E2B-it",
        "backend": "triton_attn",
        "memory": 32 * MiB,
        "max_model_len": 1024,
        "runner": "V1",
        "prefix": "language_model.model.layers",
        "disable_hma": True,
    },
    "deepseek-v2-lite-mla": {
        "hf": "deepseek-ai__DeepSeek-V2-Lite",
        "backend": "flashmla",
        "block_size": 64,
        "memory": 32 * MiB,
        "max_model_len": 1024,
        "runner": "V2",
    },
    "deepseek-v2-lite-mla-bs128": {
        "hf": "deepseek-ai__DeepSeek-V2-Lite",
        "backend": "flashmla",
        "block_size": 128,  # --block-size 128: FlashMLA's 64-token kernel blocks split it
        "memory": 32 * MiB,
        "max_model_len": 1024,
        "runner": "V2",
    },
    "jamba-v0.1-hybrid": {
        "hf": "ai21labs__Jamba-v0.1",
        "backend": "flash_attn",
        "memory": 48 * MiB,
        "max_model_len": 1024,
        "runner": "V1",
        "prefix_caching": False,  # else mamba_cache_mode "all" makes 8 MiB blocks
    },
}

BACKENDS = {
    "flash_attn": "vllm.v1.attention.backends.flash_attn:FlashAttentionBackend",
    "triton_attn": "vllm.v1.attention.backends.triton_attn:TritonAttentionBackend",
    "flashmla": "vllm.v1.attention.backends.mla.flashmla:FlashMLABackend",
}


def _cls(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def make_vllm_config(case: dict[str, Any], hf_root: Path) -> Any:
    CacheConfig = _v("vllm.config").CacheConfig
    DeviceConfig = _v("vllm.config").DeviceConfig
    ModelConfig = _v("vllm.config").ModelConfig
    SchedulerConfig = _v("vllm.config").SchedulerConfig
    VllmConfig = _v("vllm.config").VllmConfig

    src = hf_root / case["hf"] / "config.json"
    tmp = Path(tempfile.mkdtemp(prefix="kvplan-hf-"))
    (tmp / "config.json").write_text(src.read_text())
    model = ModelConfig(
        model=str(tmp),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=case["max_model_len"],
        enforce_eager=True,
        trust_remote_code=False,
    )
    cache = CacheConfig(
        block_size=case.get("block_size", 16),
        enable_prefix_caching=case.get("prefix_caching", True),
    )
    sched = SchedulerConfig(
        max_model_len=case["max_model_len"],
        is_encoder_decoder=False,
        disable_hybrid_kv_cache_manager=case.get("disable_hma", False),
    )
    return VllmConfig(
        model_config=model,
        cache_config=cache,
        scheduler_config=sched,
        device_config=DeviceConfig(device="cpu"),
    )


def layer_types(text: Any) -> list[str]:
    types = getattr(text, "layer_types", None)
    if types:
        return list(types)
    return ["full_attention"] * text.num_hidden_layers


def build_specs(
    case: dict[str, Any], vc: Any, backend: Any
) -> tuple[dict[str, Any], dict[str, str], str]:
    """Per-layer 0.24 specs, the sharing map and the layer-name prefix."""
    set_current_vllm_config = _v("vllm.config").set_current_vllm_config
    Platform = _v("vllm.platforms.interface").Platform
    FullAttentionSpec = _v("vllm.v1.kv_cache_interface").FullAttentionSpec
    MambaSpec = _v("vllm.v1.kv_cache_interface").MambaSpec
    MLAAttentionSpec = _v("vllm.v1.kv_cache_interface").MLAAttentionSpec
    SlidingWindowSpec = _v("vllm.v1.kv_cache_interface").SlidingWindowSpec
    get_kv_quant_mode = _v("vllm.v1.kv_cache_interface").get_kv_quant_mode

    mc, cc = vc.model_config, vc.cache_config
    text = mc.hf_text_config
    dtype = mc.dtype
    quant = get_kv_quant_mode(cc.cache_dtype)
    with set_current_vllm_config(vc):
        indexes = backend.indexes_kv_by_block_stride()
    specs: dict[str, Any] = {}
    shared: dict[str, str] = {}
    prefix = case.get("prefix", "model.layers")

    if mc.use_mla:
        for i in range(text.num_hidden_layers):
            spec = MLAAttentionSpec(
                block_size=cc.block_size,
                num_kv_heads=1,
                head_size=mc.get_head_size(),
                dtype=dtype,
                cache_dtype_str=cc.cache_dtype,
            )
            specs[f"{prefix}.{i}.self_attn.attn"] = replace(
                spec, indexes_kv_by_block_stride=indexes
            )
        return specs, shared, prefix

    if mc.is_hybrid:
        ModelRegistry = _v("vllm.model_executor.models").ModelRegistry

        # the base (CUDA) alignment: attention block >= Mamba page, Mamba page padded to it
        Platform._align_hybrid_block_size(vc, backend)
        model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
        shapes = model_cls.get_mamba_state_shape_from_config(vc)
        dtypes = model_cls.get_mamba_state_dtype_from_config(vc)
        period, offset = text.attn_layer_period, text.attn_layer_offset
        for i in range(text.num_hidden_layers):
            if i % period == offset:
                spec = FullAttentionSpec(
                    block_size=cc.block_size,
                    num_kv_heads=mc.get_num_kv_heads(vc.parallel_config),
                    head_size=mc.get_head_size(),
                    dtype=dtype,
                    kv_quant_mode=quant,
                )
                specs[f"{prefix}.{i}.self_attn.attn"] = replace(
                    spec, indexes_kv_by_block_stride=indexes
                )
            else:
                MambaAttentionBackendEnum = _v(
                    "vllm.v1.attention.backends.registry"
                ).MambaAttentionBackendEnum

                specs[f"{prefix}.{i}.mamba"] = MambaSpec(
                    shapes=tuple(shapes),
                    dtypes=tuple(dtypes),
                    block_size=cc.mamba_block_size,
                    page_size_padded=cc.mamba_page_size_padded,
                    mamba_type=MambaAttentionBackendEnum.MAMBA1,
                    mamba_cache_mode=cc.mamba_cache_mode,
                )
        return specs, shared, prefix

    types = layer_types(text)
    raw = text.to_dict()  # gemma4.py reads the global head_dim / global_head_dim attributes
    n = text.num_hidden_layers
    n_shared = getattr(text, "num_kv_shared_layers", 0) or 0
    first_shared = n - n_shared
    for i in range(n):
        name = f"{prefix}.{i}.self_attn.attn"
        sliding = types[i] == "sliding_attention"
        if i >= first_shared:  # gemma4.py: last non-shared layer of the same type
            prev = types[:first_shared]
            target = len(prev) - 1 - prev[::-1].index(types[i])
            shared[name] = f"{prefix}.{target}.self_attn.attn"
            continue
        head = raw.get("head_dim") or mc.get_head_size()
        heads = raw.get("num_key_value_heads") or mc.get_num_kv_heads(vc.parallel_config)
        per_layer = raw.get("per_layer_config")
        if per_layer is not None:
            # transformers >= 5.2x resolves gemma4.py's global_head_dim (full layers) and
            # num_global_key_value_heads (k_eq_v) per layer
            layer_cfg = text.per_layer_config[i]
            head, heads = layer_cfg.head_dim, layer_cfg.num_key_value_heads
        elif not sliding and raw.get("global_head_dim"):
            head = raw["global_head_dim"]
            if raw.get("attention_k_eq_v"):
                heads = raw.get("num_global_key_value_heads") or heads
        common = {
            "block_size": cc.block_size,
            "num_kv_heads": heads,
            "head_size": head,
            "head_size_v": head,
            "dtype": dtype,
            "kv_quant_mode": quant,
        }
        if sliding:
            spec = SlidingWindowSpec(sliding_window=text.sliding_window, **common)
        else:
            spec = FullAttentionSpec(**common)
        specs[name] = replace(spec, indexes_kv_by_block_stride=indexes)
    return specs, shared, prefix


def attention_groups(cfg: Any, backend: Any, mamba_backend: Any, shared: dict[str, str]) -> list:
    """The runner's attention groups, keyed like 0.24's ``initialize_attn_backend``."""
    MambaSpec = _v("vllm.v1.kv_cache_interface").MambaSpec
    UniformTypeKVCacheSpecs = _v("vllm.v1.kv_cache_interface").UniformTypeKVCacheSpecs
    AttentionGroup = _v("vllm.v1.worker.utils").AttentionGroup

    out: list[list[Any]] = []
    for gid, group in enumerate(cfg.kv_cache_groups):
        by_key: dict[Any, Any] = {}
        for layer in group.layer_names:
            spec = group.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                # vLLM 0.24 indexes kv_cache_specs[layer] here and raises KeyError for
                # sharers; kvplan resolves a sharer's spec through its target.
                spec = spec.kv_cache_specs[shared.get(layer, layer)]
            be = mamba_backend if isinstance(spec, MambaSpec) else backend
            key = (be.__name__, spec)
            if key not in by_key:
                by_key[key] = AttentionGroup(be, [layer], spec, gid)
            else:
                by_key[key].layer_names.append(layer)
        out.append(list(by_key.values()))
    return out


def v1_reshape(
    cfg: Any, attn_groups: list, kbs: list[int], runner_only: set[str], cache_dtype: str
):
    """Run 0.24's V1 allocate + reshape methods on a stand-in runner."""
    GPUModelRunner = _v("vllm.v1.worker.gpu_model_runner").GPUModelRunner

    runner = SimpleNamespace(
        device=torch.device("cpu"),
        runner_only_attn_layers=set(runner_only),
        kv_cache_config=cfg,
        attn_groups=attn_groups,
        cache_config=SimpleNamespace(cache_dtype=cache_dtype),
    )
    for name in (
        "_allocate_kv_cache_tensors",
        "_kv_cache_spec_attn_group_iterator",
        "_reshape_kv_cache_tensors",
        "_update_hybrid_attention_mamba_layout",
    ):
        setattr(runner, name, MethodType(getattr(GPUModelRunner, name), runner))
    raw = runner._allocate_kv_cache_tensors(cfg)
    return raw, runner._reshape_kv_cache_tensors(raw, kbs)


def v2_reshape(
    cfg: Any, attn_groups: list, kbs: list[int], shared: dict[str, str], cache_dtype: str
):
    attn_utils = _v("vllm.v1.worker.gpu.attn_utils")

    raw = attn_utils._allocate_kv_cache(cfg, shared, torch.device("cpu"))
    flat = [g for gs in attn_groups for g in gs]
    caches = attn_utils._reshape_kv_cache(
        attn_groups=flat,
        kv_cache_raw_tensors=raw,
        cache_dtype=cache_dtype,
        kernel_block_sizes=kbs,
        shared_kv_cache_layers=shared,
        kv_cache_config=cfg,
    )
    return raw, caches


def describe(t: torch.Tensor, allocations: dict[int, int]) -> dict[str, Any]:
    base = t.untyped_storage().data_ptr()
    return {
        "allocation": allocations[base],
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "offset_bytes": t.data_ptr() - base,
    }


def record_views(
    raw: dict[str, torch.Tensor], caches: dict[str, Any], cfg: Any, shared: dict[str, str]
) -> dict[str, Any]:
    """Per layer (Mamba: per state ``layer#i``): allocation index, dtype, shape, stride, offset."""
    allocations: dict[int, int] = {}
    for tensor in cfg.kv_cache_tensors:
        ptr = raw[tensor.shared_by[0]].untyped_storage().data_ptr()
        allocations.setdefault(ptr, len(allocations))
    views: dict[str, Any] = {}
    for layer, value in caches.items():
        if layer in shared:
            views[layer] = {
                "alias_of": shared[layer],
                "same_object": value is caches[shared[layer]],
            }
        elif isinstance(value, list):
            for i, state in enumerate(value):
                views[f"{layer}#{i}"] = describe(state, allocations)
        else:
            views[layer] = describe(value, allocations)
    return views


def same_geometry(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: {f: v for f, v in d.items() if f != "same_object"} for k, d in a.items()} == {
        k: {f: v for f, v in d.items() if f != "same_object"} for k, d in b.items()
    }


def make_case(name: str, case: dict[str, Any], hf_root: Path) -> dict[str, Any]:
    import vllm

    set_current_vllm_config = _v("vllm.config").set_current_vllm_config
    set_kv_cache_layout = _v("vllm.v1.attention.backends.utils").set_kv_cache_layout
    generate_scheduler_kv_cache_config = _v(
        "vllm.v1.core.kv_cache_utils"
    ).generate_scheduler_kv_cache_config
    get_kv_cache_configs = _v("vllm.v1.core.kv_cache_utils").get_kv_cache_configs
    add_kv_sharing_layers_to_kv_cache_groups = _v(
        "vllm.v1.worker.utils"
    ).add_kv_sharing_layers_to_kv_cache_groups
    prepare_kernel_block_sizes = _v("vllm.v1.worker.utils").prepare_kernel_block_sizes

    from kvplan.integrations.vllm.convert.legacy import capture_legacy
    from kvplan.schemas.canonical import to_data

    set_kv_cache_layout(case.get("kv_layout"))
    vc = make_vllm_config(case, hf_root)
    backend = _cls(BACKENDS[case["backend"]])
    mamba_backend = _cls("vllm.v1.attention.backends.mamba1_attn:Mamba1AttentionBackend")
    with set_current_vllm_config(vc):
        specs, shared, _ = build_specs(case, vc, backend)
        worker = get_kv_cache_configs(vc, [specs], [case["memory"]])[0]
        scheduler = generate_scheduler_kv_cache_config([worker])
        runner_cfg = copy.deepcopy(worker)
        runner_only: set[str] = set()
        add_kv_sharing_layers_to_kv_cache_groups(shared, runner_cfg.kv_cache_groups, runner_only)
        groups = attention_groups(runner_cfg, backend, mamba_backend, shared)
        kbs = prepare_kernel_block_sizes(runner_cfg, groups)
        cache_dtype = vc.cache_config.cache_dtype
        raw1, v1 = v1_reshape(runner_cfg, groups, kbs, runner_only, cache_dtype)
        for sharer, target in shared.items():  # initialize_kv_cache_tensors' alias loop
            v1[sharer] = v1[target]
        raw2, v2 = v2_reshape(copy.deepcopy(runner_cfg), groups, kbs, shared, cache_dtype)
        views1 = record_views(raw1, v1, runner_cfg, shared)
        views2 = record_views(raw2, v2, runner_cfg, shared)
        if not same_geometry(views1, views2):
            raise SystemExit(f"{name}: the V1 and V2 runners disagree")
        doc = capture_legacy(
            runner_cfg,
            groups,
            kernel_block_sizes=kbs,
            runner_only_attn_layers=runner_only,
            shared_kv_cache_layers=shared,
            cache_dtype=cache_dtype,
            vllm_version=vllm.__version__,
            scheduler_kv_cache_config=scheduler,
            vllm_config=vc,
            metadata={
                "model": case["hf"].replace("__", "/"),
                "tool": "tools/make_legacy_fixtures.py",
                "attention_backend": backend.__name__,
                "default_runner": case["runner"],
                "hybrid_kv_cache_manager": not vc.scheduler_config.disable_hybrid_kv_cache_manager,
                "available_memory_bytes": case["memory"],
                "vllm_0_24_views": views1,
            },
        )
    return to_data(doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "legacy")
    parser.add_argument("--hf-configs", type=Path, default=ROOT.parent / "shared" / "hf-configs")
    parser.add_argument("cases", nargs="*", default=list(CASES))
    args = parser.parse_args(argv)
    import vllm

    if not vllm.__version__.startswith("0.24"):
        print(f"needs vLLM 0.24.x, found {vllm.__version__}", file=sys.stderr)
        return 2
    from kvplan.schemas.canonical import _format

    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.cases:
        data = make_case(name, CASES[name], args.hf_configs)
        path = args.out / f"{name}.json"
        path.write_text(_format(data, 0) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
