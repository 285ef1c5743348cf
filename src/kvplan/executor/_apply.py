"""``apply``: reserve, map, zero and wrap every pool of a plan, then build the tensors."""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Literal

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from kvplan.executor._bound import BoundKVCache
from kvplan.executor._memory import PoolMemory, Transaction, failure, map_chunks
from kvplan.executor._views import build_tensors
from kvplan.executor.backends import create_backend
from kvplan.executor.backends.base import Backend, next_pow2, round_up
from kvplan.planner import num
from kvplan.schemas.errors import Code, KVPlanError, error
from kvplan.schemas.loading import diagnostics_from_validation
from kvplan.schemas.plan import BindingPlan

EAGER_CHUNK_BYTES = 128 << 20
"""Default physical chunk of eager mode (128 MiB, capped per pool by the pool's reservation).

Mapping cost grows with the number of chunks, not bytes: on an H200, 2 MiB chunks bind at
about 21 ms per GiB (a 72 GiB cache: about 1.5 s) while 128 MiB chunks map at about 1,250 GiB/s
(docs/performance.md). Elastic mode defaults to the backend's granularity instead (2 MiB on
CUDA, the page size on host-vmm), so memory follows the blocks in use at the finest step."""

MAX_EAGER_POOL_CHUNKS = 4096
"""Most chunks the eager default maps per pool: a pool above 4096 x 128 MiB (512 GiB) gets
larger chunks, so binding any pool takes at most this many mappings and its bookkeeping
(and the time to bind it) does not grow with its size."""
MAX_CHUNKS = 1 << 20
"""Most chunks one eager ``apply`` maps with an explicit ``chunk_size`` (1,048,576: 2 TiB of
2 MiB chunks); a plan that needs more is refused (``KVP420``) before anything is reserved."""

Mode = Literal["eager", "elastic"]


def apply(
    plan: BindingPlan,
    *,
    backend: str | Backend = "cuda-vmm",
    device: str | None = None,
    mode: Mode = "eager",
    chunk_size: int | None = None,
    **options: Any,
) -> BoundKVCache:
    """Bind ``plan``: one reservation per pool, views over it, aliases as shared objects.

    ``backend``: a registered name (``meta``, ``torch``, ``host-vmm``, ``cuda-vmm``) or a
    :class:`~kvplan.executor.backends.base.Backend` instance (not closed by the cache).
    ``mode``: ``eager`` maps and zeroes every pool now; ``elastic`` reserves address space
    only and maps blocks on :meth:`BoundKVCache.ensure_mapped`. ``chunk_size``: bytes per
    physical allocation, rounded up to the backend granularity; ``None`` (the default) picks
    per mode: eager :data:`EAGER_CHUNK_BYTES` (capped per pool by its reservation, so a small
    pool is one chunk), elastic the backend granularity. ``options`` go to the backend
    factory. A failed primitive undoes everything done so far and raises
    ``KVPlanError`` ``KVP402``; an unusable backend raises ``KVP401``.

    The plan is validated first, exactly as ``kvplan validate`` does: a plan with any error
    (malformed fields ``KVP004``, overlapping or duplicate views, alias chains or cycles,
    duplicate pools, out-of-bounds views...) raises ``KVPlanError`` with validate's codes
    before any memory is touched.
    """
    if not isinstance(mode, str) or mode not in ("eager", "elastic"):
        raise KVPlanError(
            error(Code.UNKNOWN_ENUM, "mode", f"Unknown mode {mode!r}.", "use eager or elastic")
        )
    if chunk_size is not None and (
        not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size <= 0
    ):
        raise KVPlanError(
            error(
                Code.SCHEMA,
                "chunk_size",
                f"chunk_size must be a positive integer (bytes), got {_brief(chunk_size)}.",
                "pass a byte count such as 2 << 20, or None for the mode's default",
            )
        )
    plan = checked_plan(plan)
    import torch  # noqa: F401 - load it before anything is timed or reserved

    owns = isinstance(backend, str)
    be = create_backend(backend, device=device, **options) if isinstance(backend, str) else backend
    try:
        return _apply(plan, be, mode, chunk_size, owns)
    except BaseException:
        if owns:
            be.close()
        raise


def _apply(
    plan: BindingPlan, be: Backend, mode: str, chunk_size: int | None, owns: bool
) -> BoundKVCache:
    if mode == "elastic" and be.reserve_commits:
        raise KVPlanError(
            error(
                Code.BACKEND_UNAVAILABLE,
                "mode",
                f"Backend {be.name!r} commits all memory up front and cannot run elastic mode.",
                "use --backend host-vmm or cuda-vmm for elastic mode, or --mode eager",
            )
        )
    clock = time.perf_counter
    t0 = clock()
    timings: dict[str, float] = {}
    txn = Transaction(be)
    memory: dict[str, PoolMemory] = {}
    try:
        txn.at("granularity", "", 0, 0)
        gran = be.granularity()
        chunk, cap = default_chunk(mode, chunk_size, gran)
        pool_chunks = [
            pool_chunk(chunk, cap, round_up(p.size_bytes, gran), gran) for p in plan.pools
        ]
        if mode == "eager" and not be.reserve_commits:
            _check_chunk_count(plan, pool_chunks, gran)
        for pool, pool_chunk_bytes in zip(plan.pools, pool_chunks, strict=True):
            reserved = round_up(pool.size_bytes, gran)
            address = 0
            if reserved:
                txn.at("reserve", pool.name, 0, reserved)
                align = max(pool.alignment_bytes, gran, min(pool_chunk_bytes, next_pow2(reserved)))
                address = be.reserve(reserved, next_pow2(align))
                txn.did("free", partial(be.free, address, reserved))
            memory[pool.name] = PoolMemory(
                pool.name, pool.size_bytes, reserved, address, pool_chunk_bytes
            )
        if cap and pool_chunks:
            chunk = max(pool_chunks)
        t1 = clock()
        timings["reserve"] = (t1 - t0) * 1e3
        if mode == "eager" and not be.reserve_commits:
            for mem in memory.values():
                map_chunks(be, txn, mem, range(mem.num_chunks))
            if not be.fresh_memory_is_zero:
                txn.at("wait_zeroed", "", 0, 0)
                be.wait_zeroed()
        t2 = clock()
        timings["map"] = (t2 - t1) * 1e3
        pools = {}
        for mem in memory.values():
            txn.at("wrap", mem.name, 0, mem.size)
            pools[mem.name] = be.wrap(mem.address, mem.size) if mem.size else _empty(be)
        t3 = clock()
        timings["wrap"] = (t3 - t2) * 1e3
        tensors = build_tensors(plan, pools)
        timings["views"] = (clock() - t3) * 1e3
    except BaseException as exc:
        err = failure(txn, exc, be, "apply")
        if err is exc:
            raise
        raise err from exc
    if mode == "eager" and not be.reserve_commits:
        for mem in memory.values():
            mem.mapped.add_range(0, mem.num_chunks)
    timings["total"] = (clock() - t0) * 1e3
    return BoundKVCache(
        plan=plan,
        backend=be,
        mode=mode,
        pools=pools,
        tensors=tensors,
        memory=memory,
        chunk_bytes=chunk,
        owns_backend=owns,
        timings_ms=timings,
    )


def default_chunk(mode: str, chunk_size: int | None, granularity: int) -> tuple[int, bool]:
    """``(chunk bytes, capped per pool)`` for ``mode`` and the caller's ``chunk_size``.

    An explicit ``chunk_size`` is rounded up to ``granularity`` and used as is. ``None``:
    eager takes :data:`EAGER_CHUNK_BYTES` (rounded up), capped per pool by the pool's
    reservation; elastic takes ``granularity``.
    """
    if chunk_size is not None:
        return round_up(chunk_size, granularity), False
    if mode == "elastic":
        return granularity, False
    return round_up(EAGER_CHUNK_BYTES, granularity), True


def pool_chunk(chunk: int, capped: bool, reserved: int, granularity: int) -> int:
    """The chunk of one pool: ``chunk``; with the eager default (``capped``) at most the
    pool's reservation and large enough that the pool needs at most
    :data:`MAX_EAGER_POOL_CHUNKS` chunks."""
    if not capped or not reserved:
        return chunk
    least = round_up(-(-reserved // MAX_EAGER_POOL_CHUNKS), granularity)
    return min(max(chunk, least), reserved)


def _check_chunk_count(plan: BindingPlan, chunks: list[int], granularity: int) -> None:
    """``KVP420`` when binding every pool needs more than :data:`MAX_CHUNKS` mappings."""
    total = sum(
        -(-round_up(p.size_bytes, granularity) // c)
        for p, c in zip(plan.pools, chunks, strict=True)
    )
    if total > MAX_CHUNKS:
        biggest = max(plan.pools, key=lambda p: p.size_bytes)
        least = round_up(-(-sum(p.size_bytes for p in plan.pools) // MAX_CHUNKS), granularity)
        raise KVPlanError(
            error(
                Code.TOO_MANY_CHUNKS,
                "chunk_size",
                f"binding the plan's pools ({num(sum(p.size_bytes for p in plan.pools))} bytes, "
                f"the largest {biggest.name!r}) in chunks of {num(max(chunks))} bytes takes "
                f"{num(total)} mappings, more than kvplan makes in one apply "
                f"({num(MAX_CHUNKS)}).",
                f"pass a chunk size of at least {num(least)} bytes, or leave it out (the "
                "eager default grows with the pool)",
            )
        )


def checked_plan(plan: object) -> BindingPlan:
    """``plan`` re-validated field by field and by :func:`kvplan.planner.validate`'s rules.

    Raises ``KVPlanError`` with the same codes ``kvplan validate`` reports (``KVP004`` for
    a malformed field, e.g. a plan built with ``model_construct``).
    """
    from kvplan.planner import check_plan

    if not isinstance(plan, BindingPlan):
        raise KVPlanError(
            error(
                Code.SCHEMA,
                "plan",
                f"apply takes a BindingPlan, got {type(plan).__name__}.",
                "load the plan with kvplan.load_plan or build it with kvplan.plan",
            )
        )
    try:
        data = plan.model_dump(mode="python", warnings="none", round_trip=True)
        checked = BindingPlan.model_validate(data)
    except ValidationError as exc:
        raise KVPlanError(diagnostics_from_validation(exc, "plan")) from None
    except (TypeError, ValueError, AttributeError, PydanticSerializationError) as exc:
        raise KVPlanError(
            error(
                Code.SCHEMA,
                "plan",
                f"the plan's fields cannot be read ({type(exc).__name__}).",
                "build plans with kvplan.plan or load them with kvplan.load_plan",
            )
        ) from None
    errors = [d for d in check_plan(checked, granularity=0) if d.is_error]
    if errors:
        raise KVPlanError(errors)
    return checked


def _brief(value: object) -> str:
    text = repr(value) if not isinstance(value, int) else num(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _empty(be: Backend) -> Any:
    import torch

    return torch.empty(0, dtype=torch.int8, device=be.device)
