"""A fake ``cuda.bindings.driver`` for CPU tests of the cuda-vmm backend's call sequences.

It keeps the state a real driver keeps for VMM (reservations, allocations, mappings, access)
and refuses what a real one refuses: mapping over a mapped granule or outside a reservation,
unmapping a range that is not exactly one mapping, granting access over an unmapped byte,
freeing a reservation that still has mappings. ``log`` lists every call as ``(name, args)``;
``fail[name] = n`` makes the n-th (0-based) next call of ``name`` fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

SUCCESS = 0
INVALID_VALUE = 1
OUT_OF_MEMORY = 2


class CUresult:
    CUDA_SUCCESS = SUCCESS


class CUdevice_attribute:
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102


class CUmemAllocationType:
    CU_MEM_ALLOCATION_TYPE_PINNED = 1


class CUmemLocationType:
    CU_MEM_LOCATION_TYPE_DEVICE = 1


class CUmemAccess_flags:
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class CUmemAllocationGranularity_flags:
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0


class CUstream_flags:
    CU_STREAM_DEFAULT = 0
    CU_STREAM_NON_BLOCKING = 1


def CUmemAllocationProp() -> Any:
    return SimpleNamespace(type=None, location=SimpleNamespace(type=None, id=None))


def CUmemAccessDesc() -> Any:
    return SimpleNamespace(flags=None, location=SimpleNamespace(type=None, id=None))


def CUstream(value: int) -> int:
    return value


@dataclass
class Mapping:
    size: int
    handle: int
    access: bool = False


class FakeDriver:
    """One device, granularity ``gran``, ``memory`` bytes of physical memory."""

    CUresult = CUresult
    CUdevice_attribute = CUdevice_attribute
    CUmemAllocationType = CUmemAllocationType
    CUmemLocationType = CUmemLocationType
    CUmemAccess_flags = CUmemAccess_flags
    CUmemAllocationGranularity_flags = CUmemAllocationGranularity_flags
    CUstream_flags = CUstream_flags
    CUmemAllocationProp = staticmethod(CUmemAllocationProp)
    CUmemAccessDesc = staticmethod(CUmemAccessDesc)
    CUstream = staticmethod(CUstream)

    def __init__(self, gran: int = 2 << 20, memory: int = 1 << 40) -> None:
        self.gran = gran
        self.memory = memory
        self.log: list[tuple[str, tuple[Any, ...]]] = []
        self.fail: dict[str, int] = {}
        self.reservations: dict[int, int] = {}
        self.allocations: dict[int, int] = {}  # handle -> size
        self.released: set[int] = set()  # handles whose owner reference is dropped
        self.mappings: dict[int, Mapping] = {}  # address -> mapping
        self.contents: dict[int, bytes] = {}  # handle -> written bytes (memset only)
        self._next_va = 1 << 40
        self._next_handle = 1
        self.streams: dict[int, int] = {}  # stream -> flags (live streams)
        self._next_stream = 7001

    # -- bookkeeping --------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> bool:
        """Log the call; True if it must fail."""
        self.log.append((name, args))
        left = self.fail.get(name)
        if left is None:
            return False
        if left == 0:
            del self.fail[name]
            return True
        self.fail[name] = left - 1
        return False

    def calls(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.log if n == name]

    def _mapped_at(self, address: int) -> tuple[int, Mapping] | None:
        for base, m in self.mappings.items():
            if base <= address < base + m.size:
                return base, m
        return None

    def _reserved(self, address: int, size: int) -> bool:
        return any(b <= address and address + size <= b + n for b, n in self.reservations.items())

    def _gc(self, handle: int) -> None:
        if handle in self.released and not any(m.handle == handle for m in self.mappings.values()):
            self.allocations.pop(handle, None)
            self.released.discard(handle)

    def used(self) -> int:
        return sum(self.allocations.values())

    # -- the driver API -----------------------------------------------------------------
    def cuInit(self, flags: int) -> tuple[int]:
        return (SUCCESS,)

    def cuDeviceGet(self, index: int) -> tuple[int, int]:
        return SUCCESS, index

    def cuDeviceGetAttribute(self, attr: int, dev: int) -> tuple[int, int]:
        return SUCCESS, 1

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple[int, int]:
        return SUCCESS, 77

    def cuDevicePrimaryCtxRelease(self, dev: int) -> tuple[int]:
        return (SUCCESS,)

    def cuCtxGetCurrent(self) -> tuple[int, int]:
        return SUCCESS, 77

    def cuCtxSetCurrent(self, ctx: int) -> tuple[int]:
        return (SUCCESS,)

    def cuCtxCreate(self, *args: Any) -> tuple[int, int]:
        raise AssertionError("cuda-vmm must never create a context")

    def cuCtxSynchronize(self) -> tuple[int]:
        self.log.append(("cuCtxSynchronize", ()))
        return (SUCCESS,)

    def cuGetErrorName(self, err: int) -> tuple[int, bytes]:
        return SUCCESS, {INVALID_VALUE: b"CUDA_ERROR_INVALID_VALUE"}.get(
            err, b"CUDA_ERROR_OUT_OF_MEMORY"
        )

    def cuGetErrorString(self, err: int) -> tuple[int, bytes]:
        return SUCCESS, b"fake failure"

    def cuMemGetAllocationGranularity(self, prop: Any, flag: int) -> tuple[int, int]:
        return SUCCESS, self.gran

    def cuMemGetInfo(self) -> tuple[int, int, int]:
        return SUCCESS, self.memory - self.used(), self.memory

    def cuMemAddressReserve(
        self, size: int, alignment: int, hint: int, flags: int
    ) -> tuple[int, int]:
        if self._call("cuMemAddressReserve", size, alignment) or size % self.gran:
            return INVALID_VALUE, 0
        align = max(alignment, self.gran)
        base = -(-self._next_va // align) * align
        self._next_va = base + size + self.gran
        self.reservations[base] = size
        return SUCCESS, base

    def cuMemAddressFree(self, address: int, size: int) -> tuple[int]:
        if self._call("cuMemAddressFree", address, size):
            return (INVALID_VALUE,)
        if self.reservations.get(address) != size:
            return (INVALID_VALUE,)
        if any(address <= a < address + size for a in self.mappings):
            return (INVALID_VALUE,)  # a real driver refuses while anything is mapped
        del self.reservations[address]
        return (SUCCESS,)

    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple[int, int]:
        if self._call("cuMemCreate", size) or size % self.gran:
            return INVALID_VALUE, 0
        if self.used() + size > self.memory:
            return OUT_OF_MEMORY, 0
        handle = self._next_handle
        self._next_handle += 1
        self.allocations[handle] = size
        return SUCCESS, handle

    def cuMemRelease(self, handle: int) -> tuple[int]:
        if self._call("cuMemRelease", int(handle)):
            return (INVALID_VALUE,)
        if int(handle) not in self.allocations or int(handle) in self.released:
            return (INVALID_VALUE,)
        self.released.add(int(handle))
        self._gc(int(handle))
        return (SUCCESS,)

    def cuMemMap(self, address: int, size: int, offset: int, handle: int, flags: int) -> tuple[int]:
        if self._call("cuMemMap", address, size, int(handle)):
            return (INVALID_VALUE,)
        handle = int(handle)
        if handle not in self.allocations or handle in self.released:
            return (INVALID_VALUE,)
        if size > self.allocations[handle] or size % self.gran or address % self.gran:
            return (INVALID_VALUE,)
        if not self._reserved(address, size):
            return (INVALID_VALUE,)
        if any(self._mapped_at(a) for a in range(address, address + size, self.gran)):
            return (INVALID_VALUE,)  # already mapped
        self.mappings[address] = Mapping(size, handle)
        return (SUCCESS,)

    def cuMemUnmap(self, address: int, size: int) -> tuple[int]:
        if self._call("cuMemUnmap", address, size):
            return (INVALID_VALUE,)
        m = self.mappings.get(address)
        if m is None or m.size != size:
            return (INVALID_VALUE,)
        del self.mappings[address]
        self._gc(m.handle)
        return (SUCCESS,)

    def cuMemSetAccess(self, address: int, size: int, descs: list[Any], count: int) -> tuple[int]:
        if self._call("cuMemSetAccess", address, size):
            return (INVALID_VALUE,)
        touched = []
        for a in range(address, address + size, self.gran):
            hit = self._mapped_at(a)
            if hit is None:
                return (INVALID_VALUE,)
            touched.append(hit[1])
        for m in touched:
            m.access = True
        return (SUCCESS,)

    def _writable(self, address: int, size: int) -> list[Mapping] | None:
        out = []
        for a in range(address - address % self.gran, address + size, self.gran):
            hit = self._mapped_at(a)
            if hit is None or not hit[1].access:
                return None
            out.append(hit[1])
        return out

    def cuMemsetD8(self, address: int, value: int, size: int) -> tuple[int]:
        if self._call("cuMemsetD8", address, size):
            return (INVALID_VALUE,)
        targets = self._writable(address, size)
        if targets is None:
            return (INVALID_VALUE,)
        for m in targets:
            self.contents[m.handle] = bytes([value])
        return (SUCCESS,)

    def cuStreamCreate(self, flags: int) -> tuple[int, int]:
        if self._call("cuStreamCreate", flags) or not isinstance(flags, int):
            return (INVALID_VALUE, 0)
        stream, self._next_stream = self._next_stream, self._next_stream + 1
        self.streams[stream] = flags
        return (SUCCESS, stream)

    def cuStreamSynchronize(self, stream: int) -> tuple[int]:
        if self._call("cuStreamSynchronize", stream) or stream not in self.streams:
            return (INVALID_VALUE,)
        return (SUCCESS,)

    def cuStreamDestroy(self, stream: int) -> tuple[int]:
        if self._call("cuStreamDestroy", stream) or stream not in self.streams:
            return (INVALID_VALUE,)
        del self.streams[stream]
        return (SUCCESS,)

    def cuMemsetD8Async(self, address: int, value: int, size: int, stream: int) -> tuple[int]:
        if self._call("cuMemsetD8Async", address, size, stream):
            return (INVALID_VALUE,)
        return (SUCCESS,) if self._writable(address, size) is not None else (INVALID_VALUE,)

    # -- what a kernel would see --------------------------------------------------------
    def access(self, address: int) -> str:
        """``fault`` (nothing mapped or no access), ``scratch:<handle>`` or ``chunk:<handle>``."""
        hit = self._mapped_at(address)
        if hit is None or not hit[1].access:
            return "fault"
        return f"handle:{hit[1].handle}"
