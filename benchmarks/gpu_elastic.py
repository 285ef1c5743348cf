#!/usr/bin/env python3
"""GPU check of kvplan's *elastic* mode under real kernels (one script, about two minutes).

Run from the repository root on a machine with an NVIDIA GPU, torch (CUDA) and cuda-python
(no vLLM needed):

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_elastic.py

and on the CPU, through host-vmm (the CPU twin of CUDA VMM, with smaller sizes), to debug it:

    python3 benchmarks/gpu_elastic.py --backend host-vmm --device cpu

kvplan need not be installed: ``src/`` and the repository root are put on ``sys.path``. Writes
``$OUT/gpu_elastic.json`` and ``$OUT/gpu_elastic_run.log`` (``OUT`` defaults to
``./gpu_elastic_out``) and exits 1 if any check fails; each check runs even when an earlier one
failed; the JSON is rewritten after every check, and checks not started within
``--budget-seconds`` (300) fail as not run. Subprocesses (the poison reads, the group members)
are this script run with ``--child``. ``--sizes gpu`` runs the GPU sizes on host-vmm (2 MiB
granularity) as a dry run.

Checks:

* ``environment``: versions, device, granularity, free memory.
* ``kernels``: vLLM 0.33's golden gemma-4-E2B plan (``tests/data/golden-vllm-0.33``),
  re-planned from its golden input at fewer blocks (3 GiB on a GPU), bound elastic
  (``unbacked="scratch"``) and, side by side, by the ``torch`` backend (eager). A seeded random
  sequence of steps releases finished "requests" (runs of blocks) and maps new ones; through
  the bound per-layer views ``[blocks, kv_heads, block_size, 2*head]`` it writes random K|V
  with ``index_copy_`` at the new block ids (each block belongs to one KV cache group, as in
  vLLM), gathers every live block back with ``index_select`` and runs
  ``scaled_dot_product_attention`` over the gathered K/V. Asserts: every live block equals the
  torch binding after every step (data survive the other blocks' unmaps), sdpa outputs are
  bit-equal, a block whose chunks were all unmapped reads zeros (scratch) and reads zeros again
  once remapped, never-mapped blocks read zeros, ``ensure_mapped`` returns the bytes the page
  index predicts, and on a GPU each map/unmap moves ``cuMemGetInfo`` by its bytes.
* ``group``: two subprocesses join one kvplan group (a budget of 1 GiB on a GPU), each binds a
  plan elastic and churns (asks for a grant, maps runs of blocks within it, releases) for
  ``--churn-seconds``. The parent samples, under the group's lock, Σ mapped bytes (each member
  writes its own), Σ granted (the ledger) and, on a GPU, the device's used memory against a
  baseline: never above the budget (the device figure plus a stated slack). Then, on a GPU, a
  map beyond the device's free memory (a plain torch allocation holds the rest): ``KVP402``,
  nothing left half-mapped.
* ``map_in_step``: ``ensure_mapped`` of 8 new blocks per step for 64 steps, cold (the step maps)
  against mapped ahead (an earlier untimed call mapped them), median/p99 µs and the ratio.
* ``beside``: the stand-in forward (square matmuls, a short and a long one) per step alone,
  after mapping the step's 8 new blocks, and with the next step's blocks mapped on a thread
  while it computes (what ``BackendInfo.maps_beside_compute`` claims for cuda-vmm): median
  step time, the maps' own time and the ratios.
* ``poison``: with ``unbacked="fault"`` a read of an unbacked block must kill the reader: a
  subprocess reads a mapped block (prints a marker) then an unmapped one (CUDA: an illegal
  address poisons the context; host-vmm: ``SIGSEGV``) and must fail, while a control
  subprocess that reads only the mapped block succeeds. Last, so that a fault that reached
  further than its own process could not spoil the other checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
GOLDEN = ROOT / "tests" / "data" / "golden-vllm-0.33" / "google__gemma-4-E2B-it"
"""vLLM 0.33's golden gemma-4-E2B (unpadded segments, kept fixed: ``examples/golden`` follows
the installed vLLM, whose 0.34 pads every layer's segment to 2 MiB)."""
SCRIPT = Path(__file__).resolve()

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
MEM_TOLERANCE = 8 * MiB
"""How far one map's or unmap's ``cuMemGetInfo`` change may be from its bytes (the figure
``benchmarks/gpu_check.py`` uses)."""
DRIVER_SLACK = 16 * MiB
"""Device memory a group check allows beyond the budget on top of each member's scratch granule
and null block: the driver's own page tables for the mappings."""


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What each check binds and how long it runs (the GPU sizes, or small ones on the CPU)."""

    kernel_blocks: int
    kernel_steps: int
    kernel_max_run: int
    kernel_live_cap: int
    poison_blocks: int
    group_budget: int
    member_blocks: int
    member_max_run: int
    churn_seconds: float
    chunk: int | None
    """Elastic chunk size (``None``: the backend granularity, 2 MiB on CUDA)."""
    child_timeout: float


GPU_SIZES = Sizes(
    kernel_blocks=32768,  # 3 GiB (96 KiB per block: 3 slots x 32 KiB)
    kernel_steps=40,
    kernel_max_run=512,
    kernel_live_cap=8192,
    poison_blocks=1024,
    group_budget=1 * GiB,
    member_blocks=16384,  # 1.5 GiB reserved per member: more than the budget
    member_max_run=1024,
    churn_seconds=10.0,
    chunk=None,
    child_timeout=90.0,
)
CPU_SIZES = Sizes(
    kernel_blocks=512,  # 48 MiB
    kernel_steps=12,
    kernel_max_run=16,
    kernel_live_cap=96,
    poison_blocks=256,
    group_budget=8 * MiB,
    member_blocks=256,  # 24 MiB reserved per member
    member_max_run=48,
    churn_seconds=3.0,
    chunk=64 * KiB,  # 2 blocks per chunk, so blocks share chunks as they do on a GPU
    child_timeout=120.0,
)
MAP_STEPS = 64
MAP_BLOCKS_PER_STEP = 8


# -- small helpers ---------------------------------------------------------------------------
class Run:
    """The run's settings and log (one per process)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.backend: str = args.backend
        self.device: str = args.device or ("cuda" if args.backend == "cuda-vmm" else "cpu")
        self.cuda = self.device.startswith("cuda")
        gpu = args.sizes == "gpu" or (args.sizes == "auto" and self.cuda)
        base = GPU_SIZES if gpu else CPU_SIZES
        churn = args.churn_seconds if args.churn_seconds is not None else base.churn_seconds
        self.sizes = dataclasses.replace(base, churn_seconds=churn)
        self.size_name = "gpu" if gpu else "cpu"
        self.seed: int = args.seed
        self.out = Path(os.environ.get("OUT") or args.out or "./gpu_elastic_out")
        self.log_file: Any = None

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if self.log_file is not None:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    def child_args(self) -> list[str]:
        return [
            sys.executable,
            str(SCRIPT),
            "--backend",
            self.backend,
            "--device",
            self.device,
            "--seed",
            str(self.seed),
            "--churn-seconds",
            str(self.sizes.churn_seconds),
            "--sizes",
            self.size_name,
        ]


def need(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def stats_us(samples_ns: list[int]) -> dict[str, float]:
    s = sorted(samples_ns)
    p99 = s[min(len(s) - 1, max(0, -(-99 * len(s) // 100) - 1))]
    return {
        "median_us": round(statistics.median(s) / 1e3, 2),
        "p99_us": round(p99 / 1e3, 2),
        "max_us": round(s[-1] / 1e3, 2),
        "n": len(s),
    }


_MODS: Any = None
ONE_THREAD = False
"""Set by :func:`main` for CPU runs."""


def mods() -> Any:
    """The modules the checks use, imported lazily (an import failure is a failed check)."""
    global _MODS
    if _MODS is not None:
        return _MODS
    import torch

    if ONE_THREAD:  # CPU runs: several intra-op threads on a loaded small machine: 10x slower
        torch.set_num_threads(1)

    from kvplan import plan as make_plan
    from kvplan.executor import apply
    from kvplan.executor.backends import backend_class
    from kvplan.schemas.errors import Code, KVPlanError
    from kvplan.schemas.loading import load_input, load_plan, parse_input

    _MODS = SimpleNamespace(
        torch=torch,
        apply=apply,
        backend_class=backend_class,
        Code=Code,
        KVPlanError=KVPlanError,
        make_plan=make_plan,
        load_input=load_input,
        load_plan=load_plan,
        parse_input=parse_input,
    )
    return _MODS


def make_backend(run: Run, unbacked: str) -> Any:
    options: dict[str, Any] = {"device": run.device, "unbacked": unbacked}
    if run.backend == "host-vmm":
        options["runs"] = False  # CUDA's path: one create/map/release per chunk
        if run.size_name == "gpu":
            options["granularity"] = 2 * MiB  # a dry run of the GPU sizes: CUDA's granularity
    return mods().backend_class(run.backend)(**options)


_BACKEND: Any = None


def shared_backend(run: Run) -> Any:
    """The parent's backend (``unbacked="scratch"``), made once."""
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = make_backend(run, "scratch")
    return _BACKEND


def chunk_bytes(run: Run, be: Any) -> int:
    """The elastic chunk ``apply`` uses: ``Sizes.chunk`` rounded up to the granularity."""
    gran = int(be.granularity())
    return -(-(run.sizes.chunk or gran) // gran) * gran


def sync(run: Run) -> None:
    if run.cuda:
        mods().torch.cuda.synchronize()


def free_memory(run: Run, be: Any) -> int | None:
    """``cuMemGetInfo``'s free bytes (after a synchronize), ``None`` on the CPU."""
    if not run.cuda:
        return None
    sync(run)
    free, _ = be.mem_info()
    return int(free)


_GOLDEN_INPUT: dict[str, Any] | None = None


def gemma_plan(num_blocks: int) -> Any:
    """The golden gemma-4-E2B plan at ``num_blocks`` blocks: kvplan plans the golden input with
    each KV cache tensor resized (layer-outermost: ``layer_stride = page x num_blocks``)."""
    global _GOLDEN_INPUT
    m = mods()
    if _GOLDEN_INPUT is None:
        _GOLDEN_INPUT = m.load_input(GOLDEN / "input.json").model_dump(mode="json")
    doc = json.loads(json.dumps(_GOLDEN_INPUT))
    config = doc["kv_cache_config"]
    config["num_blocks"] = num_blocks
    for tensor in config["kv_cache_tensors"]:
        page = tensor["block_stride"]
        tensor["layer_stride"] = page * num_blocks
        tensor["size"] = page * num_blocks * len(tensor["layers"])
    return m.make_plan(m.parse_input(doc, f"gemma-4-E2B at {num_blocks} blocks"))


def same_as_golden(plan: Any) -> dict[str, Any]:
    """The scaled plan differs from the golden plan only in its block count."""
    golden = mods().load_plan(GOLDEN / "plan.json")
    nb, gb = plan.pools[0].num_blocks, golden.pools[0].num_blocks
    need(len(plan.views) == len(golden.views), "view count differs from the golden plan")
    for a, b in zip(golden.views, plan.views, strict=True):
        same = (a.layer, a.group, a.kind, a.dtype, a.shape[1:], a.stride) == (
            b.layer,
            b.group,
            b.kind,
            b.dtype,
            b.shape[1:],
            b.stride,
        )
        need(same and b.shape[0] == nb, f"{b.layer}: differs from the golden view")
        need(a.offset_bytes * nb == b.offset_bytes * gb, f"{b.layer}: offset not scaled")
    need(
        [(x.layer, x.target) for x in plan.aliases]
        == [(x.layer, x.target) for x in golden.aliases],
        "aliases differ from the golden plan",
    )
    return {
        "golden_pool_bytes": golden.pools[0].size_bytes,
        "golden_blocks": gb,
        "views": len(plan.views),
        "aliases": len(plan.aliases),
        "groups": len({v.group for v in plan.views}),
    }


def group_layers(plan: Any) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for v in plan.views:
        out.setdefault(v.group, []).append(v)
    return out


def page_bytes(plan: Any) -> int:
    pages = {v.stride[0] * v.itemsize for v in plan.views}
    need(len(pages) == 1, f"views have different page sizes: {pages}")
    return pages.pop()


class Chunks:
    """Block → chunks (memoised page index lookups) and the bytes new blocks would map."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.memo: dict[int, frozenset[tuple[str, int]]] = {}
        self.chunk = int(cache.chunk_bytes)
        need(cache.reserved_bytes % self.chunk == 0, "reservation is not whole chunks")

    def of(self, block: int) -> frozenset[tuple[str, int]]:
        got = self.memo.get(block)
        if got is None:
            per_pool = self.cache.page_index.block_chunks(block, self.chunk)
            got = frozenset((p, c) for p, cs in per_pool.items() for c in cs)
            self.memo[block] = got
        return got

    def mapped(self) -> set[tuple[str, int]]:
        return {(p, c) for p, cs in self.cache.mapped_chunk_ids().items() for c in cs}

    def new_bytes(self, blocks: Iterable[int]) -> int:
        now = self.mapped()
        want: set[tuple[str, int]] = set()
        for b in blocks:
            want |= self.of(b)
        return len(want - now) * self.chunk


def is_zero(t: Any) -> bool:
    torch = mods().torch
    flat = t.contiguous().view(torch.int16) if t.element_size() == 2 else t.contiguous()
    return int(flat.count_nonzero()) == 0


def bits_equal(a: Any, b: Any) -> bool:
    torch = mods().torch
    a, b = a.contiguous(), b.contiguous()
    if a.element_size() == 2:
        a, b = a.view(torch.int16), b.view(torch.int16)
    return bool(torch.equal(a, b))


# -- checks ----------------------------------------------------------------------------------
CHECKS: list[tuple[str, Callable[[Run, dict[str, Any]], None]]] = []


def check(fn: Callable[[Run, dict[str, Any]], None]) -> Callable[[Run, dict[str, Any]], None]:
    CHECKS.append((fn.__name__.removeprefix("check_"), fn))
    return fn


@check
def check_environment(run: Run, out: dict[str, Any]) -> None:
    m = mods()
    torch = m.torch
    be = shared_backend(run)
    out.update(
        python=platform.python_version(),
        torch=torch.__version__,
        backend=run.backend,
        device=run.device,
        granularity_bytes=be.granularity(),
        sizes=dataclasses.asdict(run.sizes),
        seed=run.seed,
    )
    if run.cuda:
        from importlib.metadata import version

        try:
            out["cuda_bindings"] = version("cuda-bindings")
        except Exception:
            out["cuda_bindings"] = "unknown"
        free, total = be.mem_info()
        out.update(
            torch_cuda=torch.version.cuda,
            device_name=torch.cuda.get_device_name(be.index),
            free_bytes=free,
            total_bytes=total,
        )


@check
def check_kernels(run: Run, out: dict[str, Any]) -> None:
    m = mods()
    torch = m.torch
    sz = run.sizes
    F = torch.nn.functional
    plan = gemma_plan(sz.kernel_blocks)
    out["plan"] = same_as_golden(plan)
    nb = sz.kernel_blocks
    be = shared_backend(run)
    groups = group_layers(plan)
    gids = sorted(groups)
    rng = random.Random(run.seed)
    gen = torch.Generator(device=be.device).manual_seed(run.seed)
    dev = be.device
    bpc = max(1, chunk_bytes(run, be) // page_bytes(plan))
    # blocks from `usable` on are never mapped (whole chunks): they must read zeros (scratch)
    usable = (nb - max(nb // 8, 2 * bpc)) // bpc * bpc
    need(usable > sz.kernel_max_run + 1, f"{nb} blocks are too few for chunks of {bpc} blocks")
    counts = {
        "steps": 0,
        "blocks_mapped": 0,
        "blocks_released": 0,
        "released_unmapped_read_zero": 0,
        "fresh_mapped_read_zero": 0,
        "released_then_remapped_read_zero": 0,
        "never_mapped_read_zero": 0,
        "sdpa_calls": 0,
        "live_blocks_verified": 0,
        "bytes_mapped": 0,
        "bytes_unmapped": 0,
    }
    mem_errors: list[int] = []
    with (
        m.apply(plan, backend=be, mode="elastic", chunk_size=sz.chunk) as ela,
        m.apply(plan, backend="torch", device=dev) as ref,
    ):
        ch = Chunks(ela)
        out["chunk_bytes"] = ch.chunk
        out["reserved_bytes"] = ela.reserved_bytes
        out["blocks_per_chunk"] = bpc
        need(ch.chunk == chunk_bytes(run, be), f"chunk {ch.chunk} != {chunk_bytes(run, be)}")
        need(ela.mapped_bytes == 0, "elastic apply mapped memory")
        if run.cuda:
            out["scratch_live"] = list(be.scratch_live())
        live: dict[int, int] = {}  # block -> its KV cache group
        requests: list[list[int]] = []
        written: set[int] = set()
        max_mapped = 0

        def read(cache: Any, layer: str, ids: list[int]) -> Any:
            idx = torch.tensor(ids, dtype=torch.long, device=dev)
            return cache.tensors[layer].index_select(0, idx)

        slots = [v.layer for v in groups[gids[0]]]  # one group's layers cover every slot

        def zero_block(b: int) -> bool:
            return all(is_zero(read(ela, layer, [b])) for layer in slots)

        def timed_mem(fn: Callable[[list[int]], int], blocks: list[int]) -> int:
            before = free_memory(run, be)
            moved = int(fn(blocks))
            after = free_memory(run, be)
            if before is not None and after is not None:
                mem_errors.append(abs(abs(before - after) - moved))
            return moved

        for step in range(sz.kernel_steps):
            # 1. finished requests: release their blocks (more when too many are live)
            n_fin = rng.randint(0, 2) if len(live) < sz.kernel_live_cap else len(requests) // 2
            gone: list[int] = []
            for _ in range(min(n_fin, len(requests))):
                gone += requests.pop(rng.randrange(len(requests)))
            if gone:
                unmapped = timed_mem(ela.release_blocks, gone)
                ref.release_blocks(gone)  # eager: nothing to do, same sequence of calls
                counts["bytes_unmapped"] += unmapped
                counts["blocks_released"] += len(gone)
                for b in gone:
                    del live[b]
                now = ch.mapped()
                dropped = [b for b in gone if not (ch.of(b) & now)]
                for b in dropped[:8]:
                    need(zero_block(b), f"step {step}: unmapped block {b} != 0")
                    counts["released_unmapped_read_zero"] += 1
            # 2. new requests: runs of free blocks, each block in one KV cache group
            new: list[int] = []
            for _ in range(rng.randint(1, 3)):
                length = rng.randint(1, sz.kernel_max_run)
                start = rng.randrange(1, usable - length)
                run_ids = [b for b in range(start, start + length) if b not in live]
                run_ids = [b for b in run_ids if b not in new]
                if run_ids:
                    requests.append(run_ids)
                    new += run_ids
            before_chunks = ch.mapped()
            fresh = [b for b in new if not (ch.of(b) & before_chunks)]
            predicted = ch.new_bytes(new)
            mapped = timed_mem(ela.ensure_mapped, new)
            ref.ensure_mapped(new)
            need(mapped == predicted, f"step {step}: mapped {mapped} != page index {predicted}")
            counts["bytes_mapped"] += mapped
            counts["blocks_mapped"] += len(new)
            max_mapped = max(max_mapped, ela.mapped_bytes)
            for b in fresh[:16]:
                need(zero_block(b), f"step {step}: fresh block {b} != 0")
                counts["fresh_mapped_read_zero"] += 1
                counts["released_then_remapped_read_zero"] += b in written
            for b in new:
                live[b] = gids[rng.randrange(len(gids))]
            # 3. write K|V through each new block's group's layers (both bindings)
            for g in gids:
                ids = [b for b in new if live[b] == g]
                if not ids:
                    continue
                idx = torch.tensor(ids, dtype=torch.long, device=dev)
                for v in groups[g]:
                    shape = (len(ids), *v.shape[1:])
                    data = torch.randn(shape, generator=gen, device=dev).to(ela.tensors[v.layer])
                    ela.tensors[v.layer].index_copy_(0, idx, data)
                    ref.tensors[v.layer].index_copy_(0, idx, data)
            written.update(new)
            # 4. every live block reads back what was written; sdpa over the gathered K/V
            for g in gids:
                ids = sorted(b for b, gg in live.items() if gg == g)
                if not ids:
                    continue
                for v in groups[g]:
                    a, r = read(ela, v.layer, ids), read(ref, v.layer, ids)
                    need(bits_equal(a, r), f"step {step}: {v.layer}: live blocks differ")
                    counts["live_blocks_verified"] += len(ids)
                    # [blocks, H, N, 2*head] -> [1, H, blocks*N, head] for K and for V
                    heads, c = a.shape[1], a.shape[3]
                    hd = c // 2

                    def kv(x: Any, h: int = heads, d: int = hd) -> tuple[Any, Any]:
                        seq = x.permute(1, 0, 2, 3).reshape(1, h, -1, 2 * d)
                        return seq[..., :d], seq[..., d:]

                    q_heads = 8 * heads
                    q = torch.randn((1, q_heads, 8, hd), generator=gen, device=dev).to(a.dtype)
                    (ka, va), (kr, vr) = kv(a), kv(r)
                    ex = (1, q_heads, ka.shape[2], hd)
                    oa = F.scaled_dot_product_attention(q, ka.expand(ex), va.expand(ex))
                    orf = F.scaled_dot_product_attention(q, kr.expand(ex), vr.expand(ex))
                    need(bool(torch.isfinite(oa).all()), f"step {step}: sdpa not finite")
                    need(bits_equal(oa, orf), f"step {step}: {v.layer}: sdpa outputs differ")
                    counts["sdpa_calls"] += 2
            # 5. never-mapped blocks read zeros
            now = ch.mapped()
            for _ in range(2):
                b = rng.randrange(usable, nb)
                need(not (ch.of(b) & now), f"block {b} above the used range is mapped")
                need(zero_block(b), f"step {step}: never-mapped {b} != 0")
                counts["never_mapped_read_zero"] += 1
            counts["steps"] += 1
        out["counts"] = counts
        out["max_mapped_bytes"] = max_mapped
        need(counts["released_then_remapped_read_zero"] > 0, "no block was released and remapped")
        need(counts["released_unmapped_read_zero"] > 0, "no release unmapped a whole block")
        if mem_errors:
            out["cuMemGetInfo_vs_mapped"] = {
                "calls": len(mem_errors),
                "max_abs_error_bytes": max(mem_errors),
                "tolerance_bytes": MEM_TOLERANCE,
            }
            need(max(mem_errors) <= MEM_TOLERANCE, f"cuMemGetInfo off by {max(mem_errors)} B")
        else:
            out["cuMemGetInfo_vs_mapped"] = "n/a on cpu (no device memory)"
        left = ela.release_blocks(range(nb))
        need(ela.mapped_bytes == 0, f"mapped {ela.mapped_bytes} after releasing all")
        out["released_at_end_bytes"] = left
    need(be.live().clean, f"resources left after close: {be.live()}")


# -- group: two members churn within one budget ---------------------------------------------
def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def child_member(run: Run, workdir: Path, name: str, seed: int) -> int:
    """Join the group, bind elastic, wait for ``go``, churn, leave; statuses in ``name.json``."""
    from kvplan.elastic.group import GroupMember, read_snapshot

    m = mods()
    sz = run.sizes
    status_path = workdir / f"{name}.json"
    st: dict[str, Any] = {
        "state": "starting",
        "mapped": 0,
        "granted": 0,
        "ops": 0,
        "grows": 0,
        "refused": 0,
        "shrinks": 0,
        "forced_shrinks": 0,
        "claims": 0,
        "max_mapped": 0,
        "violations": [],
        "errors": [],
    }
    be = make_backend(run, "scratch")
    plan = gemma_plan(sz.member_blocks)
    nb = sz.member_blocks
    cache = m.apply(plan, backend=be, mode="elastic", chunk_size=sz.chunk)
    ch = Chunks(cache)
    null_bytes = ch.new_bytes([0])
    budget = read_snapshot(workdir / "group").budget_bytes  # the parent set it
    member = GroupMember.join(
        workdir / "group",
        name,
        floor=null_bytes,
        guarantee=3 * budget // 8,
        ceiling=cache.reserved_bytes,
    )
    rng = random.Random(seed)
    live: set[int] = set()
    requests: list[list[int]] = []

    def status(state: str) -> None:
        st.update(
            state=state,
            mapped=cache.mapped_bytes,
            granted=member.granted,
            effective=member.effective_limit,
            max_mapped=max(st["max_mapped"], cache.mapped_bytes),
        )
        write_json_atomic(status_path, st)

    def shrink() -> None:
        blocks = requests.pop(rng.randrange(len(requests)))
        cache.release_blocks(blocks)
        live.difference_update(blocks)
        status("churn")  # what it maps now, before the grant shrinks
        member.release(cache.mapped_bytes)
        st["shrinks"] += 1

    try:
        status("ready")
        deadline = time.monotonic() + sz.child_timeout
        while not (workdir / "go").exists():
            need(time.monotonic() < deadline, "no go from the parent")
            time.sleep(0.01)
        member.acquire(null_bytes, timeout=10)  # the null block, as an engine's start-up
        cache.ensure_mapped([0])
        status("churn")
        end = time.monotonic() + sz.churn_seconds
        while time.monotonic() < end:
            st["ops"] += 1
            member.tick()
            while cache.mapped_bytes > member.effective_limit and requests:
                st["forced_shrinks"] += 1
                shrink()
            if requests and rng.random() < 0.4:
                shrink()
                continue
            length = rng.randint(1, sz.member_max_run)
            start = rng.randrange(1, nb - length)
            blocks = [b for b in range(start, start + length) if b not in live]
            if not blocks:
                continue
            more = ch.new_bytes(blocks)
            if not member.request(cache.mapped_bytes + more):
                st["refused"] += 1
                st["claims"] += member.claim > 0
                if requests:
                    shrink()  # as a scheduler preempts to make room
                time.sleep(0.002)
                continue
            got = cache.ensure_mapped(blocks)
            if got != more:
                st["violations"].append(f"mapped {got} != predicted {more}")
            if cache.mapped_bytes > member.granted:
                st["violations"].append(f"mapped {cache.mapped_bytes} > granted {member.granted}")
            live.update(blocks)
            requests.append(blocks)
            st["grows"] += 1
            status("churn")
            time.sleep(0.001)
        while requests:
            shrink()
        cache.release_blocks([0])
        status("released")
        member.give_back(0)
    except Exception as exc:
        st["errors"].append(f"{type(exc).__name__}: {exc}")
        st["traceback"] = traceback.format_exc()
    finally:
        member.leave()
        cache.close()
        st["live_after_close"] = str(be.live())
        be.close()
        status_state = "done" if not st["errors"] else "failed"
        st["state"] = status_state
        st["mapped"] = 0
        write_json_atomic(status_path, st)
    return 0 if not st["errors"] and not st["violations"] else 1


MEMBER_FIELDS = (
    "state",
    "ops",
    "grows",
    "refused",
    "shrinks",
    "forced_shrinks",
    "claims",
    "max_mapped",
    "violations",
    "errors",
    "live_after_close",
)


def launch_members(run: Run, workdir: Path) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = []
    for i in range(2):
        log = open(workdir / f"m{i}.log", "w")  # noqa: SIM115 - closed when the child ends
        procs.append(
            subprocess.Popen(
                [
                    *run.child_args(),
                    "--child",
                    "member",
                    "--workdir",
                    str(workdir),
                    "--name",
                    f"m{i}",
                    "--member-seed",
                    str(run.seed * 100 + i),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=ROOT,
            )
        )
        log.close()
    return procs


_GROUP_PRELAUNCH: tuple[Path, list[subprocess.Popen[str]]] | None = None


def group_workdir(run: Run) -> tuple[Path, list[subprocess.Popen[str]]]:
    """The group's directory with its budget set, and its two members started (they bind and
    then wait for ``go``)."""
    global _GROUP_PRELAUNCH
    if _GROUP_PRELAUNCH is not None:
        got, _GROUP_PRELAUNCH = _GROUP_PRELAUNCH, None
        return got
    from kvplan.elastic.group import set_budget

    workdir = Path(tempfile.mkdtemp(prefix="kvplan-gpu-elastic-"))
    set_budget(workdir / "group", run.sizes.group_budget, create=True)
    return workdir, launch_members(run, workdir)


@check
def check_group(run: Run, out: dict[str, Any]) -> None:
    from kvplan.elastic.group import GroupLock, GroupPaths, read_ledger, to_state

    sz = run.sizes
    be = shared_backend(run) if run.cuda else None
    workdir, procs = group_workdir(run)
    names = ["m0", "m1"]
    budget = sz.group_budget
    out["budget_bytes"] = budget
    try:
        deadline = time.monotonic() + sz.child_timeout
        while True:
            sts = [read_json(workdir / f"{n}.json") for n in names]
            if all(s is not None and s["state"] == "ready" for s in sts):
                break
            dead = [p.returncode for p in procs if p.poll() is not None]
            need(not dead, f"a member ended before it was ready: {_tails(workdir, names)}")
            need(time.monotonic() < deadline, f"members not ready: {_tails(workdir, names)}")
            time.sleep(0.05)
        granule = be.granularity() if be is not None else 0
        null_bytes = 3 * chunk_bytes(run, be) if be is not None else 0  # a chunk per slot
        slack = 2 * (granule + null_bytes) + DRIVER_SLACK if run.cuda else 0
        free0 = free_memory(run, be) if be is not None else None
        (workdir / "go").touch()
        paths = GroupPaths((workdir / "group").resolve())
        lock = GroupLock(paths, create=False)
        samples = 0
        max_mapped = max_granted = 0
        max_used: int | None = None
        max_used_over_granted: int | None = None
        over: list[str] = []
        t0 = time.monotonic()
        try:
            while any(p.poll() is None for p in procs):
                need(time.monotonic() - t0 < sz.churn_seconds + sz.child_timeout, "members hang")
                with lock.hold(5.0):
                    now = [read_json(workdir / f"{n}.json") or {} for n in names]
                    ledger = read_ledger(paths)
                    state = to_state(ledger) if ledger is not None else None
                    granted = (
                        sum(x.granted * x.factor for x in state.members.values()) if state else 0
                    )
                    free = free_memory(run, be) if be is not None else None
                mapped = sum(int(s.get("mapped", 0)) for s in now)
                samples += 1
                max_mapped, max_granted = max(max_mapped, mapped), max(max_granted, granted)
                if mapped > budget or granted > budget or mapped > granted:
                    over.append(f"mapped {mapped} granted {granted} budget {budget}")
                if free0 is not None and free is not None:
                    used = free0 - free
                    max_used = used if max_used is None else max(max_used, used)
                    excess = used - granted
                    if max_used_over_granted is None or excess > max_used_over_granted:
                        max_used_over_granted = excess
                    if used > budget + slack:
                        over.append(f"device used {used} > budget {budget} + slack {slack}")
                time.sleep(0.02)
        finally:
            lock.close()
        finals = {n: read_json(workdir / f"{n}.json") or {} for n in names}
        out.update(
            samples=samples,
            max_sum_mapped_bytes=max_mapped,
            max_sum_granted_bytes=max_granted,
            over_budget=over[:10],
            members={n: {k: s.get(k) for k in MEMBER_FIELDS} for n, s in finals.items()},
        )
        if run.cuda:
            out["device"] = {
                "baseline_free_bytes": free0,
                "max_used_over_baseline_bytes": max_used,
                "max_used_minus_sum_granted_bytes": max_used_over_granted,
                "slack_bytes": slack,
                "slack": "2 members x (scratch granule + null block: one chunk per layer slot) "
                "+ 16 MiB for the driver's page tables",
            }
        else:
            out["device"] = "skipped on cpu (no device memory to sample)"
        rcs = [p.wait() for p in procs]
        out["member_rc"] = rcs
        need(rcs == [0, 0], f"member exit codes {rcs}: {_tails(workdir, names)}")
        need(not over, f"over budget: {over[:3]}")
        need(samples >= 10, f"only {samples} samples")
        need(max_granted >= budget // 2, f"the churn never used half the budget ({max_granted})")
        for n, s in finals.items():
            need(s.get("grows", 0) > 0 and s.get("shrinks", 0) > 0, f"{n} did not churn: {s}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    out["beyond_free_memory"] = beyond_free_memory(run) if run.cuda else "skipped on cpu"


def _tails(workdir: Path, names: list[str]) -> dict[str, str]:
    out = {}
    for n in names:
        try:
            out[n] = (workdir / f"{n}.log").read_text()[-1500:]
        except OSError as exc:
            out[n] = str(exc)
    return out


def beyond_free_memory(run: Run) -> dict[str, Any]:
    """A plain torch allocation holds all but a margin of the free memory; mapping more than
    the margin fails with KVP402 and leaves nothing half-mapped (GPU only)."""
    m = mods()
    torch = m.torch
    be = shared_backend(run)
    sz = run.sizes
    plan = gemma_plan(sz.kernel_blocks)
    res: dict[str, Any] = {}
    with m.apply(plan, backend=be, mode="elastic", chunk_size=sz.chunk) as cache:
        cache.ensure_mapped([0])
        before = (cache.mapped_bytes, be.live(), cache.mapped_chunk_ids(), cache.mapped_blocks)
        torch.cuda.empty_cache()
        free = free_memory(run, be)
        assert free is not None
        hog = None
        for margin in (256 * MiB, 512 * MiB, 1 * GiB, 2 * GiB):
            try:
                hog = torch.empty(free - margin, dtype=torch.uint8, device=be.device)
                res["hog_margin_bytes"] = margin
                break
            except RuntimeError:  # torch.OutOfMemoryError
                torch.cuda.empty_cache()
        need(hog is not None, "could not allocate the hog")
        free_h = free_memory(run, be)
        assert free_h is not None
        want = cache.reserved_bytes - cache.mapped_bytes
        res.update(free_before_hog=free, free_with_hog=free_h, map_wants_bytes=want)
        try:
            need(free_h + 64 * MiB < want, f"free {free_h} leaves room for all {want} bytes")
            try:
                cache.ensure_mapped(range(sz.kernel_blocks))
                raise AssertionError("mapping beyond the free memory succeeded")
            except m.KVPlanError as exc:
                res["code"] = exc.code.value
                res["message"] = str(exc)[:500]
                need(exc.code == m.Code.DRIVER_CALL_FAILED, f"expected KVP402: {exc}")
            after = (cache.mapped_bytes, be.live(), cache.mapped_chunk_ids(), cache.mapped_blocks)
            need(after == before, f"half-mapped after the failure: {before} -> {after}")
            free_a = free_memory(run, be)
            assert free_a is not None
            res["free_after_failure"] = free_a
            need(abs(free_a - free_h) <= MEM_TOLERANCE, f"leak: free {free_h} -> {free_a}")
        finally:
            del hog
            torch.cuda.empty_cache()
        last = [sz.kernel_blocks - 1]  # in chunks nothing mapped yet
        predicted = Chunks(cache).new_bytes(last)
        got = cache.ensure_mapped(last)  # usable again once the memory is back
        res["mapped_after_hog_freed"] = got
        need(got == predicted > 0, f"mapped {got} (expected {predicted}) once the hog was freed")
        res["rolled_back_chunks"] = cache.rolled_back_chunks
    need(be.live().clean, f"resources left: {be.live()}")
    return res


# -- map in step: cold against mapped ahead --------------------------------------------------
@check
def check_map_in_step(run: Run, out: dict[str, Any]) -> None:
    m = mods()
    be = shared_backend(run)
    sz = run.sizes
    probe = gemma_plan(64)
    chunk = chunk_bytes(run, be)
    bpc = max(1, chunk // page_bytes(probe))
    nb = (MAP_STEPS * MAP_BLOCKS_PER_STEP + 1) * bpc
    plan = gemma_plan(nb)
    out.update(blocks=nb, blocks_per_chunk=bpc, chunk_bytes=chunk)

    def steps(pattern: str) -> list[list[int]]:
        k = MAP_BLOCKS_PER_STEP
        if pattern == "sequential":  # vLLM's free queue of a fresh engine; block 0 is null
            return [[1 + i * k + j for j in range(k)] for i in range(MAP_STEPS)]
        return [[bpc * (1 + i * k + j) for j in range(k)] for i in range(MAP_STEPS)]

    arms: dict[str, Any] = {}
    for pattern in ("sequential", "strided"):
        kinds = ["cold", "ahead"] + (["ahead_chunks"] if pattern == "strided" and bpc > 1 else [])
        for kind in kinds:
            samples: list[int] = []
            mapped_steps = 0
            with m.apply(plan, backend=be, mode="elastic", chunk_size=sz.chunk) as cache:
                cache.ensure_mapped([0])  # the null block
                ch = Chunks(cache)
                gc.collect()
                gc.disable()
                try:
                    for blocks in steps(pattern):
                        if kind == "ahead":
                            cache.ensure_mapped(blocks)  # mapped ahead, untimed
                        elif kind == "ahead_chunks":  # another block of each chunk holds it
                            cache.ensure_mapped([b + 1 for b in blocks])
                        held = cache.mapped_bytes
                        predicted = ch.new_bytes(blocks)
                        t0 = time.perf_counter_ns()
                        got = cache.ensure_mapped(blocks)
                        samples.append(time.perf_counter_ns() - t0)
                        need(got == predicted, f"{pattern}/{kind}: mapped {got} != {predicted}")
                        need(cache.mapped_bytes == held + got, "mapped bytes do not add up")
                        if kind != "cold":
                            need(got == 0, f"{pattern}/{kind}: a step mapped {got} bytes")
                        mapped_steps += got > 0
                finally:
                    gc.enable()
                total = cache.mapped_bytes
                if pattern == "strided" and kind == "cold":
                    need(mapped_steps == MAP_STEPS, "a strided step mapped nothing")
            arms[f"{pattern}/{kind}"] = {
                **stats_us(samples),
                "steps_that_mapped": mapped_steps,
                "mapped_bytes_at_end": total,
            }
            run.log(f"  {pattern}/{kind}: {arms[f'{pattern}/{kind}']}")
    out["arms"] = arms
    ratios = {}
    for pattern in ("sequential", "strided"):
        cold, ahead = arms[f"{pattern}/cold"], arms[f"{pattern}/ahead"]
        ratios[pattern] = {
            "median_cold_over_ahead": round(cold["median_us"] / max(ahead["median_us"], 1e-3), 1),
            "p99_cold_over_ahead": round(cold["p99_us"] / max(ahead["p99_us"], 1e-3), 1),
        }
        if f"{pattern}/ahead_chunks" in arms:
            ratios[pattern]["median_cold_over_ahead_chunks"] = round(
                cold["median_us"] / max(arms[f"{pattern}/ahead_chunks"]["median_us"], 1e-3), 1
            )
    out["ratios"] = ratios
    need(be.live().clean, f"resources left: {be.live()}")


# -- beside: a step's maps on a thread while the device computes ----------------------------
BESIDE_STEPS = 48
BESIDE_MATMULS = (8, 32)
"""Stand-in forwards: this many square matmuls (GPU: 4096 fp16, about 0.2 ms each on an
H100, so one shorter and one longer than a step's maps; CPU dry run: 192 fp32)."""


@check
def check_beside(run: Run, out: dict[str, Any]) -> None:
    """What elastic serving's busy map ahead relies on for cuda-vmm
    (``BackendInfo.maps_beside_compute``): a map made on another thread while the device
    computes does not lengthen the step. Per step (wall time, medians): ``compute`` -- the
    stand-in forward alone, launched and synchronized; ``in_step`` -- the step's 8 new blocks
    (each on a chunk of its own, as a fresh engine's) mapped first, then the forward;
    ``beside`` -- the forward launched, the *next* step's blocks mapped on a mapping thread
    (as ``WorkerSide.start_ahead``), then synchronize and join. ``map_us`` is how long the
    maps themselves took in each arm. On a GPU ``beside`` should sit near
    max(``compute``, ``map_us``) -- not their sum -- unless the driver's map calls wait for
    the device; on the CPU the maps and the matmuls share the cores (a dry run: its figures
    mean nothing). Two forwards: ``BESIDE_MATMULS`` (the top-level figures) and a longer one
    (``long_forward``)."""
    from concurrent.futures import ThreadPoolExecutor

    m = mods()
    torch = m.torch
    be = shared_backend(run)
    chunk = chunk_bytes(run, be)
    bpc = max(1, chunk // page_bytes(gemma_plan(64)))
    k = MAP_BLOCKS_PER_STEP
    plan = gemma_plan((3 * BESIDE_STEPS * k + 2) * bpc)
    side = 4096 if run.cuda else 192
    dtype = torch.float16 if run.cuda else torch.float32
    a = torch.randn(side, side, device=run.device, dtype=dtype) / side**0.5  # stays finite

    def forward(matmuls: int) -> None:
        x = a
        for _ in range(matmuls):
            x = x @ a
        if not run.cuda:
            float(x[0, 0])  # the CPU computes as it launches

    def blocks_of(arm: int, i: int) -> list[int]:  # fresh chunks for every arm and step
        return [bpc * (1 + (arm * BESIDE_STEPS + i) * k + j) for j in range(k)]

    def timed_map(cache: Any, blocks: list[int]) -> int:
        t0 = time.perf_counter_ns()
        cache.ensure_mapped(blocks)
        return time.perf_counter_ns() - t0

    def one_forward(matmuls: int) -> dict[str, Any]:
        arms: dict[str, Any] = {}
        for n, arm in enumerate(("compute", "in_step", "beside")):
            samples: list[int] = []
            maps: list[int] = []
            with m.apply(plan, backend=be, mode="elastic", chunk_size=run.sizes.chunk) as cache:
                cache.ensure_mapped([0])
                if arm == "beside":
                    cache.ensure_mapped(blocks_of(n, 0))  # the first step's, mapped before
                gc.collect()
                gc.disable()
                try:
                    for i in range(BESIDE_STEPS):
                        t0 = time.perf_counter_ns()
                        if arm == "in_step":
                            maps.append(timed_map(cache, blocks_of(n, i)))
                        forward(matmuls)
                        ahead = None
                        if arm == "beside" and i + 1 < BESIDE_STEPS:
                            ahead = mapper.submit(timed_map, cache, blocks_of(n, i + 1))
                        sync(run)
                        if ahead is not None:
                            maps.append(ahead.result())
                        samples.append(time.perf_counter_ns() - t0)
                finally:
                    gc.enable()
                if arm != "compute":
                    made = set(cache.mapped_blocks)
                    need(all(set(blocks_of(n, i)) <= made for i in range(BESIDE_STEPS)),
                         f"{arm}: a step's blocks were not mapped")  # fmt: skip
            arms[arm] = stats_us(samples)
            if maps:
                arms[arm]["map_us"] = stats_us(maps)["median_us"]
            run.log(f"  {matmuls} matmuls, {arm}: {arms[arm]}")
        base = max(arms["compute"]["median_us"], 1e-3)
        ratios = {a: round(arms[a]["median_us"] / base, 3) for a in ("in_step", "beside")}
        return {"arms": arms, "matmuls": matmuls, "median_over_compute": ratios}

    forward(BESIDE_MATMULS[0])
    sync(run)  # warm: cuBLAS handles, the allocator
    mapper = ThreadPoolExecutor(1, thread_name_prefix="kvplan-ahead-check")
    try:
        short = one_forward(BESIDE_MATMULS[0])
        long = one_forward(BESIDE_MATMULS[1])
    finally:
        mapper.shutdown()
    out.update(short, long_forward=long, blocks_per_step=k, blocks_per_chunk=bpc)
    out["matmul_side"] = side
    need(be.live().clean, f"resources left: {be.live()}")


# -- poison: unbacked="fault" kills the reader -----------------------------------------------
POISON_START = "POISON_READ_START"
POISON_RETURNED = "POISON_READ_RETURNED"
POISON_RAISED = "POISON_READ_RAISED"
CONTROL_OK = "CONTROL_READ_OK"


def child_poison(run: Run, which: str) -> int:
    m = mods()
    torch = m.torch
    plan = gemma_plan(run.sizes.poison_blocks)
    be = make_backend(run, "fault")
    cache = m.apply(plan, backend=be, mode="elastic", chunk_size=run.sizes.chunk)
    cache.ensure_mapped([0])
    t = cache.tensors[plan.views[0].layer]
    zeros = int(t[0].contiguous().view(torch.int16).count_nonzero())
    sync(run)
    print(f"{CONTROL_OK} nonzero={zeros}", flush=True)
    if which == "control":
        cache.close()
        be.close()
        return 0 if zeros == 0 else 1
    far = run.sizes.poison_blocks - 1
    print(POISON_START, flush=True)
    try:
        got = float(t[far].float().sum().item())
        sync(run)
    except Exception as exc:  # CUDA: the illegal address surfaces here
        print(f"{POISON_RAISED} {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        os._exit(3)  # the context is poisoned: no clean-up
    print(f"{POISON_RETURNED} {got}", flush=True)
    os._exit(0)


_PRELAUNCHED: dict[str, subprocess.Popen[str]] = {}


def launch_poison(run: Run, which: str) -> subprocess.Popen[str]:
    got = _PRELAUNCHED.pop(which, None)
    if got is not None:
        return got
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(
        [*run.child_args(), "--child", f"poison-{which}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


@check
def check_poison(run: Run, out: dict[str, Any]) -> None:
    res: dict[str, dict[str, Any]] = {}
    for which in ("control", "fault"):  # one after the other (the fault one last)
        p = launch_poison(run, which)
        try:
            so, se = p.communicate(timeout=run.sizes.child_timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        rc = p.returncode
        sig = signal.Signals(-rc).name if rc is not None and rc < 0 else None
        res[which] = {"rc": rc, "signal": sig, "stdout": so[-600:], "stderr_head": se[:600]}
    out.update(res)
    c, f = res["control"], res["fault"]
    need(c["rc"] == 0 and f"{CONTROL_OK} nonzero=0" in c["stdout"], f"control failed: {c}")
    need(f"{CONTROL_OK} nonzero=0" in f["stdout"], f"poison child never read its mapped block: {f}")
    need(POISON_START in f["stdout"], f"poison child did not reach the read: {f}")
    need(POISON_RETURNED not in f["stdout"], "an unbacked read under unbacked='fault' returned")
    need(f["rc"] != 0, f"poison child exited 0: {f}")
    if run.cuda:
        need(POISON_RAISED in f["stdout"] or f["rc"] < 0, f"poison child died otherwise: {f}")
        text = f["stdout"].lower()
        out["fault"]["illegal_address_reported"] = "illegal" in text
    else:
        need(f["rc"] == -signal.SIGSEGV, f"expected SIGSEGV, got rc {f['rc']}")


# -- main ------------------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--backend", default="cuda-vmm", choices=("cuda-vmm", "host-vmm"))
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: per backend)")
    p.add_argument("--seed", type=int, default=20260)
    p.add_argument("--churn-seconds", type=float, default=None)
    p.add_argument(
        "--sizes",
        default="auto",
        choices=("auto", "gpu", "cpu"),
        help="the GPU or the small CPU sizes (auto: by device)",
    )
    p.add_argument("--out", default=None, help="output directory (default: $OUT)")
    p.add_argument("--checks", default="", help="comma-separated subset of the checks")
    p.add_argument(
        "--budget-seconds",
        type=float,
        default=300.0,
        help="checks not started within this many seconds fail as not run",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--name", default=None, help=argparse.SUPPRESS)
    p.add_argument("--member-seed", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    global _GROUP_PRELAUNCH, ONE_THREAD
    args = parse(argv)
    run = Run(args)
    ONE_THREAD = not run.cuda
    if args.child in ("poison-control", "poison-fault"):
        return child_poison(run, args.child.removeprefix("poison-"))
    if args.child == "member":
        return child_member(run, Path(args.workdir), args.name, args.member_seed)
    run.out.mkdir(parents=True, exist_ok=True)
    run.log_file = open(run.out / "gpu_elastic_run.log", "w")  # noqa: SIM115 - whole run
    wanted = [c for c in args.checks.split(",") if c]
    checks = [(n, f) for n, f in CHECKS if not wanted or n in wanted]
    names = [n for n, _ in checks]
    if not run.cuda:  # no device memory to measure: start the subprocesses' imports early
        if "poison" in names:
            _PRELAUNCHED.update({w: launch_poison(run, w) for w in ("control", "fault")})
        if "group" in names:
            _GROUP_PRELAUNCH = group_workdir(run)
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "backend": run.backend,
        "device": run.device,
        "checks": {},
    }
    failed = []
    t_all = time.perf_counter()
    json_path = run.out / "gpu_elastic.json"
    try:
        for name, fn in checks:
            run.log(f"check {name} ...")
            t0 = time.perf_counter()
            data: dict[str, Any] = {}
            try:
                spent = t0 - t_all
                need(spent < args.budget_seconds, f"not run: {spent:.0f} s spent of the budget")
                fn(run, data)
                status = "ok"
            except BaseException as exc:  # one failure must not stop the others
                if isinstance(exc, KeyboardInterrupt):
                    raise
                data["error"] = f"{type(exc).__name__}: {exc}"[:4000]
                data["traceback"] = traceback.format_exc()
                status = "fail"
                failed.append(name)
            secs = round(time.perf_counter() - t0, 3)
            results["checks"][name] = {"status": status, "seconds": secs, **data}
            run.log(f"check {name}: {status} ({secs} s)")
            if status == "fail":
                run.log(data["traceback"])
            run.log(json.dumps({k: v for k, v in data.items() if k != "traceback"}, default=str))
            results["failed"] = failed
            json_path.write_text(json.dumps(results, indent=2, default=str))  # after each check
    finally:
        leftovers()
    results["failed"] = failed
    results["seconds"] = round(time.perf_counter() - t_all, 3)
    if _BACKEND is not None:
        try:
            _BACKEND.close()
        except Exception as exc:
            results["close_error"] = repr(exc)
    json_path.write_text(json.dumps(results, indent=2, default=str))
    ok = len(checks) - len(failed)
    run.log(f"done: {ok}/{len(checks)} checks ok; failed: {failed or 'none'}")
    run.log(f"wrote {json_path} ({results['seconds']} s)")
    return 1 if failed else 0


def leftovers() -> None:
    """End the subprocesses started early that no check collected."""
    procs = list(_PRELAUNCHED.values())
    _PRELAUNCHED.clear()
    workdir = None
    if _GROUP_PRELAUNCH is not None:
        workdir, members = _GROUP_PRELAUNCH
        procs += members
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
