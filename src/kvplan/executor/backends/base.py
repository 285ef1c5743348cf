"""The backend protocol: the handful of VMM primitives the executor drives.

Modelled on CUDA's virtual memory management (reserve address space, create physical
memory, map it, grant access, unmap, release, free). Backends whose ``reserve`` already
returns committed, zeroed memory (``torch``) set ``reserve_commits`` and the executor
skips the mapping calls. What a backend can do is declared once, on its class, as a
:class:`BackendInfo` (``info``) with a ``available()`` probe; the CLI, the vLLM plugin and
``kvplan doctor`` read both through the registry (:mod:`kvplan.executor.backends`).

Every primitive call is counted in ``calls`` (a :class:`CallLog`):
:class:`TrackedBackend` wraps the primitives its subclasses define, so no primitive counts
itself. Fault injection wraps a backend (:mod:`kvplan.executor.backends.faults`).

Addresses and sizes are plain ``int`` bytes. Handles are opaque backend objects.
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

PRIMITIVES: tuple[str, ...] = (
    "granularity",
    "reserve",
    "create",
    "map",
    "set_access",
    "zero",
    "synchronize",
    "wait_zeroed",
    "wrap",
    "unmap",
    "release",
    "free",
    "map_run",
    "unmap_run",
)
"""The protocol's primitives, each counted in ``calls`` under its own name (``map_run`` and
``unmap_run`` only on backends whose ``maps_runs`` is true: :class:`RunMapping`)."""


@dataclass(frozen=True)
class BackendInfo:
    """What a backend class can do, known without creating it (no device, no context).

    The registry hands it out as ``backend_info(name)``; the CLI, the vLLM plugin settings,
    the plugin's planning and placement checks and ``kvplan doctor`` decide from it instead
    of from backend names.
    """

    elastic: bool
    """Maps and unmaps physical memory on demand (``mode="elastic"``); False when
    ``reserve`` commits everything (``torch``)."""
    granularity_default: int
    """The mapping granularity in bytes when known without a device (``host-vmm``: the OS
    page size; ``cuda-vmm``: 2 MiB, CUDA's minimum on every current GPU; ``torch``: 1).
    A created backend's ``granularity()`` is authoritative."""
    devices: tuple[str, ...]
    """torch device types it binds on (``("cpu",)``, ``("cuda",)``); empty: any device."""
    plugin: bool
    """Can hold a live vLLM KV cache (``meta`` tensors hold no memory: False)."""
    pooled_allocation_ok: bool = False
    """Allocates through torch, so it works inside a vLLM memory pool context (sleep mode,
    CUDA-graph pools); VMM backends bypass torch's allocator and refuse there."""
    summary: str = ""
    """One line for ``kvplan doctor`` and ``--help``: what the backend binds with."""
    lazy_pages: bool = False
    """Mapped memory is committed page by page on first touch unless the backend is made
    with ``populate=True`` (``host-vmm``); CUDA commits it when it is created. Elastic
    serving populates, so a step's forward takes no page faults and a block mapped ahead is
    ready."""
    maps_beside_compute: bool = False
    """A map made on another thread while a step computes takes nothing from that step: the
    device computes while the host thread waits on the driver (``cuda-vmm``). ``host-vmm``'s
    maps take the CPU that computes, so elastic serving maps a busy engine's blocks ahead only
    where this holds -- or where host-vmm emulates a device's latency
    (``KVPLAN_HOST_VMM_LATENCY``: its waits sleep, as a driver's would)."""

    def accepts_device(self, device: object) -> bool:
        """Whether tensors on ``device`` (``cpu``, ``cuda:1``, a ``torch.device``) can be bound."""
        return not self.devices or str(device).split(":")[0] in self.devices


class BackendCallError(Exception):
    """A backend primitive failed; ``call`` names the driver/OS call (``cuMemMap``, ``mmap``)."""

    def __init__(self, call: str, detail: str) -> None:
        self.call = call
        self.detail = detail
        super().__init__(f"{call} failed: {detail}")


class CallLog:
    """Counts primitive calls per op (``counts``) and in total (``total``)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.total = 0

    def __call__(self, op: str) -> None:
        self.total += 1
        self.counts[op] += 1

    def reset(self) -> None:
        self.counts.clear()
        self.total = 0


@dataclass(frozen=True)
class LiveResources:
    """What a backend currently holds: reservations, unreleased handles, mapped ranges."""

    reservations: int
    handles: int
    mappings: int
    reserved_bytes: int
    mapped_bytes: int

    @property
    def clean(self) -> bool:
        return not (self.reservations or self.handles or self.mappings)


@runtime_checkable
class Backend(Protocol):
    """What the executor needs from a memory backend (sizes and addresses in bytes)."""

    name: str
    """Registry name, e.g. ``host-vmm``."""
    info: BackendInfo
    """The class's capabilities (see :class:`BackendInfo`)."""
    device: str
    """torch device string of the tensors it wraps (``cpu``, ``cuda:0``, ``meta``)."""
    reserve_commits: bool
    """``reserve`` returns committed, zeroed memory; the mapping primitives are not used."""
    fresh_memory_is_zero: bool
    """Newly created physical memory reads as zeros (the executor then skips ``zero``)."""
    maps_runs: bool
    """This instance backs a run of chunks in one call (:class:`RunMapping`: ``map_run`` /
    ``unmap_run``) from memory it keeps per reservation, instead of one handle per chunk
    (``create``/``map``/``set_access``/``release``). ``host-vmm`` does unless made with
    ``runs=False`` (the per-chunk path, CUDA's: a CUDA mapping is unmapped whole, so chunks
    that are freed one by one are mapped one by one)."""
    calls: CallLog
    call_names: dict[str, str]
    """Op → the driver/OS call it makes, for error messages (``map`` → ``cuMemMap``)."""

    def granularity(self) -> int:
        """Minimum mapping granularity (bytes); chunk sizes and reservations round up to it."""
        ...

    def reserve(self, size: int, alignment: int) -> int:
        """Reserve ``size`` bytes of address space aligned to ``alignment``; the address."""
        ...

    def create(self, size: int) -> Any:
        """Create ``size`` bytes of physical memory; an opaque handle."""
        ...

    def map(self, address: int, size: int, handle: Any) -> None:
        """Map ``handle`` (from offset 0) at ``[address, address + size)`` (no access yet)."""
        ...

    def set_access(self, address: int, size: int) -> None:
        """Grant read/write to a fully mapped contiguous range."""
        ...

    def zero(self, address: int, size: int) -> None:
        """Fill a mapped, accessible range with zero bytes."""
        ...

    def synchronize(self) -> None:
        """Wait for in-flight work that may touch mapped memory (before unmapping)."""
        ...

    def wait_zeroed(self) -> None:
        """Wait until what :meth:`zero` wrote is in place for any later work on the device
        (after a map zeroes fresh memory): only the zeroing, not the device's other work
        (a forward still running is not waited for; before unmapping: :meth:`synchronize`)."""
        ...

    def wrap(self, address: int, size: int) -> Tensor:
        """A zero-copy ``int8`` tensor of ``size`` bytes at ``address`` (reserved range)."""
        ...

    def unmap(self, address: int, size: int) -> None:
        """Unmap one whole mapping; the range stays reserved (addresses never move)."""
        ...

    def release(self, handle: Any) -> None:
        """Drop the handle; the memory lives on while mapped."""
        ...

    def free(self, address: int, size: int) -> None:
        """Return a whole reservation (everything in it must be unmapped)."""
        ...

    def live(self) -> LiveResources:
        """Resources currently held (for leak checks)."""
        ...

    def close(self) -> None:
        """Drop backend-level state (contexts); resources must already be returned."""
        ...


@runtime_checkable
class RunMapping(Protocol):
    """The primitives of a backend whose ``maps_runs`` is true."""

    def map_run(self, address: int, size: int) -> None:
        """Back ``[address, address + size)`` (inside one reservation, nothing in it mapped)
        with fresh memory and grant read/write: ``create`` + ``map`` + ``set_access`` of
        every chunk in it, in one call."""
        ...

    def unmap_run(self, address: int, size: int) -> None:
        """Give back ``[address, address + size)``, which must be wholly mapped (by one or
        more ``map_run`` calls, or part of one): the memory is freed, the range stays
        reserved."""
        ...


UNBACKED_MODES = ("fault", "scratch")
"""What an elastic VMM backend's unmapped address space does when touched: ``fault``, or
read and write a harmless ``scratch`` page (stray kernel reads of unbacked blocks)."""


def check_unbacked(backend: str, unbacked: str) -> None:
    """Refuse an ``unbacked`` option that is not one of :data:`UNBACKED_MODES` (``KVP401``)."""
    if unbacked not in UNBACKED_MODES:
        from kvplan.schemas.errors import Code, KVPlanError, error

        raise KVPlanError(
            error(
                Code.BACKEND_UNAVAILABLE,
                "backend.unbacked",
                f"{backend} unbacked={unbacked!r} is not one of {', '.join(UNBACKED_MODES)}.",
                "pass unbacked='fault' or unbacked='scratch'",
            )
        )


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is ``>= value``."""
    return -(-value // multiple) * multiple


def next_pow2(value: int) -> int:
    """Smallest power of two ``>= value`` (``1`` for ``value <= 1``)."""
    return 1 << max(0, (value - 1).bit_length())


F = TypeVar("F", bound=Callable[..., Any])


def _counted(op: str, method: F) -> F:
    """``method`` that first logs ``op`` in ``self.calls`` (once, even through ``super()``)."""

    @functools.wraps(method)
    def primitive(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._in_primitive:  # an override calling super(), or one primitive calling another
            return method(self, *args, **kwargs)
        self._log_call(op)
        self._in_primitive = True
        try:
            return method(self, *args, **kwargs)
        finally:
            self._in_primitive = False

    primitive.__kvplan_counted__ = True  # type: ignore[attr-defined]
    return primitive  # type: ignore[return-value]


class CountedBackend:
    """Counts every primitive a subclass defines in ``self.calls`` (see :data:`PRIMITIVES`).

    Subclasses write the primitives plainly; ``__init_subclass__`` wraps each so its call is
    logged before it runs (a failing call counts too). ``_log_call`` is the one place a call
    is seen, so a wrapper can also refuse it there (``FaultyBackend``).
    """

    calls: CallLog
    _in_primitive = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for op in PRIMITIVES:
            method = cls.__dict__.get(op)
            if callable(method) and not getattr(method, "__kvplan_counted__", False):
                setattr(cls, op, _counted(op, method))

    def _log_call(self, op: str) -> None:
        self.calls(op)


class Mappings:
    """A backend's live mappings, ``address -> size``, disjoint, with their starts kept
    sorted: whether a range overlaps one, or how many lie inside a range, is a binary search
    (a pool of thousands of 4 KiB chunks must not make every map scan them all), and their
    bytes are a running sum."""

    __slots__ = ("_sizes", "_starts", "total")

    def __init__(self) -> None:
        self._sizes: dict[int, int] = {}
        self._starts: list[int] = []
        self.total = 0
        """Bytes mapped in all."""

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, address: object) -> bool:
        return address in self._sizes

    def __iter__(self) -> Iterator[int]:
        return iter(self._starts)

    def get(self, address: int, default: int | None = None) -> int | None:
        return self._sizes.get(address, default)

    def __setitem__(self, address: int, size: int) -> None:
        old = self._sizes.get(address)
        if old is None:
            bisect.insort(self._starts, address)
        else:
            self.total -= old
        self._sizes[address] = size
        self.total += size

    def pop(self, address: int, default: int | None = None) -> int | None:
        size = self._sizes.pop(address, None)
        if size is None:
            return default
        del self._starts[bisect.bisect_left(self._starts, address)]
        self.total -= size
        return size

    def __delitem__(self, address: int) -> None:
        if self.pop(address) is None:
            raise KeyError(address)

    def cut(self, address: int, size: int) -> bool:
        """Remove ``[address, address + size)`` from the mappings, splitting those it cuts
        through; ``False`` (nothing changed) unless the range is wholly mapped."""
        starts, sizes, end = self._starts, self._sizes, address + size
        i = bisect.bisect_right(starts, address) - 1
        if i < 0 or starts[i] + sizes[starts[i]] <= address:
            return False
        j, reach = i, starts[i] + sizes[starts[i]]
        while reach < end:  # the mappings after ``i`` must continue the range, gap-free
            j += 1
            if j == len(starts) or starts[j] != reach:
                return False
            reach += sizes[starts[j]]
        first = starts[i]
        for start in starts[i : j + 1]:
            self.total -= sizes.pop(start)
        del starts[i : j + 1]
        if first < address:
            self[first] = address - first
        if reach > end:
            self[end] = reach - end
        return True

    def overlaps(self, address: int, size: int) -> bool:
        """Whether ``[address, address + size)`` overlaps a mapping."""
        i = bisect.bisect_left(self._starts, address + size) - 1
        return i >= 0 and self._starts[i] + self._sizes[self._starts[i]] > address

    def inside(self, address: int, length: int) -> int:
        """How many mappings start inside ``[address, address + length)``."""
        starts = self._starts
        return bisect.bisect_left(starts, address + length) - bisect.bisect_left(starts, address)


class TrackedBackend(CountedBackend):
    """Shared bookkeeping: live reservations, handles and mappings (for ``live()``)."""

    name = "tracked"
    device = "cpu"
    info: BackendInfo
    """Declared by each concrete backend class (the registry refuses a class without it)."""
    reserve_commits = False
    fresh_memory_is_zero = False
    maps_runs = False
    call_names: dict[str, str] = {}  # noqa: RUF012 - overridden per class, never mutated

    @classmethod
    def available(cls) -> str | None:
        """``None`` when this backend can run in this process, else why not (one sentence,
        no trailing period). Cheap, and never creates a CUDA context."""
        return None

    def __init__(self) -> None:
        self.calls = CallLog()
        self._reservations: dict[int, int] = {}
        self._handles: dict[int, int] = {}
        self._mappings = Mappings()
        self._bases: list[int] = []

    def live(self) -> LiveResources:
        return LiveResources(
            reservations=len(self._reservations),
            handles=len(self._handles),
            mappings=len(self._mappings),
            reserved_bytes=sum(self._reservations.values()),
            mapped_bytes=self._mappings.total,
        )

    def _check_reserved(self, call: str, address: int, size: int) -> int:
        """Refuse a range outside every reservation: a binary search over the sorted bases
        (rebuilt when a reservation it does not know is looked for), not a scan per call.
        Returns the base of the reservation holding it."""
        for rebuild in (False, True):
            if rebuild or len(self._bases) != len(self._reservations):
                self._bases = sorted(self._reservations)
            i = bisect.bisect_right(self._bases, address) - 1
            base = self._bases[i] if i >= 0 else None
            length = self._reservations.get(base) if base is not None else None
            if base is not None and length is not None and address + size <= base + length:
                return base
        raise BackendCallError(call, f"[{address:#x}, +{size}) is not inside a reservation")

    def wait_zeroed(self) -> None:
        """Where :meth:`zero` does not queue its writes apart, waiting for them is
        :meth:`synchronize`."""
        self.synchronize()  # type: ignore[attr-defined]  # every concrete backend has it

    def close(self) -> None:
        return None
