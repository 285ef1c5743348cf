"""host-vmm's device-latency emulation (``KVPLAN_HOST_VMM_LATENCY``, benchmarks only), and
which backends map beside the compute (``BackendInfo.maps_beside_compute``)."""

from __future__ import annotations

import pytest

from kvplan.executor.backends import backend_info
from kvplan.executor.backends import latency as latency_mod
from kvplan.executor.backends.latency import CHUNK, PROFILES, latency_from, parse_latency
from kvplan.schemas.errors import KVPlanError


def test_profiles_and_custom_items_parse() -> None:
    assert parse_latency(" H100 ").micros == PROFILES["h100"]
    custom = parse_latency("map=3.3,set_access=60")
    assert custom.name == "custom" and custom.micros == {"map": 3.3, "set_access": 60.0}
    assert latency_from({}) is None and latency_from({latency_mod.ENV_LATENCY: " "}) is None


@pytest.mark.parametrize("text", ["h200", "map=", "map=1,zap=2", "map=-1", "map=1e9", "x" * 500])
def test_anything_else_is_refused_with_its_code(text: str) -> None:
    with pytest.raises(KVPlanError) as refused:
        parse_latency(text)
    assert refused.value.diagnostics[0].code.value == "KVP401"


def test_waits_are_proportional_to_the_bytes_and_paid_in_sleeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(latency_mod.time, "sleep", slept.append)
    emulated = parse_latency("map=100,unmap=40")
    emulated.charge("map", CHUNK // 8)  # 12.5 us owed: under the flush, not paid yet
    emulated.charge("set_access", CHUNK)  # not emulated: free
    assert slept == []
    emulated.charge("map", 10 * CHUNK)  # 1 ms more: paid with what was owed
    assert slept == [pytest.approx(1.0125e-3)] and emulated.waited == pytest.approx(1.0125e-3)


def test_only_a_backend_whose_maps_wait_off_the_cpu_maps_beside_the_compute() -> None:
    """``BackendInfo.maps_beside_compute``: cuda-vmm (the GPU computes while the driver's
    calls wait); not host-vmm (its maps take the CPU the forward needs), nor the backends
    that commit everything up front. host-vmm emulating a device counts as one that does:
    ``tests/elastic/test_protocol.py``."""
    assert backend_info("cuda-vmm").maps_beside_compute is True
    for name in ("host-vmm", "torch", "meta"):
        assert backend_info(name).maps_beside_compute is False
