"""Record kvcached's real binding of the legacy fixtures into ``tests/data/kvcached/*.json``.

Runs kvcached 0.1.6's own vLLM patches (``kvcached.integration.vllm.patches``) on vLLM 0.24.0's
real V1 ``GPUModelRunner`` and ``KVCacheCoordinator`` classes, on the CPU. Only kvcached's compiled
VMM module (``kvcached.vmm_ops``) is replaced: the stub's ``create_kv_tensors`` hands back meta
tensors of exactly the sizes kvcached asks for, and records the call. Everything else (shape
classification, capacity sizing, ``as_strided``/``permute`` view math, heterogeneous per-group
views, Mamba state views, pool-per-group-index binding, KV-sharing aliases, the scheduler's
``ElasticBlockPool`` arguments) is kvcached's unmodified code.

Run with a Python that has vLLM 0.24.0 importable and kvcached 0.1.6's *sources* (the sdist,
unbuilt: ``pip download --no-deps --no-binary :all: --no-build-isolation kvcached==0.1.6``)::

    VLLM_TARGET_DEVICE=cpu python tools/make_kvcached_fixtures.py --kvcached-src DIR [--out DIR]

where ``DIR`` holds the ``kvcached`` package. The vLLM 0.24.0 wheel may be unpacked with
``pip install --no-deps --target SITE`` and put first on ``PYTHONPATH`` next to a newer torch:
the V1 runner's allocation/reshape path and the attention backends' ``get_kv_cache_shape`` are
pure Python (``vllm._C`` is not needed on the CPU). The committed data was made that way, with
torch 2.14 instead of the 2.11 vLLM 0.24 pins (each record names its torch version).

For each ``tests/data/legacy/*.json`` fixture and each kvcached layout (non-contiguous,
contiguous) the script:

1. rebuilds vLLM 0.24's ``KVCacheConfig`` (worker side: sharing layers appended, as the runner
   holds it) and the scheduler's config (the same minus the runner-only sharing layers);
2. calls kvcached's patched ``KVCacheCoordinator._setup_kvcached_coordinator`` on a stand-in
   coordinator and records the ``ElasticBlockPool`` arguments (pool count, cell size, buffers);
3. on a ``GPUModelRunner`` stand-in (only the attributes the patched methods read; attention
   backends are vLLM 0.24's real classes, ``_kernel_block_sizes`` the fixture's, which came from
   vLLM's own ``prepare_kernel_block_sizes``) calls the patched ``_allocate_kv_cache_tensors``
   and ``_reshape_kv_cache_tensors``;
4. records every ``create_kv_tensors`` call, every raw pool's size, and every layer's view
   (dtype, shape, stride, byte offset from its pool's start, pool index; sharing layers as the
   layer they alias; Mamba states as ``layer#i``), or the exception kvcached raised.

A pretend device of ``--device-mib`` MiB (``torch.cuda.get_device_properties``) sizes kvcached's
virtual reservation, which kvcached derives from the whole device, not from vLLM's budget.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["ENABLE_KVCACHED"] = "true"
os.environ.pop("KVCACHED_AUTOPATCH", None)

import torch

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
FORMAT = "kvplan.kvcached-recording/1"

BACKENDS = {
    "FlashAttentionBackend": "vllm.v1.attention.backends.flash_attn:FlashAttentionBackend",
    "TritonAttentionBackend": "vllm.v1.attention.backends.triton_attn:TritonAttentionBackend",
    "FlashMLABackend": "vllm.v1.attention.backends.mla.flashmla:FlashMLABackend",
    "Mamba1AttentionBackend": "vllm.v1.attention.backends.mamba1_attn:Mamba1AttentionBackend",
}


class VmmStub:
    """Stands in for kvcached's compiled ``vmm_ops``: meta-tensor pools, calls recorded."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("kvcached.vmm_ops")

        def ok(*args: Any, **kwargs: Any) -> bool:
            return True

        for name in (
            "init_kvcached",
            "shutdown_kvcached",
            "kv_tensors_created",
            "map_to_kv_tensors",
            "unmap_from_kv_tensors",
            "map_to_kv_tensors_with_result",
            "prepare_unmap_from_kv_tensors",
            "commit_unmap_from_kv_tensors",
            "abort_unmap_from_kv_tensors",
        ):
            setattr(mod, name, ok)
        mod.create_kv_tensors = self.create_kv_tensors  # type: ignore[attr-defined]
        mod.PageAllocator = object  # type: ignore[attr-defined]
        mod.InternalPage = object  # type: ignore[attr-defined]
        return mod

    def create_kv_tensors(
        self,
        size: int,
        itemsize: int,
        device: str,
        num_layers: int,
        num_kv_buffers: int = 2,
        group_id: int = 0,
        unified_pool: bool = False,
    ) -> list[torch.Tensor]:
        from kvcached.integration.vllm import interfaces as kvi

        contiguous = bool(kvi._contiguous_layout)
        self.calls.append(
            {
                "size": size,
                "itemsize": itemsize,
                "num_layers": num_layers,
                "num_kv_buffers": num_kv_buffers,
                "group_id": group_id,
                "unified_pool": unified_pool,
                "contiguous": contiguous,
            }
        )
        # the C++ side: one FTensor of size*num_layers bytes (contiguous), else one per layer
        if contiguous:
            return [torch.empty(size * num_layers, dtype=torch.uint8, device="meta")]
        return [torch.empty(size, dtype=torch.uint8, device="meta") for _ in range(num_layers)]


def _cls(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


def make_spec(data: dict[str, Any]) -> Any:
    kvi = importlib.import_module("vllm.v1.kv_cache_interface")
    kind = data["kind"]
    if kind == "UniformTypeKVCacheSpecs":
        return kvi.UniformTypeKVCacheSpecs(
            block_size=data["block_size"],
            kv_cache_specs={k: make_spec(v) for k, v in data["kv_cache_specs"].items()},
        )
    if kind == "MambaSpec":
        return kvi.MambaSpec(
            block_size=data["block_size"],
            shapes=tuple(tuple(s) for s in data["shapes"]),
            dtypes=tuple(_dtype(d) for d in data["dtypes"]),
            page_size_padded=data.get("page_size_padded"),
        )
    common = {
        "block_size": data["block_size"],
        "num_kv_heads": data["num_kv_heads"],
        "head_size": data["head_size"],
        "dtype": _dtype(data["dtype"]),
        "page_size_padded": data.get("page_size_padded"),
        "indexes_kv_by_block_stride": data.get("indexes_kv_by_block_stride", False),
    }
    assert data.get("kv_quant_mode", "NONE") == "NONE", data
    if kind == "FullAttentionSpec":
        return kvi.FullAttentionSpec(
            **common,
            head_size_v=data.get("head_size_v"),
            sliding_window=data.get("sliding_window"),
            attention_chunk_size=data.get("attention_chunk_size"),
        )
    if kind == "SlidingWindowSpec":
        return kvi.SlidingWindowSpec(
            **common, sliding_window=data["sliding_window"], head_size_v=data.get("head_size_v")
        )
    if kind == "MLAAttentionSpec":
        return kvi.MLAAttentionSpec(**common, cache_dtype_str=data.get("cache_dtype_str"))
    raise SystemExit(f"unhandled spec kind {kind}")


def make_config(doc: dict[str, Any], drop: set[str]) -> Any:
    kvi = importlib.import_module("vllm.v1.kv_cache_interface")
    cfg = doc["kv_cache_config"]
    return kvi.KVCacheConfig(
        num_blocks=cfg["num_blocks"],
        kv_cache_tensors=[
            kvi.KVCacheTensor(size=t["size"], shared_by=list(t["shared_by"]))
            for t in cfg["kv_cache_tensors"]
        ],
        kv_cache_groups=[
            kvi.KVCacheGroupSpec(
                layer_names=[n for n in g["layer_names"] if n not in drop],
                kv_cache_spec=make_spec(g["kv_cache_spec"]),
            )
            for g in cfg["kv_cache_groups"]
        ],
    )


class PoolRecorder:
    """Replaces ``ElasticBlockPool`` in ``vllm.v1.core.block_pool``; keeps its arguments."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, num_blocks: int, block_size: int, **kwargs: Any) -> None:
        PoolRecorder.seen.append({"num_blocks": num_blocks, "block_size": block_size, **kwargs})
        self.null_block = None


def scheduler_side(doc: dict[str, Any]) -> dict[str, Any]:
    """kvcached's patched coordinator set-up on the scheduler's config (no sharing layers)."""
    coordinator = importlib.import_module("vllm.v1.core.kv_cache_coordinator").KVCacheCoordinator
    block_pool_mod = importlib.import_module("vllm.v1.core.block_pool")
    cfg = make_config(doc, set(doc["runner_only_attn_layers"]))
    # the native pool's hash granularity is passed through unchanged (not recorded)
    block_size = cfg.kv_cache_groups[0].kv_cache_spec.block_size
    native = SimpleNamespace(enable_caching=False, hash_block_size=block_size)
    stand_in = SimpleNamespace(
        kv_cache_config=cfg, block_pool=native, vllm_config=None, single_type_managers=[]
    )
    PoolRecorder.seen.clear()
    saved = getattr(block_pool_mod, "ElasticBlockPool", None)
    block_pool_mod.ElasticBlockPool = PoolRecorder
    try:
        coordinator._setup_kvcached_coordinator(stand_in)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        block_pool_mod.ElasticBlockPool = saved
    (args,) = PoolRecorder.seen
    keep = ("num_blocks", "block_size", "cell_size", "num_layers", "num_kv_buffers")
    return {k: args[k] for k in keep}


def worker_side(doc: dict[str, Any], stub: VmmStub) -> dict[str, Any]:
    """kvcached's patched allocate + reshape on vLLM 0.24's V1 runner class."""
    runner_cls = importlib.import_module("vllm.v1.worker.gpu_model_runner").GPUModelRunner
    kvi = importlib.import_module("kvcached.integration.vllm.interfaces")
    kvi._created_kv_tensor_capacity.clear()
    cfg = make_config(doc, set())
    backends: dict[int, Any] = {
        a["kv_cache_group_id"]: _cls(BACKENDS[a["backend"]]) for a in doc["attn_groups"]
    }
    runner = object.__new__(runner_cls)
    runner.device = torch.device("cuda", 0)
    runner.kv_cache_config = cfg
    runner.cache_config = SimpleNamespace(cache_dtype=doc["cache_dtype"])
    runner.runner_only_attn_layers = set(doc["runner_only_attn_layers"])
    runner.shared_kv_cache_layers = dict(doc["shared_kv_cache_layers"])
    runner.attn_groups = [
        [SimpleNamespace(backend=backends[g])] if g in backends else []
        for g in range(len(cfg.kv_cache_groups))
    ]
    runner._kernel_block_sizes = list(doc["kernel_block_sizes"])
    stub.calls.clear()
    try:
        raw = runner._allocate_kv_cache_tensors(cfg)
        kv_caches = runner._reshape_kv_cache_tensors(raw, list(doc["kernel_block_sizes"]))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return _recorded(kv_caches, raw, set(doc["runner_only_attn_layers"]), stub)


def _recorded(
    kv_caches: dict[str, Any], raw: Any, runner_only: set[str], stub: VmmStub
) -> dict[str, Any]:
    """Every tensor-backed layer's view; each runner-only (sharing) layer as the tensor-backed
    layers whose tensor object it *is* (kvcached binds layer ``i`` of homogeneous groups to the
    very same raw tensor, so there may be several)."""
    pools = _pool_tensors(raw)
    storages = {p.untyped_storage()._cdata: i for i, p in enumerate(pools)}
    views: dict[str, Any] = {}
    for name, value in kv_caches.items():
        if name in runner_only:
            views[name] = {
                "alias_of": sorted(
                    n for n, t in kv_caches.items() if t is value and n not in runner_only
                )
            }
        elif isinstance(value, torch.Tensor):
            views[name] = _view(value, storages)
        else:  # Mamba: a list of state tensors
            for k, state in enumerate(value):
                views[f"{name}#{k}"] = _view(state, storages)
    (call,) = stub.calls
    return {
        "create_kv_tensors": {k: v for k, v in call.items() if k != "contiguous"},
        "pools": [p.untyped_storage().nbytes() for p in pools],
        "views": views,
    }


def per_layer_side(doc: dict[str, Any], stub: VmmStub) -> dict[str, Any]:
    """kvcached's vLLM 0.8 binding (``patch_initialize_kv_cache``) on the same model.

    vLLM 0.8 had no cross-layer sharing and one ``KVCacheTensor`` per layer
    (``kv_cache_config.tensors``): the tensor-backed layers are fed in that form; its
    ``bind_kv_cache`` call is replaced by a recorder of the dict kvcached hands it.
    """
    patches = importlib.import_module("kvcached.integration.vllm.patches")
    kvi = importlib.import_module("kvcached.integration.vllm.interfaces")
    v1_utils = importlib.import_module("vllm.v1.utils")
    kvi._created_kv_tensor_capacity.clear()
    runner_only = set(doc["runner_only_attn_layers"])
    cfg = make_config(doc, runner_only)
    tensors = {n: t for t in cfg.kv_cache_tensors for n in t.shared_by}
    cfg08 = SimpleNamespace(
        num_blocks=cfg.num_blocks, kv_cache_groups=cfg.kv_cache_groups, tensors=tensors
    )
    first = next(a for a in doc["attn_groups"] if a["kv_cache_group_id"] == 0)

    class Runner08:
        def initialize_kv_cache(self, kv_cache_config: Any) -> None:
            raise AssertionError("kvcached's patch did not take over")

    assert patches.GPUModelRunnerPatch().patch_initialize_kv_cache(Runner08)
    runner = Runner08()
    runner.device = torch.device("cuda", 0)  # type: ignore[attr-defined]
    runner.attn_backend = _cls(BACKENDS[first["backend"]])  # type: ignore[attr-defined]
    runner.cache_config = SimpleNamespace(cache_dtype=doc["cache_dtype"])  # type: ignore[attr-defined]
    runner.kv_caches = []  # type: ignore[attr-defined]
    runner.vllm_config = SimpleNamespace(  # type: ignore[attr-defined]
        compilation_config=SimpleNamespace(static_forward_context={})
    )
    bound: dict[str, Any] = {}
    saved = getattr(v1_utils, "bind_kv_cache", None)
    v1_utils.bind_kv_cache = lambda kv_caches, *a, **k: bound.update(kv_caches)
    stub.calls.clear()
    try:
        runner.initialize_kv_cache(cfg08)
        if not all(isinstance(t, torch.Tensor) for t in bound.values()):
            raise TypeError(
                "bound objects that are not tensors: " + repr(set(map(type, bound.values())))
            )
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        if saved is None:
            del v1_utils.bind_kv_cache
        else:
            v1_utils.bind_kv_cache = saved
    return _recorded(bound, [bound[n] for n in bound], set(), stub)


def _pool_tensors(raw: Any) -> list[torch.Tensor]:
    """The raw pools kvcached created (the reshape input is views or the raw list)."""
    if isinstance(raw, tuple):  # HYBRID_LINEAR: (kv_tensors, raw_info)
        raw = raw[0]
    seen: dict[int, torch.Tensor] = {}
    for t in raw:
        seen.setdefault(t.untyped_storage()._cdata, t)
    return list(seen.values())


def _view(t: torch.Tensor, storages: dict[int, int]) -> dict[str, Any]:
    return {
        "pool": storages[t.untyped_storage()._cdata],
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "offset_bytes": t.storage_offset() * t.element_size(),
    }


def record(doc: dict[str, Any], stub: VmmStub, device_bytes: int) -> dict[str, Any]:
    kvi = importlib.import_module("kvcached.integration.vllm.interfaces")
    bau = importlib.import_module("vllm.v1.attention.backends.utils")
    bau.set_kv_cache_layout(doc["kv_cache_layout"])  # the fixture's VLLM_KV_CACHE_LAYOUT
    torch.cuda.get_device_properties = lambda *a, **k: SimpleNamespace(total_memory=device_bytes)
    torch.cuda.is_available = lambda: True
    kvi._kvcached_initialized = True
    kvi._world_size = 1
    kvi.init_kvcached = lambda *a, **k: None  # the scheduler side's (IPC) start-up
    out: dict[str, Any] = {}
    for layout, contiguous in (("noncontiguous", False), ("contiguous", True)):
        kvi._contiguous_layout = contiguous
        out[layout] = {"scheduler": scheduler_side(doc), "worker": worker_side(doc, stub)}
    kvi._contiguous_layout = False  # v0.8's alloc_kv_cache, non-contiguous
    out["per-layer"] = {"worker": per_layer_side(doc, stub)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvcached-src", type=Path, required=True)
    ap.add_argument("--legacy", type=Path, default=ROOT / "tests" / "data" / "legacy")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "kvcached")
    ap.add_argument("--device-mib", type=int, default=512)
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()

    stub = VmmStub()
    sys.modules["kvcached.vmm_ops"] = stub.module()
    sys.path.insert(0, str(args.kvcached_src.resolve()))
    platforms = importlib.import_module("vllm.platforms")
    cpu = importlib.import_module("vllm.platforms.cpu").CpuPlatform
    if not isinstance(platforms._current_platform, cpu):
        platforms._current_platform = cpu()
    vllm = importlib.import_module("vllm")
    patches = importlib.import_module("kvcached.integration.vllm.patches")
    assert patches.GPUModelRunnerPatch().apply(
        importlib.import_module("vllm.v1.worker.gpu_model_runner")
    ), "kvcached did not patch GPUModelRunner"
    assert patches.KVCacheCoordinatorPatch().apply(
        importlib.import_module("vllm.v1.core.kv_cache_coordinator")
    ), "kvcached did not patch KVCacheCoordinator"
    version = next(  # the sdist's own metadata (kvcached.__version__ needs an install)
        line.split(":", 1)[1].strip()
        for line in (args.kvcached_src / "PKG-INFO").read_text().splitlines()
        if line.startswith("Version:")
    )
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.names or sorted(p.stem for p in args.legacy.glob("*.json"))
    for name in names:
        doc = json.loads((args.legacy / f"{name}.json").read_text())
        data = {
            "format": FORMAT,
            "fixture": name,
            "kvcached_version": version,
            "vllm_version": vllm.__version__,
            "torch_version": torch.__version__,
            "tool": "tools/make_kvcached_fixtures.py",
            "device_total_memory": args.device_mib * MiB,
            "page_size": importlib.import_module("kvcached.utils").PAGE_SIZE,
            "layouts": record(doc, stub, args.device_mib * MiB),
        }
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(data, indent=1) + "\n")
        summary = {
            k: v["worker"].get("error") or len(v["worker"]["views"])
            for k, v in data["layouts"].items()
        }
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {summary}")


if __name__ == "__main__":
    main()
