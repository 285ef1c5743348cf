"""Executor test helpers: plan builders (see ``_plans.py``), backends, leak checks."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from harness.executor import _plans as plans
from kvplan.schemas.plan import BindingPlan

CPU_BACKENDS = ("meta", "torch", "host-vmm")

PLAN_BUILDERS: dict[str, Callable[[], BindingPlan]] = {
    "llama-layer": lambda: plans.llama_plan(),
    "llama-block": lambda: plans.llama_plan(layout="block"),
    "llama-head": lambda: plans.llama_plan(layout="head", num_blocks=32),
    "llama-kernel-split": lambda: plans.llama_plan(ratio=4),
    "gemma": lambda: plans.gemma_plan(),
    "whole-pool": lambda: plans.whole_pool_plan(),
    "two-pools": lambda: plans.two_pool_plan(),
    "fp32-odd": lambda: plans.llama_plan(
        layers=3, num_blocks=5, kv_heads=1, head=4, dtype="float32"
    ),
}


@pytest.fixture(params=sorted(PLAN_BUILDERS))
def any_plan(request: pytest.FixtureRequest) -> BindingPlan:
    return PLAN_BUILDERS[request.param]()


@pytest.fixture(params=CPU_BACKENDS)
def cpu_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def memfd_lines(name: str) -> list[str]:
    """Lines of /proc/self/maps backed by memfds called ``name``."""
    with open("/proc/self/maps") as fh:
        return [line for line in fh if f"/memfd:{name} " in line]


def mapped_ranges() -> list[tuple[int, int, str]]:
    """``(start, end, perms)`` of every mapping in /proc/self/maps."""
    out = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            out.append((lo, hi, perms))
    return out


def perms_at(address: int) -> str | None:
    """Permissions of the mapping holding ``address`` (None: not mapped at all)."""
    for lo, hi, perms in mapped_ranges():
        if lo <= address < hi:
            return perms
    return None


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Assert the test leaves no extra open file descriptors or memfd mappings behind."""
    before = open_fds()
    yield
    assert open_fds() <= before
    with open("/proc/self/maps") as fh:
        assert not [line for line in fh if "/memfd:kvplan-" in line]
