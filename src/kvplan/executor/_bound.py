"""``BoundKVCache``: the applied plan's tensors and the memory behind them."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvplan.executor._memory import (
    PoolMemory,
    Transaction,
    failure,
    map_chunks,
    run_span,
    unmap_calls,
    unmap_chunks,
    unmap_piece,
)
from kvplan.executor.backends.base import Backend, BackendCallError
from kvplan.schemas.errors import Code, KVPlanError, error
from kvplan.schemas.plan import BindingPlan
from kvplan.units import human_bytes

if TYPE_CHECKING:
    from torch import Tensor

    from kvplan.planner.page_index import PageIndex


class BoundKVCache:
    """Tensors bound per a plan, over pools the executor reserved and mapped.

    ``tensors``: layer → tensor (an alias maps to its target's very object); ``pools``:
    name → ``int8`` byte tensor. In ``elastic`` mode only the chunks of blocks passed to
    :meth:`ensure_mapped` are backed by memory; touching other bytes faults. :meth:`close`
    unmaps and frees everything: tensors obtained from this cache must not be used after.
    :meth:`ensure_mapped`, :meth:`release_blocks` and :meth:`close` take one lock, so one
    thread may map blocks ahead while another releases others or closes the cache (each call
    runs whole, never interleaved with another); the accounting properties read a consistent
    snapshot without it.
    """

    def __init__(
        self,
        *,
        plan: BindingPlan,
        backend: Backend,
        mode: str,
        pools: dict[str, Tensor],
        tensors: dict[str, Tensor],
        memory: dict[str, PoolMemory],
        chunk_bytes: int,
        owns_backend: bool,
        timings_ms: dict[str, float],
    ) -> None:
        self.plan = plan
        self.backend = backend
        self.mode = mode
        self.pools = pools
        self.tensors = tensors
        self.chunk_bytes = chunk_bytes
        self.timings_ms = timings_ms
        self._memory = memory
        self._owns_backend = owns_backend
        self._blocks: set[int] = set()
        self.rolled_back_chunks = 0
        """Chunks a failed :meth:`ensure_mapped` mapped and its rollback unmapped again (not
        counted as unmaps: no resident block ever used them)."""
        self._index: PageIndex | None = None
        self.closed = False
        self._closing = False
        self._backend_closed = False
        self._lock = threading.RLock()
        """Held by every call that changes what is mapped (see the class doc)."""

    # -- accounting -----------------------------------------------------------------------
    @property
    def reserved_bytes(self) -> int:
        """Address space reserved for all pools (bytes, rounded up to the granularity)."""
        return sum(m.reserved for m in self._memory.values())

    @property
    def mapped_bytes(self) -> int:
        """Bytes currently backed by physical memory across all pools."""
        if self.backend.reserve_commits:
            return 0 if self.closed else self.reserved_bytes
        return sum(m.mapped_bytes() for m in self._memory.values())

    @property
    def mapped_chunks(self) -> dict[str, int]:
        """Mapped chunk count per pool."""
        return {name: len(m.mapped) for name, m in self._memory.items()}

    def mapped_chunk_ids(self) -> dict[str, tuple[int, ...]]:
        """The mapped chunk numbers per pool, copied under the cache's lock: safe to call from
        another thread, e.g. a stats reporter, while one maps (it waits for that call)."""
        with self._lock:
            return {name: tuple(m.mapped) for name, m in self._memory.items()}

    @property
    def mapped_blocks(self) -> frozenset[int]:
        """Block ids made resident by :meth:`ensure_mapped` (elastic mode)."""
        return frozenset(self._blocks)

    @property
    def page_index(self) -> PageIndex:
        """The plan's page index (built on first use)."""
        if self._index is None:
            from kvplan.planner.page_index import PageIndex

            self._index = PageIndex(self.plan)
        return self._index

    def stats(self) -> dict[str, Any]:
        """Memory and timing figures (JSON-ready)."""
        return {
            "backend": self.backend.name,
            "device": self.backend.device,
            "mode": self.mode,
            "chunk_bytes": self.chunk_bytes,
            "reserved_bytes": self.reserved_bytes,
            "mapped_bytes": self.mapped_bytes,
            "mapped_blocks": len(self._blocks),
            "tensors": len(self.tensors),
            "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()},
        }

    # -- elastic --------------------------------------------------------------------------
    def _block_ids(self, block_ids: Iterable[int]) -> list[int]:
        if self.closed or self._closing:
            raise RuntimeError("the KV cache is closed")
        ids = list(dict.fromkeys(int(b) for b in block_ids))
        index = self.page_index
        bad = [b for b in ids if not index.check_block(b)]
        if bad:
            raise KVPlanError(
                error(
                    Code.BLOCK_OUT_OF_RANGE,
                    "block_ids",
                    f"Block ids {bad[:8]} are outside [0, {index.num_blocks}).",
                    "pass ids below the plan's num_blocks",
                )
            )
        return ids

    def _chunk_refs(self, blocks: list[int]) -> dict[str, Counter[int]]:
        refs: dict[str, Counter[int]] = {name: Counter() for name in self._memory}
        for b in blocks:
            for pool, chunks in self.page_index.block_chunks(b, self.chunk_bytes).items():
                refs[pool].update(chunks)
        return refs

    def ensure_mapped(self, block_ids: Iterable[int]) -> int:
        """Back the pages of ``block_ids`` with zeroed memory; returns bytes newly mapped.

        Idempotent per block. All-or-nothing: on a failed driver call everything this call
        mapped is unmapped again and ``KVP402`` is raised. No-op in eager mode.
        """
        with self._lock:
            return self._ensure_mapped(block_ids)

    def _ensure_mapped(self, block_ids: Iterable[int]) -> int:
        ids = self._block_ids(block_ids)
        if self.mode != "elastic":
            return 0
        new = [b for b in ids if b not in self._blocks]
        if not new:
            return 0
        refs = self._chunk_refs(new)
        todo = {
            name: sorted(c for c in refs[name] if c not in mem.mapped)
            for name, mem in self._memory.items()
        }
        txn = Transaction(self.backend)
        mapped = 0
        try:
            for name, chunks in todo.items():
                if chunks:
                    mapped += map_chunks(self.backend, txn, self._memory[name], chunks)
            if mapped and not self.backend.fresh_memory_is_zero:
                txn.at("wait_zeroed", "", 0, 0)
                self.backend.wait_zeroed()
        except BaseException as exc:
            action = f"ensure_mapped({len(new)} blocks: {block_ranges(new)})"
            err = failure(txn, exc, self.backend, action)
            self.rolled_back_chunks += txn.undone.get("unmap", 0)
            if err is exc:
                raise
            raise err from exc
        for name, mem in self._memory.items():
            mem.mapped.update(todo[name])
            for c, n in refs[name].items():
                mem.refs[c] = mem.refs.get(c, 0) + n
        self._blocks.update(new)
        return mapped

    def release_blocks(self, block_ids: Iterable[int]) -> int:
        """Drop ``block_ids``; unmap chunks no resident block uses. Returns bytes unmapped.

        Blocks that are not resident are ignored. No-op in eager mode. A failed unmap
        leaves that chunk mapped (unreferenced) and raises ``KVP402``.
        """
        with self._lock:
            return self._release_blocks(block_ids)

    def _release_blocks(self, block_ids: Iterable[int]) -> int:
        ids = self._block_ids(block_ids)
        if self.mode != "elastic":
            return 0
        gone = [b for b in ids if b in self._blocks]
        if not gone:
            return 0
        refs = self._chunk_refs(gone)
        self._blocks.difference_update(gone)
        drop: dict[str, list[int]] = {}
        for name, mem in self._memory.items():
            for c, n in refs[name].items():
                left = mem.refs.get(c, 0) - n
                if left > 0:
                    mem.refs[c] = left
                else:
                    mem.refs.pop(c, None)
                    drop.setdefault(name, []).append(c)
        return self._unmap(drop, "release_blocks")

    def _unmap(self, drop: dict[str, list[int]], action: str) -> int:
        if not any(drop.values()):
            return 0
        self.backend.synchronize()
        freed = 0
        for name, chunks in drop.items():
            mem = self._memory[name]
            try:
                freed += unmap_chunks(self.backend, mem, chunks)
            except BackendCallError as exc:
                raise KVPlanError(
                    error(
                        Code.DRIVER_CALL_FAILED,
                        f"pools.{name}",
                        f"{exc.call} failed during {action} on pool {name!r}: {exc.detail}. "
                        "The chunks it did not reach stay mapped.",
                        "retry release_blocks later; close() releases it in any case",
                    )
                ) from exc
        return freed

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap and free everything. Tensors from this cache become invalid.

        Idempotent once it succeeded. If a backend call fails, everything else is still
        released, the cache stays *closing* (``closed`` is False, tensors are gone, nothing
        new can be mapped) and ``KVPlanError`` ``KVP410`` says what remains mapped or
        reserved; calling ``close()`` again retries exactly what is left.
        """
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self._closing = True
        self.tensors = {}
        self.pools = {}
        self._blocks.clear()
        errors: list[str] = []
        try:
            self.backend.synchronize()
        except Exception as exc:
            errors.append(f"synchronize: {_short(exc)}")
        for mem in self._memory.values():
            mem.refs.clear()
            for run in mem.mapped.runs():
                for piece in unmap_calls(self.backend, run):  # a failed call: on to the next
                    try:
                        unmap_piece(self.backend, mem, piece)
                    except Exception as exc:
                        off, length = run_span(mem, piece)
                        errors.append(f"unmap {mem.name}[{off}:{off + length}]: {_short(exc)}")
            if mem.reserved and not mem.freed and not mem.mapped:
                try:
                    self.backend.free(mem.address, mem.reserved)
                except Exception as exc:
                    errors.append(f"free {mem.name}: {_short(exc)}")
                else:
                    mem.freed = True
        left = self._leftovers()
        if not left and self._owns_backend and not self._backend_closed:
            try:
                self.backend.close()
            except Exception as exc:
                errors.append(f"backend close: {_short(exc)}")
                left = ["the backend itself"]
            else:
                self._backend_closed = True
        if not left:
            self.closed = True
        if errors:
            remains = "; ".join(left) if left else "nothing (every resource was released)"
            raise KVPlanError(
                error(
                    Code.CLOSE_INCOMPLETE,
                    "cache.close",
                    f"{len(errors)} backend calls failed while closing "
                    f"({'; '.join(errors[:3])}{'; ...' if len(errors) > 3 else ''}). "
                    f"Still held: {remains}.",
                    "call close() again to retry what is left"
                    if left
                    else "nothing to do; the cache is closed",
                )
            )

    @property
    def closing(self) -> bool:
        """``close()`` started but could not release everything yet (retry it)."""
        return self._closing and not self.closed

    def _leftovers(self) -> list[str]:
        """What ``close()`` has not released yet, one phrase per pool."""
        out = []
        for mem in self._memory.values():
            parts = []
            if mem.mapped:
                parts.append(f"{len(mem.mapped)} mapped chunks ({human_bytes(mem.mapped_bytes())})")
            if mem.reserved and not mem.freed:
                parts.append(f"its {human_bytes(mem.reserved)} reservation")
            if parts:
                out.append(f"pool {mem.name!r}: " + " and ".join(parts))
        return out

    def __enter__(self) -> BoundKVCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = (
            "closed"
            if self.closed
            else ("closing" if self._closing else f"{human_bytes(self.mapped_bytes)} mapped")
        )
        return (
            f"<BoundKVCache {self.backend.name} {self.mode} {len(self.tensors)} tensors, "
            f"{human_bytes(self.reserved_bytes)} reserved, {state}>"
        )


def block_ranges(ids: Iterable[int], most: int = 4) -> str:
    """``3–7, 12, 40–41``: sorted block ids as ranges, the first ``most`` of them named."""
    runs: list[list[int]] = []
    for b in sorted(set(ids)):
        if runs and b == runs[-1][1] + 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    named = [f"{a}" if a == b else f"{a}–{b}" for a, b in runs[:most]]
    more = f" (+{len(runs) - most} more ranges)" if len(runs) > most else ""
    return ", ".join(named) + more


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."
