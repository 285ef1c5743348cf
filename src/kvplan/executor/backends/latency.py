"""Device-latency emulation for host-vmm (benchmarks only): ``KVPLAN_HOST_VMM_LATENCY``.

On a GPU, mapping memory costs what the driver calls cost per 2 MiB chunk (kvcached's
figures: ``cuMemCreate`` 28 µs, ``cuMemMap`` 3.3 µs, ``cuMemSetAccess`` 60 µs, ``cuMemUnmap``
42 µs on an H100); host-vmm's ``mmap``/``mprotect`` cost a fraction of that. With this
setting, host-vmm waits after each call as long as the device would take for as many bytes,
so a CPU benchmark shows what mapping inside a step would cost on the device -- and what
mapping ahead hides. It is an **emulation**, never a measurement of a GPU: every figure
produced with it must say so (``benchmarks/bench_colocation.py --emulate`` does).

Values: ``h100`` or ``a100`` (kvcached's published per-2 MiB costs), or
``create=US,map=US,set_access=US,unmap=US,release=US`` (microseconds per 2 MiB; missing
calls cost nothing). The wait is proportional to the bytes of the call and paid by
``time.sleep`` once at least half a millisecond is owed (shorter sleeps are not precise), so
the engine's thread waits as it would on the driver, without burning a CPU core.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from kvplan.schemas.errors import Code, KVPlanError, error

ENV_LATENCY = "KVPLAN_HOST_VMM_LATENCY"
CHUNK = 2 << 20
"""The device chunk the published costs are per (CUDA's 2 MiB granularity)."""
CALLS = ("create", "map", "set_access", "unmap", "release")
PROFILES: dict[str, dict[str, float]] = {
    # kvcached benchmarks/bench_layout/H100_results.md and benchmarks/bench_vmm (A100)
    "h100": {"create": 28.0, "map": 3.3, "set_access": 60.0, "unmap": 42.0},
    "a100": {"create": 193.0, "map": 1.45, "set_access": 36.0, "unmap": 25.6},
}
FLUSH_SECONDS = 0.0005
"""Owed waiting is paid once it reaches this much."""
_ITEM = re.compile(r"^([a-z_]+)=([0-9]{1,7}(?:\.[0-9]{1,3})?)$")


@dataclass
class DeviceLatency:
    """Microseconds per 2 MiB for each emulated call, and the waiting owed so far."""

    name: str
    micros: dict[str, float]
    owed: float = 0.0
    waited: float = 0.0
    """Seconds spent waiting in all (for benchmarks)."""

    def charge(self, call: str, size: int) -> None:
        cost = self.micros.get(call)
        if not cost:
            return
        self.owed += cost * 1e-6 * size / CHUNK
        if self.owed >= FLUSH_SECONDS:
            owed, self.owed = self.owed, 0.0
            time.sleep(owed)
            self.waited += owed


def parse_latency(text: str) -> DeviceLatency:
    """``h100``, ``a100`` or ``call=µs,...`` (see the module doc); ``KVP401`` otherwise (the
    backend cannot be created as asked)."""
    value = text.strip().lower()
    if value in PROFILES:
        return DeviceLatency(value, dict(PROFILES[value]))
    micros: dict[str, float] = {}
    for item in value.split(","):
        found = _ITEM.match(item.strip())
        if found is None or found.group(1) not in CALLS:
            raise KVPlanError(
                error(
                    Code.BACKEND_UNAVAILABLE,
                    ENV_LATENCY,
                    f"{ENV_LATENCY}={text!r} is not a latency profile: expected "
                    f"{' or '.join(PROFILES)}, or call=microseconds items separated by commas "
                    f"(calls: {', '.join(CALLS)}).",
                    f"e.g. {ENV_LATENCY}=h100 or {ENV_LATENCY}=map=3.3,set_access=60",
                )
            )
        micros[found.group(1)] = float(found.group(2))
    return DeviceLatency("custom", micros)


def latency_from(env: Mapping[str, str]) -> DeviceLatency | None:
    """The emulation ``env`` asks for (``None``: none)."""
    text = env.get(ENV_LATENCY, "")
    return parse_latency(text) if text.strip() else None
