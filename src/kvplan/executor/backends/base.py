"""The backend protocol: the handful of VMM primitives the executor drives.

Modelled on CUDA's virtual memory management (reserve address space, create physical
memory, map it, grant access, unmap, release, free). Backends whose ``reserve`` already
returns committed, zeroed memory (``torch``) set ``reserve_commits`` and the executor
skips the mapping calls. Every primitive counts itself in ``calls`` and may be made to fail
by a hook (see :class:`CallLog` and :mod:`kvplan.executor.backends.faults`).

Addresses and sizes are plain ``int`` bytes. Handles are opaque backend objects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

OPS: tuple[str, ...] = (
    "granularity",
    "reserve",
    "create",
    "map",
    "set_access",
    "zero",
    "synchronize",
    "wrap",
    "unmap",
    "release",
    "free",
)
"""Every countable backend primitive, in a typical call order."""


class BackendCallError(Exception):
    """A backend primitive failed; ``call`` names the driver/OS call (``cuMemMap``, ``mmap``)."""

    def __init__(self, call: str, detail: str) -> None:
        self.call = call
        self.detail = detail
        super().__init__(f"{call} failed: {detail}")


CallHook = Callable[[str, int], None]
"""``hook(op, index)`` runs before primitive number ``index`` (0-based); raising fails it."""


class CallLog:
    """Counts primitive calls per op (``counts``) and in total; runs ``hook`` before each."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.total = 0
        self.hook: CallHook | None = None

    def __call__(self, op: str) -> None:
        index = self.total
        self.total += 1
        self.counts[op] += 1
        if self.hook is not None:
            self.hook(op, index)

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
    device: str
    """torch device string of the tensors it wraps (``cpu``, ``cuda:0``, ``meta``)."""
    reserve_commits: bool
    """``reserve`` returns committed, zeroed memory; the mapping primitives are not used."""
    fresh_memory_is_zero: bool
    """Newly created physical memory reads as zeros (the executor then skips ``zero``)."""
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


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is ``>= value``."""
    return -(-value // multiple) * multiple


def next_pow2(value: int) -> int:
    """Smallest power of two ``>= value`` (``1`` for ``value <= 1``)."""
    return 1 << max(0, (value - 1).bit_length())


class TrackedBackend:
    """Shared bookkeeping: live reservations, handles and mappings (for ``live()``)."""

    name = "tracked"
    device = "cpu"
    reserve_commits = False
    fresh_memory_is_zero = False
    call_names: dict[str, str] = {}  # noqa: RUF012 - overridden per class, never mutated

    def __init__(self) -> None:
        self.calls = CallLog()
        self._reservations: dict[int, int] = {}
        self._handles: dict[int, int] = {}
        self._mappings: dict[int, int] = {}

    def live(self) -> LiveResources:
        return LiveResources(
            reservations=len(self._reservations),
            handles=len(self._handles),
            mappings=len(self._mappings),
            reserved_bytes=sum(self._reservations.values()),
            mapped_bytes=sum(self._mappings.values()),
        )

    def _check_reserved(self, call: str, address: int, size: int) -> None:
        for base, length in self._reservations.items():
            if base <= address and address + size <= base + length:
                return
        raise BackendCallError(call, f"[{address:#x}, +{size}) is not inside a reservation")

    def close(self) -> None:
        return None
