"""The executor on plans made by ``kvplan.plan`` from vLLM-shaped input documents."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import kvplan
from harness import _builders as builders
from harness.executor._patterns import fill_pattern, vanilla
from kvplan.executor import apply, verify
from kvplan.planner.page_index import PageIndex
from kvplan.schemas.input import InputDocument
from kvplan.schemas.plan import BindingPlan
from tests.executor.test_page_index import as_bytes, brute_force

DOCS: dict[str, Callable[[], dict[str, Any]]] = {
    "llama": lambda: builders.llama(num_blocks=32),
    "llama-BLNHC": lambda: builders.llama(num_blocks=32, layout="BLNHC"),
    "gemma4-e2b": lambda: builders.gemma4_e2b(num_blocks=32),
    "gemma4-e2b-BLNHC": lambda: builders.gemma4_e2b(layout="BLNHC", num_blocks=32),
    "mamba-hybrid": lambda: builders.mamba_hybrid(num_blocks=8),
    "mla": lambda: builders.mla(),
}


@pytest.fixture(params=sorted(DOCS))
def planned(request: pytest.FixtureRequest) -> BindingPlan:
    return kvplan.plan(InputDocument.model_validate(DOCS[request.param]()))


def test_apply_and_verify(planned: BindingPlan) -> None:
    raw, ref = vanilla(planned)
    fill_pattern(planned, ref)
    for backend in ("meta", "torch", "host-vmm"):
        with apply(planned, backend=backend) as cache:
            assert verify(planned, cache.tensors, pools=cache.pools) == []
            assert len(cache.tensors) == len(planned.layers)
            if backend != "meta":
                fill_pattern(planned, cache.tensors)
                for name, want in raw.items():
                    assert torch.equal(cache.pools[name], want)


def test_page_index_matches_brute_force(planned: BindingPlan) -> None:
    index = PageIndex(planned)
    for b in (0, index.num_blocks // 2, index.num_blocks - 1):
        got = {k: as_bytes(v) for k, v in index.block_ranges(b).items()}
        assert got == brute_force(planned, b)


def test_elastic_blocks_are_usable(planned: BindingPlan) -> None:
    with apply(planned, backend="host-vmm", mode="elastic", chunk_size=4096) as cache:
        index = PageIndex(planned)
        blocks = [1, index.num_blocks - 1]
        cache.ensure_mapped(blocks)
        want = sum(
            len({c for s, e in r for c in range(s // 4096, (e - 1) // 4096 + 1)})
            for r in index.blocks_ranges(blocks).values()
        )
        assert sum(cache.mapped_chunks.values()) == want
        for view in planned.views:
            t = cache.tensors[view.layer]
            ratio = t.shape[0] // index.num_blocks if index.num_blocks else 1
            for b in blocks:
                rows = t[b * ratio : (b + 1) * ratio]
                rows.fill_(1)
                assert bool((rows == 1).all())
