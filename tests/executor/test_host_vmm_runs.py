"""host-vmm backs a run of chunks in one call (``maps_runs``): one memfd per reservation,
``map_run`` maps the run's bytes of it readable and writable, ``unmap_run`` gives any wholly
mapped range back -- part of a run too -- and punches its hole in the file, so the memory is
freed and reads zeros when mapped again. The executor drives a run per call; its per-chunk
path (CUDA's) is tested with ``HostVmmBackend(runs=False)``."""

from __future__ import annotations

import ctypes
import os

import pytest

from harness.executor import _plans as plans
from kvplan.executor import apply
from kvplan.executor.backends.base import BackendCallError, RunMapping
from kvplan.executor.backends.host_vmm import HostVmmBackend
from tests.executor.conftest import memfd_lines, perms_at

PAGE = 4096


def _file_pages(backend: HostVmmBackend) -> int:
    """Pages the reservations' memfds hold (what is really allocated)."""
    return sum(os.fstat(fd).st_blocks * 512 // PAGE for fd in backend._files.values())


def test_a_run_is_one_call_and_any_mapped_piece_can_be_given_back() -> None:
    backend = HostVmmBackend()
    assert isinstance(backend, RunMapping) and backend.maps_runs
    base = backend.reserve(16 * PAGE, PAGE)
    backend.map_run(base, 8 * PAGE)
    assert backend.calls.counts["map_run"] == 1 and "create" not in backend.calls.counts
    assert perms_at(base).startswith("rw") and len(memfd_lines(backend.memfd_name)) == 1
    ctypes.memset(base, 7, 8 * PAGE)
    assert _file_pages(backend) == 8
    backend.unmap_run(base + 2 * PAGE, 3 * PAGE)  # the middle of the run
    assert _file_pages(backend) == 5  # its pages are freed, not kept by the file
    assert backend.live().mappings == 2 and backend.live().mapped_bytes == 5 * PAGE
    assert perms_at(base + 2 * PAGE) is None or not perms_at(base + 2 * PAGE).startswith("rw")
    assert ctypes.string_at(base + PAGE, PAGE) == b"\x07" * PAGE  # the rest keeps its data
    assert ctypes.string_at(base + 5 * PAGE, PAGE) == b"\x07" * PAGE
    backend.map_run(base + 2 * PAGE, 3 * PAGE)  # mapped again: fresh, zero memory
    assert ctypes.string_at(base + 2 * PAGE, 3 * PAGE) == bytes(3 * PAGE)
    backend.unmap_run(base, 8 * PAGE)  # across three mappings
    assert backend.live().mappings == 0 and _file_pages(backend) == 0
    backend.free(base, 16 * PAGE)
    assert backend.live().clean and memfd_lines(backend.memfd_name) == []
    assert backend._files == {}


def test_runs_refuse_overlaps_gaps_and_ranges_outside_a_reservation() -> None:
    backend = HostVmmBackend()
    base = backend.reserve(16 * PAGE, PAGE)
    backend.map_run(base, 4 * PAGE)
    backend.map_run(base + 8 * PAGE, 4 * PAGE)
    with pytest.raises(BackendCallError, match="overlaps"):
        backend.map_run(base + 3 * PAGE, 2 * PAGE)
    with pytest.raises(BackendCallError, match="not wholly mapped"):
        backend.unmap_run(base + 2 * PAGE, 8 * PAGE)  # spans the gap [4, 8)
    with pytest.raises(BackendCallError, match="not inside a reservation"):
        backend.map_run(base + 14 * PAGE, 4 * PAGE)
    assert backend.live().mapped_bytes == 8 * PAGE  # the refusals changed nothing
    with pytest.raises(BackendCallError, match="still inside"):
        backend.free(base, 16 * PAGE)
    backend.unmap_run(base, 4 * PAGE)
    backend.unmap_run(base + 8 * PAGE, 4 * PAGE)
    backend.free(base, 16 * PAGE)
    assert backend.live().clean


def test_scratch_mode_gives_a_run_back_to_readable_zeros() -> None:
    backend = HostVmmBackend(unbacked="scratch")
    base = backend.reserve(8 * PAGE, PAGE)
    backend.map_run(base, 8 * PAGE)
    ctypes.memset(base, 1, 8 * PAGE)
    backend.unmap_run(base, 8 * PAGE)
    assert ctypes.string_at(base, 8 * PAGE) == bytes(8 * PAGE)  # the zero page, not the data
    backend.free(base, 8 * PAGE)


def test_the_executor_maps_a_run_per_call_and_gives_back_exactly_what_blocks_free() -> None:
    """Consecutive blocks of a layer-outermost plan are one run per K/V region: a step's new
    blocks cost a few calls, not a handful per 4 KiB chunk; what ``release_blocks`` frees is
    given back in runs, while the blocks still held keep their data."""
    plan = plans.llama_plan(layers=4, num_blocks=64, block_size=32, kv_heads=2, head=64)
    per_chunk, by_runs = HostVmmBackend(runs=False), HostVmmBackend()
    for backend in (per_chunk, by_runs):
        with apply(plan, backend=backend, mode="elastic") as cache:
            assert cache.ensure_mapped(range(8, 16)) == 8 * 4 * 16 * 1024
            for name in cache.tensors:
                cache.tensors[name][8:16].fill_(3)
            assert cache.release_blocks(range(8, 12)) == 4 * 4 * 16 * 1024
            for name in cache.tensors:
                assert int(cache.tensors[name][12:16].float().mean()) == 3
            assert cache.ensure_mapped(range(8, 12)) == 4 * 4 * 16 * 1024
            for name in cache.tensors:
                assert float(cache.tensors[name][8:12].abs().sum()) == 0
        assert backend.live().clean
    chunks = (8 + 4) * 4 * 16 * 1024 // PAGE  # what the two ensure_mapped calls mapped
    assert per_chunk.calls.counts["create"] == per_chunk.calls.counts["map"] == chunks
    assert by_runs.calls.counts["map_run"] == 2 * 4  # one run per layer and call
    assert "create" not in by_runs.calls.counts


def test_populate_commits_a_run_when_it_is_mapped() -> None:
    """Elastic serving makes host-vmm with ``populate=True`` (``BackendInfo.lazy_pages``): the
    pages exist once mapped, so the forward that first writes them takes no page faults."""
    lazy, eager = HostVmmBackend(), HostVmmBackend(populate=True)
    for backend, pages in ((lazy, 0), (eager, 8)):
        base = backend.reserve(8 * PAGE, PAGE)
        backend.map_run(base, 8 * PAGE)
        assert _file_pages(backend) == pages
        backend.unmap_run(base, 8 * PAGE)
        assert _file_pages(backend) == 0
        backend.free(base, 8 * PAGE)
