#!/usr/bin/env python3
"""CUDA VMM costs of kvplan's cuda-vmm backend, next to kvcached's published per-2 MiB costs.

Run from the repository root on a machine with an NVIDIA GPU, torch (CUDA) and cuda-python:

    python3 benchmarks/bench_vmm_gpu.py                 # print the tables, write $OUT/*.json
    python3 benchmarks/bench_vmm_gpu.py --write-docs    # also replace the section in
                                                        # docs/performance.md

Measured in one run, on one device:

1. **Churn of 2 MiB chunks** through the backend's primitives: ``--chunks`` chunks of one
   reservation are created, mapped, released and granted access one by one, then unmapped one
   by one, ``--rounds`` times. Each driver call is timed on the host (``perf_counter_ns``
   around the cuda-python call, so a little Python overhead is included): µs per call
   (mean / p50 / p99), and per 2 MiB for a whole map (create + map + release + set-access)
   and a whole unmap.
2. **Elastic churn through the executor**: ``ensure_mapped`` / ``release_blocks`` of one block
   whose 2 MiB chunk is not mapped (includes zeroing the chunk, the synchronisations and the
   bookkeeping): µs per 2 MiB.
3. **Eager bind** of ``--eager-gib`` GiB (a Llama-8B-shaped plan) at 2 MiB chunks and at the
   eager default (128 MiB), against ``torch.zeros`` of the same bytes in the same run: ms per
   GiB and × ``torch.zeros`` (medians of ``--repeats``).
4. **Scratch reservation** (``unbacked="scratch"``): ``reserve`` + ``free`` of the same bytes,
   which maps one scratch granule over every granule: ms per GiB.

Without CUDA (torch sees no GPU, or cuda-python is missing) it exits 2 with one line saying
so: a benchmark that cannot measure must not look like one that passed. kvplan need not be
installed: ``src/`` and the repository root are put on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "src")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

MiB = 1 << 20
GiB = 1 << 30
CHUNK = 2 * MiB
DOCS = ROOT / "docs" / "performance.md"
START = "<!-- bench_vmm_gpu:start -->"
END = "<!-- bench_vmm_gpu:end -->"

KVCACHED_A100 = {  # ovg-project/kvcached benchmarks/bench_vmm/README.md, mean µs per 2 MiB page
    "cuMemCreate": 193.3,
    "cuMemMap": 1.45,
    "cuMemSetAccess": 36.0,
    "cuMemUnmap": 25.6,
}
KVCACHED_H100 = {  # kvcached benchmarks/bench_layout/H100_results.md, nsys total ÷ calls, µs
    "cuMemCreate": 28.0,
    "cuMemMap": 3.3,
    "cuMemSetAccess": 60.0,
    "cuMemUnmap": 42.0,
    "cuMemRelease": 23.0,
}
OPS = ("cuMemCreate", "cuMemMap", "cuMemRelease", "cuMemSetAccess", "cuMemUnmap")


class NoCuda(SystemExit):
    """Exit status 2 with a reason: the benchmark cannot run here."""


def require_cuda() -> None:
    """Fail loudly (exit 2) unless torch sees a CUDA device and cuda-python imports."""
    try:
        import torch
    except ImportError:
        _no_cuda("torch is not installed")
    if not torch.cuda.is_available():
        _no_cuda("torch sees no CUDA device (torch.cuda.is_available() is False)")
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        try:
            from cuda import cuda  # noqa: F401
        except ImportError:
            _no_cuda("cuda-python is not installed (no module cuda.bindings.driver)")


def _no_cuda(reason: str) -> None:
    print(f"bench_vmm_gpu: cannot run: {reason}. It needs an NVIDIA GPU.", file=sys.stderr)
    raise NoCuda(2)


def _stats(samples_us: list[float]) -> dict[str, float]:
    ordered = sorted(samples_us)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "mean": statistics.fmean(ordered),
        "p50": statistics.median(ordered),
        "p99": p99,
        "n": len(ordered),
    }


def churn(be: Any, chunks: int, rounds: int) -> dict[str, Any]:
    """Map and unmap ``chunks`` 2 MiB chunks one by one, ``rounds`` times; µs per call."""
    drv = be._drv
    samples: dict[str, list[float]] = {op: [] for op in OPS}
    per_map: list[float] = []
    per_unmap: list[float] = []
    size = chunks * CHUNK
    base = be.reserve(size, CHUNK)
    clock = time.perf_counter_ns
    try:
        for _ in range(rounds):
            for i in range(chunks):
                address = base + i * CHUNK
                t0 = clock()
                err, handle = drv.cuMemCreate(CHUNK, be._prop, 0)
                t1 = clock()
                (err2,) = drv.cuMemMap(address, CHUNK, 0, handle, 0)
                t2 = clock()
                (err3,) = drv.cuMemRelease(handle)
                t3 = clock()
                (err4,) = drv.cuMemSetAccess(address, CHUNK, be._access, 1)
                t4 = clock()
                if any(e != be._ok for e in (err, err2, err3, err4)):
                    raise RuntimeError(f"a map call failed: {(err, err2, err3, err4)}")
                samples["cuMemCreate"].append((t1 - t0) / 1e3)
                samples["cuMemMap"].append((t2 - t1) / 1e3)
                samples["cuMemRelease"].append((t3 - t2) / 1e3)
                samples["cuMemSetAccess"].append((t4 - t3) / 1e3)
                per_map.append((t4 - t0) / 1e3)
            be.synchronize()
            for i in range(chunks):
                t0 = clock()
                (err,) = drv.cuMemUnmap(base + i * CHUNK, CHUNK)
                t1 = clock()
                if err != be._ok:
                    raise RuntimeError(f"cuMemUnmap failed: {err}")
                samples["cuMemUnmap"].append((t1 - t0) / 1e3)
                per_unmap.append((t1 - t0) / 1e3)
    finally:
        be.free(base, size)
    return {
        "chunks": chunks,
        "rounds": rounds,
        "calls_us": {op: _stats(v) for op, v in samples.items()},
        "map_per_2mib_us": _stats(per_map),
        "unmap_per_2mib_us": _stats(per_unmap),
    }


def executor_churn(be: Any, chunks: int, rounds: int) -> dict[str, Any]:
    """``ensure_mapped``/``release_blocks`` of one block per 2 MiB chunk; µs per 2 MiB."""
    from harness.executor import _plans as plans
    from kvplan.executor import apply

    per_chunk_blocks = CHUNK // (64 << 10)  # llama_plan: 64 KiB per block and layer
    plan = plans.llama_plan(layers=1, num_blocks=chunks * per_chunk_blocks)
    maps: list[float] = []
    unmaps: list[float] = []
    clock = time.perf_counter_ns
    with apply(plan, backend=be, mode="elastic") as cache:
        if cache.chunk_bytes != CHUNK:
            raise RuntimeError(f"elastic chunk is {cache.chunk_bytes} B, expected 2 MiB")
        for _ in range(rounds):
            for i in range(chunks):
                t0 = clock()
                got = cache.ensure_mapped([i * per_chunk_blocks])
                maps.append((clock() - t0) / 1e3)
                if got != CHUNK:
                    raise RuntimeError(f"ensure_mapped mapped {got} B, expected one chunk")
            for i in range(chunks):
                t0 = clock()
                cache.release_blocks([i * per_chunk_blocks])
                unmaps.append((clock() - t0) / 1e3)
    return {"ensure_mapped_us": _stats(maps), "release_blocks_us": _stats(unmaps)}


def eager_bind(be: Any, gib: float, repeats: int) -> dict[str, Any]:
    """Apply a ``gib`` GiB plan eagerly at 2 MiB and at the default chunk, vs torch.zeros."""
    import torch

    from harness.executor import _plans as plans
    from kvplan.executor import EAGER_CHUNK_BYTES, apply

    plan = plans.llama_8b_plan(pool_bytes=int(gib * GiB))
    size = plan.pools[0].size_bytes
    arms: dict[str, list[float]] = {"torch.zeros": [], "2 MiB": [], "128 MiB (default)": []}
    clock = time.perf_counter
    for _ in range(repeats):
        for arm in arms:  # interleaved, so drift hits every arm alike
            torch.cuda.synchronize()
            t0 = clock()
            if arm == "torch.zeros":
                buf = torch.zeros(size, dtype=torch.int8, device=be.device)
                torch.cuda.synchronize()
                arms[arm].append((clock() - t0) * 1e3)
                del buf
                torch.cuda.empty_cache()
                continue
            chunk = CHUNK if arm == "2 MiB" else None
            cache = apply(plan, backend=be, chunk_size=chunk)
            torch.cuda.synchronize()
            arms[arm].append((clock() - t0) * 1e3)
            if chunk is None and cache.chunk_bytes != min(EAGER_CHUNK_BYTES, cache.reserved_bytes):
                raise RuntimeError(f"eager default chunk is {cache.chunk_bytes} B")
            cache.close()
    base = statistics.median(arms["torch.zeros"])
    out: dict[str, Any] = {"bytes": size, "repeats": repeats, "arms": {}}
    for arm, ms in arms.items():
        median = statistics.median(ms)
        out["arms"][arm] = {
            "median_ms": median,
            "ms_per_gib": median / (size / GiB),
            "x_torch_zeros": median / base if base else None,
            "samples_ms": ms,
        }
    return out


def scratch_reserve(gib: float, repeats: int, device: str | None) -> dict[str, Any]:
    """``reserve`` + ``free`` of ``gib`` GiB with ``unbacked="scratch"``: ms per GiB."""
    from kvplan.executor.backends.cuda_vmm import CudaVmmBackend

    be = CudaVmmBackend(device=device, unbacked="scratch")
    size = -(-int(gib * GiB) // CHUNK) * CHUNK
    times: list[float] = []
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            base = be.reserve(size, CHUNK)
            be.free(base, size)
            times.append((time.perf_counter() - t0) * 1e3)
        if be.scratch_live() != (0, 0) or not be.live().clean:
            raise RuntimeError(f"scratch left behind: {be.scratch_live()}, {be.live()}")
    finally:
        be.close()
    median = statistics.median(times)
    return {"bytes": size, "median_ms": median, "ms_per_gib": median / (size / GiB)}


def _f(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    """The docs/performance.md section (between the markers)."""
    env = result["environment"]
    churn_r, ex, eager, scratch = (
        result["churn"],
        result["executor"],
        result["eager"],
        result["scratch"],
    )
    lines = [
        "## CUDA VMM costs (`python benchmarks/bench_vmm_gpu.py`)",
        "",
        f"{env['gpu']}, driver {env['driver']}, torch {env['torch']}, "
        f"cuda-bindings {env['cuda_bindings']}; one run, {result['date']}. Churn of "
        f"{churn_r['chunks']} × 2 MiB chunks, {churn_r['rounds']} rounds; each driver call timed "
        "on the host. kvcached's published per-2 MiB costs next to them (A100: "
        "`benchmarks/bench_vmm`, mean of 4096 pages, one thread; H100: "
        "`benchmarks/bench_layout/H100_results.md`, nsys total ÷ calls inside vLLM):",
        "",
        "| call (per 2 MiB) | kvplan mean µs | p50 | p99 | kvcached A100 µs | kvcached H100 µs |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for op in OPS:
        s = churn_r["calls_us"][op]
        lines.append(
            f"| `{op}` | {_f(s['mean'])} | {_f(s['p50'])} | {_f(s['p99'])} | "
            f"{_f(KVCACHED_A100.get(op), 2)} | {_f(KVCACHED_H100.get(op))} |"
        )
    m, u = churn_r["map_per_2mib_us"], churn_r["unmap_per_2mib_us"]
    em, er = ex["ensure_mapped_us"], ex["release_blocks_us"]
    lines += [
        f"| a whole map (create + map + release + set-access) | {_f(m['mean'])} | "
        f"{_f(m['p50'])} | {_f(m['p99'])} | – | – |",
        f"| a whole unmap | {_f(u['mean'])} | {_f(u['p50'])} | {_f(u['p99'])} | – | – |",
        f"| `ensure_mapped` of one new 2 MiB chunk (executor: + zero, wait for it) | "
        f"{_f(em['mean'])} | {_f(em['p50'])} | {_f(em['p99'])} | – | – |",
        f"| `release_blocks` of one 2 MiB chunk (executor: sync + unmap) | "
        f"{_f(er['mean'])} | {_f(er['p50'])} | {_f(er['p99'])} | – | – |",
        "",
        f"Eager bind of a {eager['bytes'] / GiB:.2f} GiB Llama-8B-shaped plan "
        f"(median of {eager['repeats']}, arms interleaved):",
        "",
        "| chunk | median ms | ms per GiB | × torch.zeros |",
        "|---|---:|---:|---:|",
    ]
    for arm, a in eager["arms"].items():
        lines.append(
            f"| {arm} | {_f(a['median_ms'])} | {_f(a['ms_per_gib'])} | "
            f"{_f(a['x_torch_zeros'], 2)} |"
        )
    lines += [
        "",
        f'`unbacked="scratch"` reservation of {scratch["bytes"] / GiB:.2f} GiB (one scratch '
        f"granule mapped over every granule, then unmapped and freed): "
        f"{_f(scratch['median_ms'])} ms, {_f(scratch['ms_per_gib'])} ms per GiB.",
    ]
    return "\n".join(lines) + "\n"


def write_docs(section: str, path: Path = DOCS) -> None:
    """Replace the text between the markers in ``path`` (append the section if absent)."""
    text = path.read_text()
    block = f"{START}\n{section}{END}\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        text = head + block + tail.lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def environment() -> dict[str, Any]:
    import torch

    from kvplan.executor.backends.cuda_vmm import load_driver

    drv = load_driver()
    err, version = drv.cuDriverGetVersion()
    try:
        from importlib.metadata import version as dist_version

        bindings = dist_version("cuda-bindings")
    except Exception:
        bindings = "unknown"
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": f"{version // 1000}.{version % 1000 // 10}" if err == 0 else "unknown",
        "torch": torch.__version__,
        "cuda_bindings": bindings,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=1024, help="2 MiB chunks per churn round")
    parser.add_argument("--rounds", type=int, default=4, help="churn rounds")
    parser.add_argument("--eager-gib", type=float, default=8.0, help="eager bind size (GiB)")
    parser.add_argument("--repeats", type=int, default=5, help="eager bind repeats")
    parser.add_argument("--device", default=None, help="CUDA device (default: current)")
    parser.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    parser.add_argument("--docs", type=Path, default=DOCS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.chunks < 1 or args.rounds < 1 or args.repeats < 1 or not args.eager_gib > 0:
        parser.error("--chunks, --rounds, --repeats and --eager-gib must be positive")
    require_cuda()
    from kvplan.executor.backends.cuda_vmm import CudaVmmBackend

    out = Path(os.environ.get("OUT") or "./bench_vmm_gpu_out")
    out.mkdir(parents=True, exist_ok=True)
    be = CudaVmmBackend(device=args.device)
    try:
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "environment": environment(),
            "churn": churn(be, args.chunks, args.rounds),
            "executor": executor_churn(be, args.chunks, args.rounds),
            "eager": eager_bind(be, args.eager_gib, args.repeats),
            "scratch": scratch_reserve(args.eager_gib, args.repeats, args.device),
        }
        if not be.live().clean:
            raise RuntimeError(f"the benchmark leaked: {be.live()}")
    finally:
        be.close()
    result["kvcached"] = {"A100_bench_vmm": KVCACHED_A100, "H100_bench_layout": KVCACHED_H100}
    (out / "bench_vmm_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    section = markdown(result)
    print(section)
    if args.write_docs:
        write_docs(section, args.docs)
        print(f"wrote the section into {args.docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
