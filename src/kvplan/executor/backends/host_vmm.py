"""``host-vmm``: the CPU twin of CUDA VMM (Linux), so the executor is tested for real in CI.

========================  =========================================================
CUDA VMM                  host-vmm
========================  =========================================================
``cuMemAddressReserve``   ``mmap(NULL, size, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS)``
``cuMemCreate``           ``memfd_create`` + ``ftruncate`` (a fresh, zero-filled file)
``cuMemMap``              ``mmap(addr, size, PROT_NONE, MAP_SHARED|MAP_FIXED, fd)``
``cuMemSetAccess``        ``mprotect(addr, size, PROT_READ|PROT_WRITE)``
``cuMemRelease``          ``close(fd)`` (the mapping keeps the pages alive)
``cuMemUnmap``            ``mmap(addr, size, PROT_NONE, MAP_FIXED|MAP_ANONYMOUS)``:
                          back to a reservation at the same address
``cuMemAddressFree``      ``munmap``
``cuMemsetD8``            ``memset``
========================  =========================================================

A run of chunks is backed in one call (``maps_runs``, the default): each reservation has one
memfd of its size, and ``map_run`` maps the run's bytes of it ``MAP_SHARED|MAP_FIXED`` and
readable/writable in one ``mmap``; ``unmap_run`` maps the range back to a reservation and
punches the run's hole in the file (``fallocate(PUNCH_HOLE)``), which frees its pages, so the
next ``map_run`` there reads zeros again. A 64 KiB block of 4 KiB chunks costs one ``mmap``
each way instead of 16 ``memfd_create``/``ftruncate``/``mmap``/``close``. The per-chunk
primitives stay (a fresh memfd per ``create``): ``runs=False`` makes the executor drive them
one chunk at a time, as it drives cuda-vmm (the tests of that path run on it).

Unbacked ranges (``unbacked``): ``"fault"`` keeps them ``PROT_NONE``, so touching one faults
(what a test of "no live block is ever unbacked" wants). ``"scratch"`` makes them private,
anonymous, ``PROT_READ|PROT_WRITE`` and ``MAP_NORESERVE`` instead: a stray read returns zeros
from the kernel's shared zero page and costs nothing, a stray write lands in a private page that
is thrown away when the range is next mapped or unmapped — the CPU twin of kvcached's zero page
(elastic serving: kernels may read blocks outside a step). Unlike cuda-vmm's one shared scratch
granule, such a page keeps what was written to it until then (writes do not alias).

Tensors are zero-copy: ``torch.frombuffer`` over a ctypes array at the reserved address.
Like CUDA, an unmapped range must be a whole earlier mapping and a reservation may only be
freed once nothing inside it is mapped; a violation raises instead of corrupting memory.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap as _mmap
import os
import sys
from typing import TYPE_CHECKING, Any

from kvplan.executor.backends.base import (
    BackendCallError,
    BackendInfo,
    TrackedBackend,
    check_unbacked,
    round_up,
)
from kvplan.executor.backends.latency import DeviceLatency, latency_from
from kvplan.schemas.errors import Code, KVPlanError, error

if TYPE_CHECKING:
    from torch import Tensor

PROT_NONE = 0x0
PROT_RW = 0x1 | 0x2
MAP_SHARED = 0x01
MAP_PRIVATE = 0x02
MAP_FIXED = 0x10
MAP_ANONYMOUS = 0x20
MAP_NORESERVE = 0x4000
MAP_POPULATE = 0x8000
MADV_POPULATE_WRITE = 23
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
_MAP_FAILED = ctypes.c_void_p(-1).value

_counter = itertools.count()


class _Libc:
    """``mmap``/``munmap``/``mprotect``/``memset`` from the C library, with errno."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap = libc.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        self.munmap = libc.munmap
        self.munmap.restype = ctypes.c_int
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.mprotect = libc.mprotect
        self.mprotect.restype = ctypes.c_int
        self.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.madvise = libc.madvise
        self.madvise.restype = ctypes.c_int
        self.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.fallocate = libc.fallocate
        self.fallocate.restype = ctypes.c_int
        self.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


_LIBC: _Libc | None = None


def _libc() -> _Libc:
    global _LIBC
    if _LIBC is None:
        _LIBC = _Libc()
    return _LIBC


def _errno_text() -> str:
    err = ctypes.get_errno()
    return f"errno {err} ({os.strerror(err)})"


class HostVmmBackend(TrackedBackend):
    """Reserve/map/unmap host memory like CUDA VMM; see the module docstring for the mapping.

    ``granularity``: the minimum mapping unit (default: the OS page size; pass 2 MiB to
    mimic CUDA). ``populate``: commit pages when access is granted
    (``madvise(MADV_POPULATE_WRITE)``, else touching them) instead of on first use.
    ``unbacked``: what an unmapped part of a reservation does when touched — ``"fault"``
    (``PROT_NONE``) or ``"scratch"`` (reads zeros, writes land in throwaway pages); see the module
    docstring. ``latency``: wait as a GPU would after each call (benchmarks only; default from
    ``KVPLAN_HOST_VMM_LATENCY``, see :mod:`kvplan.executor.backends.latency`).
    """

    name = "host-vmm"
    device = "cpu"
    info = BackendInfo(
        elastic=True,
        granularity_default=_mmap.PAGESIZE,
        devices=("cpu",),
        plugin=True,
        summary="the CPU twin of CUDA VMM (mmap/memfd)",
        lazy_pages=True,
    )
    reserve_commits = False
    fresh_memory_is_zero = True
    call_names = {  # noqa: RUF012
        "reserve": "mmap(PROT_NONE)",
        "create": "memfd_create",
        "map": "mmap(MAP_FIXED|MAP_SHARED)",
        "set_access": "mprotect",
        "zero": "memset",
        "wrap": "torch.frombuffer",
        "unmap": "mmap(MAP_FIXED|PROT_NONE)",
        "release": "close",
        "free": "munmap",
        "map_run": "mmap(MAP_FIXED|MAP_SHARED)",
        "unmap_run": "fallocate(PUNCH_HOLE)",
    }

    @classmethod
    def available(cls) -> str | None:
        """Linux with a working ``memfd_create`` (creates and closes one memfd)."""
        if not sys.platform.startswith("linux"):
            return f"host-vmm needs Linux (mmap, memfd_create); this is {sys.platform}"
        create = getattr(os, "memfd_create", None)
        if create is None:
            return "host-vmm needs os.memfd_create, which this Python lacks"
        try:
            fd = create("kvplan-probe", getattr(os, "MFD_CLOEXEC", 0))
        except OSError as exc:
            return f"host-vmm needs memfd_create, which fails here ({exc.strerror or exc})"
        os.close(fd)
        return None

    def __init__(
        self,
        *,
        device: str | None = None,
        granularity: int | None = None,
        populate: bool = False,
        assume_zeroed: bool = True,
        unbacked: str = "fault",
        latency: DeviceLatency | None = None,
        runs: bool = True,
    ) -> None:
        why = self.available()
        if why is not None:
            raise KVPlanError(
                error(Code.BACKEND_UNAVAILABLE, "backend", why, "use --backend torch")
            )
        if device not in (None, "cpu"):
            raise KVPlanError(
                error(
                    Code.BACKEND_UNAVAILABLE,
                    "backend",
                    f"host-vmm maps host memory; device {device!r} is not 'cpu'.",
                    "use --backend cuda-vmm for GPUs or --backend torch",
                )
            )
        check_unbacked("host-vmm", unbacked)
        super().__init__()
        self.unbacked = unbacked
        self._unbacked_prot = PROT_RW if unbacked == "scratch" else PROT_NONE
        page = _mmap.PAGESIZE
        self._granularity = round_up(granularity or page, page)
        self._populate = populate
        self.fresh_memory_is_zero = assume_zeroed
        self.maps_runs = runs
        self.memfd_name = f"kvplan-{os.getpid()}-{next(_counter)}"
        self._c = _libc()
        self._files: dict[int, int] = {}
        """Reservation base → the memfd backing its runs (made at its first ``map_run``)."""
        self.latency = latency if latency is not None else latency_from(os.environ)
        """The emulated device's waits (``None``: host-vmm's own costs only)."""

    # -- address space -------------------------------------------------------------------
    def granularity(self) -> int:
        return self._granularity

    def reserve(self, size: int, alignment: int) -> int:
        size = round_up(size, self._granularity)
        align = max(alignment, _mmap.PAGESIZE)
        span = size + align
        flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE
        raw = self._c.mmap(None, span, PROT_NONE, flags, -1, 0)
        if raw is None or raw == _MAP_FAILED:
            raise BackendCallError("mmap(PROT_NONE)", f"{span} bytes: {_errno_text()}")
        base = round_up(raw, align)
        if base > raw:
            self._c.munmap(raw, base - raw)
        tail = raw + span - (base + size)
        if tail:
            self._c.munmap(base + size, tail)
        if self._unbacked_prot != PROT_NONE and self._c.mprotect(base, size, self._unbacked_prot):
            self._c.munmap(base, size)
            raise BackendCallError("mprotect", f"scratch {base:#x}+{size}: {_errno_text()}")
        self._reservations[base] = size
        return base

    def free(self, address: int, size: int) -> None:
        length = self._reservations.get(address)
        if length is None:
            raise BackendCallError("munmap", f"{address:#x} is not a reservation")
        inside = self._mappings.inside(address, length)
        if inside:
            raise BackendCallError("munmap", f"{inside} mappings still inside {address:#x}")
        if self._c.munmap(address, length) != 0:
            raise BackendCallError("munmap", f"{address:#x}+{length}: {_errno_text()}")
        del self._reservations[address]
        fd = self._files.pop(address, None)
        if fd is not None:
            os.close(fd)

    # -- physical memory ------------------------------------------------------------------
    def create(self, size: int) -> Any:
        try:
            fd = os.memfd_create(self.memfd_name, os.MFD_CLOEXEC)
        except OSError as exc:
            raise BackendCallError("memfd_create", str(exc)) from exc
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            os.close(fd)
            raise BackendCallError("ftruncate", f"{size} bytes: {exc}") from exc
        self._handles[fd] = size
        if self.latency is not None:
            self.latency.charge("create", size)
        return fd

    def release(self, handle: Any) -> None:
        size = self._handles.pop(handle, None)
        if size is None:
            raise BackendCallError("close", f"fd {handle} is not a live handle")
        os.close(handle)
        if self.latency is not None:
            self.latency.charge("release", size)

    # -- mappings -------------------------------------------------------------------------
    def map(self, address: int, size: int, handle: Any) -> None:
        self._check_reserved("mmap(MAP_FIXED|MAP_SHARED)", address, size)
        if handle not in self._handles or self._handles[handle] < size:
            raise BackendCallError("mmap(MAP_FIXED|MAP_SHARED)", f"bad handle {handle}")
        if self._mappings.overlaps(address, size):
            raise BackendCallError("mmap(MAP_FIXED|MAP_SHARED)", f"{address:#x} overlaps")
        flags = MAP_SHARED | MAP_FIXED
        got = self._c.mmap(address, size, PROT_NONE, flags, handle, 0)
        if got != address:
            raise BackendCallError(
                "mmap(MAP_FIXED|MAP_SHARED)", f"{address:#x}+{size}: {_errno_text()}"
            )
        self._mappings[address] = size
        if self.latency is not None:
            self.latency.charge("map", size)

    def set_access(self, address: int, size: int) -> None:
        if self._c.mprotect(address, size, PROT_RW) != 0:
            raise BackendCallError("mprotect", f"{address:#x}+{size}: {_errno_text()}")
        if self._populate and self._c.madvise(address, size, MADV_POPULATE_WRITE) != 0:
            ctypes.memset(address, 0, size)  # kernels before 5.14: fault the pages in
        if self.latency is not None:
            self.latency.charge("set_access", size)

    def unmap(self, address: int, size: int) -> None:
        if self._mappings.get(address) != size:
            raise BackendCallError(
                "mmap(MAP_FIXED|PROT_NONE)", f"{address:#x}+{size} is not one whole mapping"
            )
        flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE
        if self._c.mmap(address, size, self._unbacked_prot, flags, -1, 0) != address:
            raise BackendCallError("mmap(MAP_FIXED|PROT_NONE)", _errno_text())
        del self._mappings[address]
        if self.latency is not None:
            self.latency.charge("unmap", size)

    # -- runs (maps_runs) ------------------------------------------------------------------
    def _file(self, call: str, address: int, size: int) -> tuple[int, int]:
        """The memfd backing the reservation around ``[address, address + size)`` and the
        range's offset in it (the memfd is made, of the reservation's size, when needed)."""
        base = self._check_reserved(call, address, size)
        fd = self._files.get(base)
        if fd is None:
            try:
                fd = os.memfd_create(self.memfd_name, os.MFD_CLOEXEC)
            except OSError as exc:
                raise BackendCallError("memfd_create", str(exc)) from exc
            try:
                os.ftruncate(fd, self._reservations[base])
            except OSError as exc:
                os.close(fd)
                size = self._reservations[base]
                raise BackendCallError("ftruncate", f"{size} bytes: {exc}") from exc
            self._files[base] = fd
        return fd, address - base

    def map_run(self, address: int, size: int) -> None:
        call = "mmap(MAP_FIXED|MAP_SHARED)"
        fd, offset = self._file(call, address, size)
        if self._mappings.overlaps(address, size):
            raise BackendCallError(call, f"{address:#x}+{size} overlaps a mapping")
        flags = MAP_SHARED | MAP_FIXED | (MAP_POPULATE if self._populate else 0)
        got = self._c.mmap(address, size, PROT_RW, flags, fd, offset)
        if got != address:
            raise BackendCallError(call, f"{address:#x}+{size}: {_errno_text()}")
        self._mappings[address] = size
        if self.latency is not None:
            for op in ("create", "map", "set_access"):
                self.latency.charge(op, size)

    def unmap_run(self, address: int, size: int) -> None:
        fd, offset = self._file("fallocate(PUNCH_HOLE)", address, size)
        if not self._mappings.cut(address, size):
            raise BackendCallError(
                "mmap(MAP_FIXED|PROT_NONE)", f"{address:#x}+{size} is not wholly mapped"
            )
        flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE
        if self._c.mmap(address, size, self._unbacked_prot, flags, -1, 0) != address:
            self._mappings[address] = size  # still mapped as it was
            raise BackendCallError("mmap(MAP_FIXED|PROT_NONE)", _errno_text())
        if self._c.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, size):
            # the range is a reservation again; only the file keeps its pages until closed
            raise BackendCallError("fallocate(PUNCH_HOLE)", f"{size} bytes: {_errno_text()}")
        if self.latency is not None:
            for op in ("unmap", "release"):
                self.latency.charge(op, size)

    # -- data -----------------------------------------------------------------------------
    def zero(self, address: int, size: int) -> None:
        ctypes.memset(address, 0, size)

    def synchronize(self) -> None:
        return None

    def wrap(self, address: int, size: int) -> Tensor:
        import torch

        buf = (ctypes.c_byte * size).from_address(address)
        tensor = torch.frombuffer(buf, dtype=torch.int8)
        if tensor.data_ptr() != address:
            raise BackendCallError("torch.frombuffer", "the tensor is not zero-copy")
        return tensor
