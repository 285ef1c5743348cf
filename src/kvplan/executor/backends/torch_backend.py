"""``torch``: one ``torch.zeros(size, dtype=int8)`` per pool, exactly what vLLM allocates.

``reserve`` commits and zeroes the memory, so the mapping primitives are never called
(``reserve_commits``) and elastic mode is unavailable. Works on any torch device.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from kvplan.executor.backends.base import BackendCallError, BackendInfo, TrackedBackend

if TYPE_CHECKING:
    from torch import Tensor


class TorchBackend(TrackedBackend):
    """Plain torch allocations (the caching allocator on CUDA); the vanilla-equivalent path."""

    name = "torch"
    info = BackendInfo(
        elastic=False,
        granularity_default=1,
        devices=(),
        plugin=True,
        pooled_allocation_ok=True,
        summary="one plain torch.zeros per pool (what vLLM does)",
    )
    reserve_commits = True
    fresh_memory_is_zero = True
    call_names = {"reserve": "torch.zeros", "wrap": "torch.Tensor", "free": "del"}  # noqa: RUF012

    @classmethod
    def available(cls) -> str | None:
        return None if find_spec("torch") else "torch is not installed"

    def __init__(self, *, device: str | None = None) -> None:
        super().__init__()
        import torch

        self._torch = torch
        self.device = str(torch.device(device or "cpu"))
        self._buffers: dict[int, Tensor] = {}

    def granularity(self) -> int:
        return 1

    def reserve(self, size: int, alignment: int) -> int:
        try:
            buf = self._torch.zeros(size, dtype=self._torch.int8, device=self.device)
        except (RuntimeError, MemoryError) as exc:  # OOM and device errors
            raise BackendCallError("torch.zeros", str(exc).splitlines()[0]) from exc
        address = buf.data_ptr()
        self._buffers[address] = buf
        self._reservations[address] = size
        self._mappings[address] = size
        return address

    def create(self, size: int) -> Any:
        raise BackendCallError("torch.create", "the torch backend commits memory at reserve")

    def map(self, address: int, size: int, handle: Any) -> None:
        raise BackendCallError("torch.map", "the torch backend commits memory at reserve")

    def set_access(self, address: int, size: int) -> None:
        return None

    def zero(self, address: int, size: int) -> None:
        for base, buf in self._buffers.items():
            if base <= address < base + buf.numel():
                buf[address - base : address - base + size].zero_()
                return

    def synchronize(self) -> None:
        if self.device.startswith("cuda"):
            self._torch.cuda.synchronize(self.device)

    def wrap(self, address: int, size: int) -> Tensor:
        buf = self._buffers.get(address)
        if buf is None or buf.numel() < size:
            raise BackendCallError("torch.wrap", f"{address:#x} is not a torch reservation")
        return buf if buf.numel() == size else buf[:size]

    def unmap(self, address: int, size: int) -> None:
        return None

    def release(self, handle: Any) -> None:
        return None

    def free(self, address: int, size: int) -> None:
        if self._buffers.pop(address, None) is None:
            raise BackendCallError("del", f"{address:#x} is not a torch reservation")
        self._reservations.pop(address, None)
        self._mappings.pop(address, None)
