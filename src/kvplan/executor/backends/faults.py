"""Fault injection: a wrapper backend whose N-th primitive call fails.

``FaultyBackend(inner, fail_at=n)`` forwards everything to ``inner`` and raises
:class:`~kvplan.executor.backends.base.BackendCallError` instead of making call number
``n`` (0-based, counted over :data:`~kvplan.executor.backends.base.PRIMITIVES`, optionally
only those in ``ops``). Calls after the failure (the rollback) go through. Tests fail every
call index in turn and assert ``inner.live().clean`` afterwards. Counting and failing happen
in one place, :meth:`FaultyBackend._log_call`, which the shared call-log wrapper
(:class:`~kvplan.executor.backends.base.CountedBackend`) runs before every primitive.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from kvplan.executor.backends.base import (
    Backend,
    BackendCallError,
    CallLog,
    CountedBackend,
    LiveResources,
)

if TYPE_CHECKING:
    from torch import Tensor


class FaultyBackend(CountedBackend):
    """Delegates to ``inner``; call ``fail_at`` (or every call in ``fail_ops``) raises."""

    def __init__(
        self,
        inner: Backend,
        *,
        fail_at: int | None = None,
        ops: Collection[str] | None = None,
        fail_ops: Collection[str] = (),
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.info = inner.info
        self.device = inner.device
        self.reserve_commits = inner.reserve_commits
        self.fresh_memory_is_zero = inner.fresh_memory_is_zero
        self.maps_runs = getattr(inner, "maps_runs", False)
        self.call_names = inner.call_names
        self.calls = CallLog()
        self.fail_at = fail_at
        self.ops = set(ops) if ops is not None else None
        self.fail_ops = set(fail_ops)
        self.failed: list[tuple[int, str]] = []

    def _log_call(self, op: str) -> None:
        if self.ops is not None and op not in self.ops:
            return
        index = self.calls.total
        self.calls(op)
        if index == self.fail_at or op in self.fail_ops:
            self.failed.append((index, op))
            call = self.call_names.get(op, op)
            raise BackendCallError(call, f"injected failure at call #{index} ({op})")

    def granularity(self) -> int:
        return self.inner.granularity()

    def reserve(self, size: int, alignment: int) -> int:
        return self.inner.reserve(size, alignment)

    def create(self, size: int) -> Any:
        return self.inner.create(size)

    def map(self, address: int, size: int, handle: Any) -> None:
        self.inner.map(address, size, handle)

    def set_access(self, address: int, size: int) -> None:
        self.inner.set_access(address, size)

    def zero(self, address: int, size: int) -> None:
        self.inner.zero(address, size)

    def synchronize(self) -> None:
        self.inner.synchronize()

    def wait_zeroed(self) -> None:
        self.inner.wait_zeroed()

    def wrap(self, address: int, size: int) -> Tensor:
        return self.inner.wrap(address, size)

    def unmap(self, address: int, size: int) -> None:
        self.inner.unmap(address, size)

    def release(self, handle: Any) -> None:
        self.inner.release(handle)

    def free(self, address: int, size: int) -> None:
        self.inner.free(address, size)

    def map_run(self, address: int, size: int) -> None:
        self.inner.map_run(address, size)  # type: ignore[attr-defined]  # maps_runs

    def unmap_run(self, address: int, size: int) -> None:
        self.inner.unmap_run(address, size)  # type: ignore[attr-defined]

    def live(self) -> LiveResources:
        return self.inner.live()

    def close(self) -> None:
        self.inner.close()
