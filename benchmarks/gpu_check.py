#!/usr/bin/env python3
"""GPU check of kvplan's cuda-vmm executor (one script, a few minutes, no vLLM needed).

Run from the repository root on a machine with an NVIDIA GPU, torch (CUDA) and cuda-python:

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py

kvplan need not be installed: ``src/`` (and the repo root, for the synthetic plans in
``tests/executor``) are put on ``sys.path`` here. Needs pydantic 2 and PyYAML. Writes
``$OUT/gpu_check.json`` and ``$OUT/gpu_check.log`` (``OUT`` defaults to ``./gpu_check_out``)
and exits 1 if any check fails; each check runs even when an earlier one failed.

Checks: cuda-vmm views against the torch backend (write/read pattern, verify); aliasing;
both pointer-wrapping routes; elastic map/unmap (mapped bytes vs the page index and
``cuMemGetInfo``); rollback under injected failures (no leak); map throughput against a
raw cuda-python create/map/set-access loop per chunk size (ratio kvplan/raw, target >= 0.9).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
OUT = Path(os.environ.get("OUT") or "./gpu_check_out")
OUT.mkdir(parents=True, exist_ok=True)
LOG = open(OUT / "gpu_check.log", "w")  # noqa: SIM115 - lives for the whole script

MiB = 1 << 20
GiB = 1 << 30
CHUNKS_MIB = (2, 8, 32, 128)
THROUGHPUT_BYTES = 4 * GiB
REPEATS = 3
THROUGHPUT_REPEATS = 6


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    LOG.write(line + "\n")
    LOG.flush()


CHECKS: list[tuple[str, Callable[[], dict[str, Any]]]] = []


def check(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    CHECKS.append((fn.__name__.removeprefix("check_"), fn))
    return fn


def need(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 3)


# -- lazily imported modules (so an import failure is a failed check, not a crash) ------
def mods() -> Any:
    import torch

    from harness.executor import _plans as plans
    from harness.executor._patterns import fill_pattern, vanilla
    from kvplan.executor import apply, verify
    from kvplan.executor.backends.cuda_vmm import CudaVmmBackend, load_driver
    from kvplan.executor.backends.faults import FaultyBackend
    from kvplan.planner.page_index import PageIndex

    class M:
        pass

    m = M()
    m.torch, m.apply, m.verify, m.Cuda, m.drv = torch, apply, verify, CudaVmmBackend, load_driver()
    m.Faulty, m.PageIndex, m.plans, m.fill, m.vanilla = (
        FaultyBackend,
        PageIndex,
        plans,
        fill_pattern,
        vanilla,
    )
    return m


_BACKEND: Any = None


def backend() -> Any:
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = mods().Cuda()
    return _BACKEND


# -- checks ----------------------------------------------------------------------------
@check
def check_environment() -> dict[str, Any]:
    m = mods()
    be = backend()
    drv = m.drv
    _, driver_version = drv.cuDriverGetVersion()
    free, total = be.mem_info()
    try:
        from importlib.metadata import version

        bindings = version("cuda-bindings")
    except Exception:
        bindings = "unknown"
    return {
        "python": platform.python_version(),
        "torch": m.torch.__version__,
        "torch_cuda": m.torch.version.cuda,
        "cuda_bindings": bindings,
        "driver_version": int(driver_version),
        "device": m.torch.cuda.get_device_name(be.index),
        "granularity_bytes": be.granularity(),
        "free_bytes": free,
        "total_bytes": total,
        "has_storage_from_pointer": hasattr(m.torch._C, "_construct_storage_from_data_pointer"),
    }


@check
def check_views_vs_torch() -> dict[str, Any]:
    m = mods()
    be = backend()
    torch = m.torch
    out: dict[str, Any] = {}
    cases = {
        "gemma-4-e2b-256MiB": m.plans.gemma_e2b_plan(),
        "llama-3.1-8b-1GiB": m.plans.llama_8b_plan(),
        "llama-kernel-split": m.plans.llama_plan(num_blocks=256, ratio=4),
        "llama-block-outermost": m.plans.llama_plan(num_blocks=256, layout="block"),
        "two-pools": m.plans.two_pool_plan(num_blocks=64),
    }
    for name, plan in cases.items():
        with (
            m.apply(plan, backend=be) as vmm,
            m.apply(plan, backend="torch", device=be.device) as ref,
        ):
            diags = m.verify(plan, vmm.tensors, pools=vmm.pools)
            need(not diags, f"{name}: verify: {[d.render() for d in diags[:3]]}")
            zero = all(int(p.count_nonzero()) == 0 for p in vmm.pools.values())
            need(zero, f"{name}: pools not zeroed after mapping")
            m.fill(plan, vmm.tensors)
            m.fill(plan, ref.tensors)
            torch.cuda.synchronize()
            same = all(torch.equal(vmm.pools[k], ref.pools[k]) for k in ref.pools)
            need(same, f"{name}: pool bytes differ from the torch backend")
            out[name] = {
                "views": len(plan.views),
                "aliases": len(plan.aliases),
                "pool_bytes": sum(p.size_bytes for p in plan.pools),
                "timings_ms": {k: round(v, 3) for k, v in vmm.timings_ms.items()},
            }
        need(be.live().clean, f"{name}: resources left after close: {be.live()}")
    # apply time vs the vanilla path (same process, median of REPEATS)
    for name in ("gemma-4-e2b-256MiB", "llama-3.1-8b-1GiB"):
        plan = cases[name]
        t: dict[str, list[float]] = {"vanilla": [], "torch": [], "cuda-vmm": []}
        for _ in range(REPEATS):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            raw, views = m.vanilla(plan, device=be.device)
            torch.cuda.synchronize()
            t["vanilla"].append(time.perf_counter() - t0)
            del raw, views
            torch.cuda.empty_cache()
            for kind, target in (("torch", "torch"), ("cuda-vmm", be)):
                t0 = time.perf_counter()
                cache = m.apply(plan, backend=target, device=be.device if kind == "torch" else None)
                torch.cuda.synchronize()
                t[kind].append(time.perf_counter() - t0)
                cache.close()
                torch.cuda.empty_cache()
        med = {k: median_ms(v) for k, v in t.items()}
        out[name]["apply_ms"] = med
        out[name]["ratio_vs_vanilla"] = {
            k: round(med[k] / med["vanilla"], 3) for k in ("torch", "cuda-vmm")
        }
    return out


@check
def check_aliasing() -> dict[str, Any]:
    m = mods()
    plans = m.plans
    plan = plans.gemma_plan(num_blocks=1024)
    with m.apply(plan, backend=backend()) as cache:
        pairs = [(a.layer, a.target) for a in plan.aliases]
        for k, (sharer, target) in enumerate(pairs):
            need(cache.tensors[sharer] is cache.tensors[target], f"{sharer} is not {target}")
            cache.tensors[sharer][k + 1, 0, 3, 5] = float(k + 1)
            got = float(cache.tensors[target][k + 1, 0, 3, 5])
            need(got == float(k + 1), f"write via {sharer} not visible via {target}")
        # groups overlay: slot 0 of the full group and of sliding group 1 are the same bytes
        full, sliding = cache.tensors[plans.layer_name(4)], cache.tensors[plans.layer_name(0)]
        full[7].fill_(3.0)
        m.torch.cuda.synchronize()
        need(bool((sliding[7] == 3.0).all()), "group overlay: block 7 differs")
    return {"aliases": len(pairs)}


@check
def check_wrap_routes() -> dict[str, Any]:
    m = mods()
    out = {}
    for route in ("storage", "cai"):
        be = m.Cuda(wrap_route=route)
        try:
            with m.apply(m.plans.gemma_plan(num_blocks=256), backend=be) as cache:
                pool = cache.pools["kv"]
                address = next(iter(be._reservations))
                need(pool.data_ptr() == address, f"{route}: not zero-copy")
                cache.tensors[m.plans.layer_name(0)][0, 0, 0, 0] = 1.0  # bf16 0x3f80
                need(pool[:2].tolist() == [-128, 63], f"{route}: write not visible in pool bytes")
                out[route] = "zero-copy"
        finally:
            be.close()
    return out


@check
def check_elastic() -> dict[str, Any]:
    m = mods()
    be = backend()
    torch = m.torch
    plan = m.plans.llama_8b_plan()  # 32 layers x 512 blocks x 64 KiB
    index = m.PageIndex(plan)
    steps = []
    with m.apply(plan, backend=be, mode="elastic") as cache:
        need(cache.mapped_bytes == 0, "elastic apply mapped memory")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free0, _ = be.mem_info()
        ptr = cache.tensors[m.plans.layer_name(31)].data_ptr()
        for blocks in (list(range(16)), list(range(100, 132)), [511]):
            mapped = cache.ensure_mapped(blocks)
            want = len(index.blocks_chunks(cache.mapped_blocks, cache.chunk_bytes)["kv"])
            need(cache.mapped_chunks["kv"] == want, f"chunks {cache.mapped_chunks} != {want}")
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            free, _ = be.mem_info()
            delta = free0 - free
            need(
                abs(delta - cache.mapped_bytes) <= 8 * MiB,
                f"free delta {delta} vs mapped {cache.mapped_bytes}",
            )
            for layer in (0, 31):
                t = cache.tensors[m.plans.layer_name(layer)][blocks[0] : blocks[-1] + 1]
                t.fill_(1.0)
                need(float(t.sum()) == t.numel(), "write/read on mapped blocks")
            steps.append(
                {
                    "blocks": len(blocks),
                    "newly_mapped": mapped,
                    "mapped": cache.mapped_bytes,
                    "free_delta": delta,
                }
            )
        t0 = time.perf_counter()
        unmapped = cache.release_blocks(range(512))
        release_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free_end, _ = be.mem_info()
        need(
            cache.mapped_bytes == 0 and abs(free_end - free0) <= 8 * MiB,
            "release did not return memory",
        )
        need(cache.tensors[m.plans.layer_name(31)].data_ptr() == ptr, "address moved")
        cache.ensure_mapped([5])
        need(
            float(cache.tensors[m.plans.layer_name(2)][5].abs().sum()) == 0,
            "remapped block not zero",
        )
    need(be.live().clean, f"left: {be.live()}")
    return {"steps": steps, "unmapped": unmapped, "release_ms": round(release_ms, 3)}


@check
def check_rollback() -> dict[str, Any]:
    m = mods()
    be = backend()
    torch = m.torch
    plan = m.plans.two_pool_plan(num_blocks=1024)  # 2 pools, several 2 MiB chunks
    probe = m.Faulty(be)
    m.apply(plan, backend=probe).close()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free0, _ = be.mem_info()
    n_apply = 0
    for n in range(probe.calls.total):
        faulty = m.Faulty(be, fail_at=n)
        try:
            cache = m.apply(plan, backend=faulty)
        except Exception as exc:
            need(
                getattr(exc, "code", None) is not None and exc.code.value == "KVP402",
                f"#{n}: {exc!r}",
            )
            n_apply += 1
        else:
            faulty.fail_at = None
            cache.close()
        need(be.live().clean, f"#{n}: left {be.live()}")
    # ensure_mapped transactions
    n_ensure = 0
    plan2 = m.plans.llama_plan(layers=4, num_blocks=256)
    for n in range(64):
        faulty = m.Faulty(be)
        with m.apply(plan2, backend=faulty, mode="elastic") as cache:
            cache.ensure_mapped([0])
            before = (cache.mapped_bytes, be.live())
            faulty.fail_at = faulty.calls.total + n
            try:
                cache.ensure_mapped([40, 200])
            except Exception as exc:
                need(exc.code.value == "KVP402", repr(exc))
                need((cache.mapped_bytes, be.live()) == before, f"ensure #{n} not rolled back")
                n_ensure += 1
            else:
                faulty.fail_at = None
                break
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free1, _ = be.mem_info()
    need(abs(free1 - free0) <= 4 * MiB, f"leak: free memory {free0} -> {free1}")
    need(be.live().clean, f"left: {be.live()}")
    return {
        "apply_failures_injected": n_apply,
        "ensure_failures_injected": n_ensure,
        "free_delta": free0 - free1,
    }


def raw_map(m: Any, size: int, chunk: int) -> tuple[float, float]:
    """The raw cuda-python loop: reserve; create/map/release per chunk; one set-access; memset.

    Returns ``(map_seconds, unmap_seconds)`` (the map phase includes set-access, memset and a
    synchronize, like kvplan's ``map`` timing).
    """
    drv, torch = m.drv, m.torch
    be = backend()
    ok = drv.CUresult.CUDA_SUCCESS

    def chk(res: Any) -> Any:
        err = res[0] if isinstance(res, tuple) else res
        if err != ok:
            raise RuntimeError(f"raw loop: {err}")
        return res[1] if isinstance(res, tuple) and len(res) > 1 else None

    ptr = int(chk(drv.cuMemAddressReserve(size, chunk, 0, 0)))
    stream = drv.CUstream(torch.cuda.current_stream().cuda_stream)
    t0 = time.perf_counter()
    for off in range(0, size, chunk):
        n = min(chunk, size - off)
        h = chk(drv.cuMemCreate(n, be._prop, 0))
        chk(drv.cuMemMap(ptr + off, n, 0, h, 0))
        chk(drv.cuMemRelease(h))
    chk(drv.cuMemSetAccess(ptr, size, be._access, 1))
    chk(drv.cuMemsetD8Async(ptr, 0, size, stream))
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    for off in range(0, size, chunk):
        chk(drv.cuMemUnmap(ptr + off, min(chunk, size - off)))
    t2 = time.perf_counter()
    chk(drv.cuMemAddressFree(ptr, size))
    return t1 - t0, t2 - t1


@check
def check_throughput() -> dict[str, Any]:
    m = mods()
    be = backend()
    plan = m.plans.whole_pool_plan(size=THROUGHPUT_BYTES, num_blocks=1)
    out: dict[str, Any] = {}
    for chunk_mib in CHUNKS_MIB:
        chunk = chunk_mib * MiB
        kv_map, kv_close, kv_total, raw_m, raw_u = [], [], [], [], []

        def kvplan_once(chunk: int = chunk) -> tuple[float, float, float]:
            t0 = time.perf_counter()
            cache = m.apply(plan, backend=be, chunk_size=chunk)
            total = time.perf_counter() - t0
            t1 = time.perf_counter()
            cache.close()
            return cache.timings_ms["map"] / 1e3, total, time.perf_counter() - t1

        kvplan_once()  # warm-up both paths
        raw_map(m, THROUGHPUT_BYTES, chunk)
        for i in range(THROUGHPUT_REPEATS):
            for which in ("kvplan", "raw") if i % 2 == 0 else ("raw", "kvplan"):
                if which == "kvplan":
                    a, b, c = kvplan_once()
                    kv_map.append(a)
                    kv_total.append(b)
                    kv_close.append(c)
                else:
                    a, b = raw_map(m, THROUGHPUT_BYTES, chunk)
                    raw_m.append(a)
                    raw_u.append(b)
        gib = THROUGHPUT_BYTES / GiB
        out[f"{chunk_mib}MiB"] = {
            "kvplan_map_ms": median_ms(kv_map),
            "kvplan_apply_ms": median_ms(kv_total),
            "kvplan_close_ms": median_ms(kv_close),
            "raw_map_ms": median_ms(raw_m),
            "raw_unmap_ms": median_ms(raw_u),
            "kvplan_GiBps": round(gib / statistics.median(kv_map), 2),
            "raw_GiBps": round(gib / statistics.median(raw_m), 2),
            "ratio_kvplan_over_raw": round(statistics.median(raw_m) / statistics.median(kv_map), 3),
        }
        log(f"  throughput {chunk_mib} MiB: {out[f'{chunk_mib}MiB']}")
    worst = min(v["ratio_kvplan_over_raw"] for v in out.values())
    out["worst_ratio"] = worst
    out["target_met"] = worst >= 0.9
    return out


def main() -> int:
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "checks": {}}
    failed = []
    t_all = time.perf_counter()
    for name, fn in CHECKS:
        log(f"check {name} ...")
        t0 = time.perf_counter()
        try:
            data = fn()
            status = "ok"
        except BaseException as exc:  # one failure must not stop the others
            if isinstance(exc, KeyboardInterrupt):
                raise
            data = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            status = "fail"
            failed.append(name)
        secs = round(time.perf_counter() - t0, 3)
        results["checks"][name] = {"status": status, "seconds": secs, **data}
        log(f"check {name}: {status} ({secs} s)")
        if status == "fail":
            log(data["traceback"])
        else:
            log(json.dumps(data, default=str)[:2000])
    results["failed"] = failed
    results["seconds"] = round(time.perf_counter() - t_all, 3)
    if _BACKEND is not None:
        _BACKEND.close()
    (OUT / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    log(f"done: {len(CHECKS) - len(failed)}/{len(CHECKS)} checks ok; failed: {failed or 'none'}")
    log(f"wrote {OUT / 'gpu_check.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
