"""``cuda-vmm``: CUDA virtual memory management through cuda-python's driver bindings.

Context discipline: torch creates (or retains) the device's *primary* context; this backend
makes sure that primary context is current and never creates one of its own. Physical memory
comes in chunks (``cuMemCreate``), each mapped once (``cuMemMap``) and released right away
(the mapping keeps it alive, as in NVIDIA's samples); access is granted with one
``cuMemSetAccess`` per contiguous mapped range. Pools are wrapped zero-copy as ``int8``
tensors over the reserved address.

``cuda.bindings.driver`` is imported here only, lazily, so ``import kvplan.executor`` never
needs cuda-python. Anything missing (cuda-python, a GPU, a driver, VMM support) raises
:class:`~kvplan.schemas.errors.KVPlanError` ``KVP401`` with one readable paragraph.

Unbacked address space (``unbacked=``): ``"fault"`` leaves it unmapped, so a kernel that
touches it faults (``CUDA_ERROR_ILLEGAL_ADDRESS``). ``"scratch"`` maps ONE physical scratch
granule (created on first use, zeroed once) read/write over every granule of a reservation
that holds no chunk: at ``reserve``, and again over a chunk's range after its ``unmap``;
``map`` first unmaps the scratch granules it covers, ``free`` unmaps all of them. Stray reads
of unbacked blocks then return whatever the scratch granule holds (zeros until a stray write
lands there) and stray writes are harmless, never a fault (kvcached's zero-page safety net).
Scratch mappings and the scratch handle are not counted by ``live()`` (they are listed by
``scratch_live()``); the handle is released when the last reservation is freed.
"""

from __future__ import annotations

import ctypes
import importlib.util
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kvplan.executor.backends.base import (
    BackendCallError,
    BackendInfo,
    TrackedBackend,
    check_unbacked,
)
from kvplan.schemas.errors import Code, KVPlanError, error

if TYPE_CHECKING:
    from torch import Tensor


_ADVICE = (
    "cuda-vmm needs an NVIDIA GPU with a working CUDA driver, a CUDA build of torch and "
    "cuda-python (`pip install cuda-python`, module cuda.bindings.driver). Use "
    "`--backend torch` for the same tensors from one plain torch.zeros allocation, or "
    "`--backend host-vmm` to exercise the VMM executor on the CPU."
)


def unavailable(reason: str) -> KVPlanError:
    """The ``KVP401`` error for ``reason`` (one sentence, no trailing period)."""
    return KVPlanError(
        error(
            Code.BACKEND_UNAVAILABLE,
            "backend.cuda-vmm",
            f"The cuda-vmm backend is unavailable: {reason}. {_ADVICE}",
            "use --backend torch (or host-vmm on a CPU machine)",
        )
    )


def load_driver() -> ModuleType:
    """``cuda.bindings.driver`` (or the pre-12.6 ``cuda.cuda``), else ``KVP401``."""
    try:
        from cuda.bindings import driver

        return driver
    except ImportError:
        pass
    try:
        from cuda import cuda as legacy

        return legacy
    except ImportError:
        raise unavailable("cuda-python is not installed (no module cuda.bindings.driver)") from None


def _find_spec(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def cuda_driver_library() -> str | None:
    """The CUDA driver library this process can load (``libcuda.so.1``), else ``None``.

    Loading the library creates no CUDA context.
    """
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return None


def touch_torch_device(device: str | None) -> int:
    """Let torch initialise CUDA and the device's primary context; the device index."""
    import torch

    if not torch.cuda.is_available():
        raise unavailable("torch sees no CUDA device (torch.cuda.is_available() is False)")
    dev = torch.device(device or "cuda")
    if dev.type != "cuda":
        raise unavailable(f"device {str(dev)!r} is not a CUDA device")
    try:
        torch.cuda.init()
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        with torch.cuda.device(index):
            torch.empty(1, device=f"cuda:{index}")  # forces the primary context
    except Exception as exc:  # torch raises RuntimeError/AssertionError flavours here
        raise unavailable(f"torch could not initialise CUDA ({_first_line(exc)})") from None
    return int(index)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class CudaVmmBackend(TrackedBackend):
    """CUDA VMM primitives on one device (``device``: ``cuda``, ``cuda:N`` or ``None``)."""

    name = "cuda-vmm"
    info = BackendInfo(
        elastic=True,
        granularity_default=2 << 20,  # cuMemGetAllocationGranularity(MINIMUM) on current GPUs
        devices=("cuda",),
        plugin=True,
        summary="CUDA virtual memory management through cuda-python",
        maps_beside_compute=True,
    )
    reserve_commits = False
    fresh_memory_is_zero = False
    call_names = {  # noqa: RUF012
        "granularity": "cuMemGetAllocationGranularity",
        "reserve": "cuMemAddressReserve",
        "create": "cuMemCreate",
        "map": "cuMemMap",
        "set_access": "cuMemSetAccess",
        "zero": "cuMemsetD8Async",
        "synchronize": "torch.cuda.synchronize",
        "wait_zeroed": "cuStreamSynchronize",
        "wrap": "torch storage from pointer",
        "unmap": "cuMemUnmap",
        "release": "cuMemRelease",
        "free": "cuMemAddressFree",
    }

    @classmethod
    def available(cls) -> str | None:
        """cuda-python importable and the CUDA driver library loadable (no context made)."""
        if not (_find_spec("cuda.bindings") or _find_spec("cuda.cuda")):
            return "cuda-python is not installed (pip install cuda-python)"
        if cuda_driver_library() is None:
            return "no CUDA driver library (libcuda.so.1) can be loaded"
        return None

    def __init__(
        self, *, device: str | None = None, wrap_route: str = "auto", unbacked: str = "fault"
    ) -> None:
        check_unbacked("cuda-vmm", unbacked)
        self.unbacked = unbacked
        self._scratch: Any = None
        """The scratch granule's handle (``unbacked="scratch"``), created on first use."""
        self._scratch_zeroed = False
        self._scratch_at: set[int] = set()
        """Granule addresses the scratch granule is mapped at."""
        self._unfilled: dict[int, int] = {}
        """Ranges unmapped whose scratch refill failed (address → size); ``unmap`` retries."""
        self._gran = 0
        self._zero_stream: Any = None
        """The stream :meth:`zero` queues on (made on first use): a non-blocking stream of
        its own, so zeroing fresh chunks -- on a worker's mapping thread while a forward
        runs -- neither waits for that forward nor makes it wait."""
        self._stream_lock = threading.Lock()
        drv = load_driver()
        index = touch_torch_device(device)
        super().__init__()
        import torch

        self._torch = torch
        self._drv = drv
        self.wrap_route = wrap_route
        self.index = index
        self.device = f"cuda:{index}"
        self._retained = False
        ok = drv.CUresult.CUDA_SUCCESS
        self._ok = ok
        try:
            (err,) = drv.cuInit(0)
        except Exception as exc:  # e.g. the driver library cannot be loaded
            raise unavailable(f"cuInit failed ({_first_line(exc)})") from None
        if err != ok:
            raise unavailable(f"cuInit returned {self._err_text(err)}")
        err, self._cudev = drv.cuDeviceGet(index)
        if err != ok:
            raise unavailable(f"cuDeviceGet({index}) returned {self._err_text(err)}")
        attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        err, vmm = drv.cuDeviceGetAttribute(attr, self._cudev)
        if err != ok or not vmm:
            raise unavailable(f"device {index} does not support virtual memory management")
        err, self._primary = drv.cuDevicePrimaryCtxRetain(self._cudev)
        if err != ok:
            raise unavailable(f"cuDevicePrimaryCtxRetain returned {self._err_text(err)}")
        self._retained = True
        self._ensure_ctx()

        prop = drv.CUmemAllocationProp()
        prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = index
        self._prop = prop
        desc = drv.CUmemAccessDesc()
        desc.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = index
        desc.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._access = [desc]

    # -- helpers --------------------------------------------------------------------------
    def _err_text(self, err: Any) -> str:
        try:
            _, name = self._drv.cuGetErrorName(err)
            _, text = self._drv.cuGetErrorString(err)
            return f"{name.decode()} ({text.decode()})"
        except Exception:
            return str(err)

    def _check(self, call: str, result: Any, what: str) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if err != self._ok:
            raise BackendCallError(call, f"{what}: {self._err_text(err)}")
        if isinstance(result, tuple):
            return result[1] if len(result) == 2 else result[1:]
        return None

    def _ensure_ctx(self) -> None:
        """Make the primary context current on this thread (never create a context)."""
        err, current = self._drv.cuCtxGetCurrent()
        if err == self._ok and int(current) == int(self._primary):
            return
        self._check("cuCtxSetCurrent", self._drv.cuCtxSetCurrent(self._primary), "primary")

    # -- protocol -------------------------------------------------------------------------
    def granularity(self) -> int:
        return self._granule()

    def _granule(self) -> int:
        """The minimum granularity (queried once; not a counted call)."""
        if self._gran:
            return self._gran
        flag = self._drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        res = self._drv.cuMemGetAllocationGranularity(self._prop, flag)
        self._gran = int(self._check("cuMemGetAllocationGranularity", res, "minimum"))
        return self._gran

    def reserve(self, size: int, alignment: int) -> int:
        self._ensure_ctx()
        res = self._drv.cuMemAddressReserve(size, alignment, 0, 0)
        ptr = int(self._check("cuMemAddressReserve", res, f"{size} bytes"))
        if self.unbacked == "scratch":
            try:
                self._fill(ptr, size)
            except BaseException:
                self._drv.cuMemAddressFree(ptr, size)
                if not self._reservations:
                    self._release_scratch()
                raise
        self._reservations[ptr] = size
        return ptr

    def create(self, size: int) -> Any:
        err, handle = self._drv.cuMemCreate(size, self._prop, 0)
        if err != self._ok:
            raise BackendCallError("cuMemCreate", f"{size} bytes: {self._err_text(err)}")
        self._handles[int(handle)] = size
        return handle

    def map(self, address: int, size: int, handle: Any) -> None:
        if self.unbacked == "scratch":
            self._clear(address, size)
        (err,) = self._drv.cuMemMap(address, size, 0, handle, 0)
        if err != self._ok:
            if self.unbacked == "scratch":
                self._refill_quietly(address, size)
            raise BackendCallError("cuMemMap", f"{size} bytes: {self._err_text(err)}")
        self._mappings[address] = size
        for start in [a for a in self._unfilled if address <= a < address + size]:
            del self._unfilled[start]

    def set_access(self, address: int, size: int) -> None:
        res = self._drv.cuMemSetAccess(address, size, self._access, 1)
        self._check("cuMemSetAccess", res, f"{size} bytes")

    def _zeroing_stream(self) -> Any:
        with self._stream_lock:  # two caches' threads may zero at once: one stream
            if self._zero_stream is None:
                flag = self._drv.CUstream_flags.CU_STREAM_NON_BLOCKING
                res = self._drv.cuStreamCreate(int(getattr(flag, "value", flag)))
                self._zero_stream = self._check("cuStreamCreate", res, "the zeroing stream")
            return self._zero_stream

    def zero(self, address: int, size: int) -> None:
        self._ensure_ctx()
        res = self._drv.cuMemsetD8Async(address, 0, size, self._zeroing_stream())
        self._check("cuMemsetD8Async", res, f"{size} bytes")

    def wait_zeroed(self) -> None:
        """Wait for the zeroing stream only: a kernel launched after this returns, on any
        stream, reads the zeros (an unmap still waits for the whole device: ``synchronize``)."""
        if self._zero_stream is None:
            return
        self._ensure_ctx()
        res = self._drv.cuStreamSynchronize(self._zero_stream)
        self._check("cuStreamSynchronize", res, "the zeroing stream")

    def synchronize(self) -> None:
        try:
            self._torch.cuda.synchronize(self.index)
        except RuntimeError as exc:
            raise BackendCallError("torch.cuda.synchronize", _first_line(exc)) from exc

    def wrap(self, address: int, size: int) -> Tensor:
        tensor = wrap_device_pointer(address, size, self.device, route=self.wrap_route)
        if tensor.data_ptr() != address:
            raise BackendCallError("wrap", "the tensor is not zero-copy")
        return tensor

    def unmap(self, address: int, size: int) -> None:
        unfilled = address not in self._mappings and self._unfilled.get(address) == size
        if self.unbacked == "scratch" and unfilled:  # an earlier scratch refill failed: retry
            self._fill(address, size, "unmapped before")
            del self._unfilled[address]
            return
        self._check("cuMemUnmap", self._drv.cuMemUnmap(address, size), f"{size} bytes")
        self._mappings.pop(address, None)
        if self.unbacked == "scratch":
            try:
                self._fill(address, size, "unmapped")
            except BackendCallError:
                self._unfilled[address] = size
                raise

    def release(self, handle: Any) -> None:
        (err,) = self._drv.cuMemRelease(handle)
        if err != self._ok:
            raise BackendCallError("cuMemRelease", f"handle: {self._err_text(err)}")
        self._handles.pop(int(handle), None)

    def free(self, address: int, size: int) -> None:
        if self.unbacked == "scratch":
            self._clear(address, size)
            for start in [a for a in self._unfilled if address <= a < address + size]:
                del self._unfilled[start]
        self._check("cuMemAddressFree", self._drv.cuMemAddressFree(address, size), f"{size}")
        self._reservations.pop(address, None)
        if not self._reservations:
            self._release_scratch()

    # -- scratch (unbacked="scratch") -----------------------------------------------------
    def scratch_live(self) -> tuple[int, int]:
        """``(scratch handles held: 0 or 1, granules the scratch granule is mapped at)``."""
        return int(self._scratch is not None), len(self._scratch_at)

    def _scratch_handle(self) -> Any:
        """The one scratch granule (created, mapped once to zero it, on first use)."""
        if self._scratch is not None:
            return self._scratch
        gran = self._granule()
        err, handle = self._drv.cuMemCreate(gran, self._prop, 0)
        if err != self._ok:
            raise BackendCallError("cuMemCreate", f"scratch granule: {self._err_text(err)}")
        self._scratch = handle
        return handle

    def _fill(self, address: int, size: int, what: str = "reserved") -> None:
        """Map the scratch granule over every granule of ``[address, +size)``, read/write.

        All or nothing: on a failure the granules mapped here are unmapped again and
        ``BackendCallError`` names the call.
        """
        self._ensure_ctx()
        handle = self._scratch_handle()
        gran = self._granule()
        done: list[int] = []
        try:
            for at in range(address, address + size, gran):
                (err,) = self._drv.cuMemMap(at, gran, 0, handle, 0)
                if err != self._ok:
                    raise BackendCallError(
                        "cuMemMap",
                        f"scratch granule over {what} [{at:#x}, +{gran}): {self._err_text(err)}",
                    )
                done.append(at)
            res = self._drv.cuMemSetAccess(address, size, self._access, 1)
            self._check("cuMemSetAccess", res, f"scratch over {size} bytes")
            if not self._scratch_zeroed:  # zero the granule once, through its first mapping
                self._check("cuMemsetD8", self._drv.cuMemsetD8(address, 0, gran), "scratch")
                self._check("cuCtxSynchronize", self._drv.cuCtxSynchronize(), "scratch zeroed")
                self._scratch_zeroed = True
        except BaseException:
            for at in done:
                self._drv.cuMemUnmap(at, gran)
            raise
        self._scratch_at.update(done)

    def _clear(self, address: int, size: int) -> None:
        """Unmap the scratch granule wherever it is mapped in ``[address, +size)``."""
        gran = self._granule()
        cleared: list[int] = []
        for at in range(address, address + size, gran):
            if at not in self._scratch_at:
                continue
            (err,) = self._drv.cuMemUnmap(at, gran)
            if err != self._ok:
                for done in cleared:
                    self._refill_quietly(done, gran)
                raise BackendCallError(
                    "cuMemUnmap", f"scratch granule at {at:#x}: {self._err_text(err)}"
                )
            self._scratch_at.discard(at)
            cleared.append(at)

    def _refill_quietly(self, address: int, size: int) -> None:
        """Undo a :meth:`_clear` after a later step failed (best effort: the error in flight
        is the one reported; a range left without scratch is remembered for ``unmap``)."""
        try:
            self._fill(address, size, "restored")
        except Exception:
            self._unfilled[address] = size

    def _release_scratch(self) -> None:
        if self._scratch is None or self._scratch_at:
            return
        (err,) = self._drv.cuMemRelease(self._scratch)
        if err == self._ok:
            self._scratch = None
            self._scratch_zeroed = False

    def mem_info(self) -> tuple[int, int]:
        """``(free, total)`` device memory in bytes (``cuMemGetInfo``)."""
        self._ensure_ctx()
        free, total = self._check("cuMemGetInfo", self._drv.cuMemGetInfo(), "")
        return int(free), int(total)

    def close(self) -> None:
        self._release_scratch()
        if self._zero_stream is not None:
            stream, self._zero_stream = self._zero_stream, None
            self._ensure_ctx()
            self._drv.cuStreamSynchronize(stream)
            self._drv.cuStreamDestroy(stream)
        if self._retained:
            self._retained = False
            self._drv.cuDevicePrimaryCtxRelease(self._cudev)


class _CudaArray:
    """A minimal ``__cuda_array_interface__`` (v3) exporter of ``size`` int8 bytes."""

    def __init__(self, address: int, size: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|i1",
            "data": (address, False),
            "strides": None,
            "version": 3,
        }


def wrap_device_pointer(address: int, size: int, device: str, route: str = "auto") -> Tensor:
    """A non-owning ``int8`` tensor of ``size`` bytes at device ``address`` (zero-copy).

    ``route``: ``storage`` uses torch's storage-from-pointer constructor (no pointer-attribute
    query, so it also works on partly mapped reservations); ``cai`` goes through
    ``__cuda_array_interface__``; ``auto`` tries ``storage`` first.
    """
    import torch

    construct = getattr(torch._C, "_construct_storage_from_data_pointer", None)
    if route == "storage" and construct is None:
        raise BackendCallError("wrap", "this torch has no _construct_storage_from_data_pointer")
    if construct is not None and route in ("auto", "storage"):
        try:
            storage = construct(address, torch.device(device), size)
            out = torch.empty(0, dtype=torch.int8, device=device)
            return out.set_(storage, 0, (size,), (1,))
        except (TypeError, RuntimeError):
            if route == "storage":
                raise
    return torch.as_tensor(_CudaArray(address, size), device=device)
