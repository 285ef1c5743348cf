"""``meta``: torch meta tensors; no memory, shapes and strides only.

Addresses are synthetic (a bump allocator over a fake address space), so offsets,
alignment and the elastic bookkeeping (mapped bytes per block) behave as on a real backend.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from kvplan.executor.backends.base import BackendCallError, BackendInfo, TrackedBackend, round_up
from kvplan.schemas.errors import Code, KVPlanError, error

if TYPE_CHECKING:
    from torch import Tensor

_BASE = 1 << 44
_PAGE = 4096


class MetaBackend(TrackedBackend):
    """Fake VMM over the ``meta`` device: every primitive only updates bookkeeping."""

    name = "meta"
    device = "meta"
    info = BackendInfo(
        elastic=True,
        granularity_default=_PAGE,
        devices=("meta",),
        plugin=False,
        summary="torch meta tensors: shapes and offsets, no memory",
    )
    reserve_commits = False
    fresh_memory_is_zero = True
    call_names = {op: f"meta.{op}" for op in ("reserve", "create", "map", "unmap", "free")}  # noqa: RUF012

    @classmethod
    def available(cls) -> str | None:
        return None if find_spec("torch") else "torch is not installed"

    def __init__(self, *, device: str | None = None, granularity: int = _PAGE) -> None:
        if device not in (None, "meta"):
            raise KVPlanError(
                error(
                    Code.BACKEND_UNAVAILABLE,
                    "backend",
                    f"The meta backend only makes meta tensors; device {device!r} is not 'meta'.",
                    "drop --device, or use --backend torch for real memory",
                )
            )
        super().__init__()
        self._granularity = granularity
        self._next = _BASE
        self._next_handle = 1

    def granularity(self) -> int:
        return self._granularity

    def reserve(self, size: int, alignment: int) -> int:
        address = round_up(self._next, max(alignment, self._granularity))
        self._next = address + round_up(max(size, 1), self._granularity) + self._granularity
        self._reservations[address] = size
        return address

    def create(self, size: int) -> Any:
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = size
        return handle

    def map(self, address: int, size: int, handle: Any) -> None:
        self._check_reserved("meta.map", address, size)
        if address in self._mappings:
            raise BackendCallError("meta.map", f"{address:#x} is already mapped")
        self._mappings[address] = size

    def set_access(self, address: int, size: int) -> None:
        return None

    def zero(self, address: int, size: int) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wrap(self, address: int, size: int) -> Tensor:
        import torch

        return torch.empty(size, dtype=torch.int8, device="meta")

    def unmap(self, address: int, size: int) -> None:
        if self._mappings.pop(address, None) is None:
            raise BackendCallError("meta.unmap", f"{address:#x} is not mapped")

    def release(self, handle: Any) -> None:
        self._handles.pop(handle, None)

    def free(self, address: int, size: int) -> None:
        length = self._reservations.get(address)
        if length is None:
            raise BackendCallError("meta.free", f"{address:#x} is not reserved")
        if self._mappings.inside(address, length):
            raise BackendCallError("meta.free", f"mappings remain inside {address:#x}")
        del self._reservations[address]
