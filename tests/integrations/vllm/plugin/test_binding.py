"""The patched vLLM call sites give the same KV caches as vanilla vLLM, layer for layer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvplan.integrations.vllm import plugin
from tests.integrations.vllm.plugin._models import ModelCase
from tests.integrations.vllm.plugin._runners import (
    CPU,
    PATHS,
    RUNNER_PATHS,
    describe,
    storages,
    via_v2,
)
from tests.integrations.vllm.plugin.conftest import LoadPlugin

pytestmark = pytest.mark.vllm

MODEL_NAMES = ("gemma4-e2b", "gemma4-e2b-blhnc", "llama", "mla", "hybrid")


@pytest.mark.parametrize("backend", ["torch", "host-vmm"])
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_same_kv_caches_as_vanilla(
    name: str,
    path: str,
    backend: str,
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
) -> None:
    case = model_case(name)
    call = PATHS[path]
    vanilla, _ = call(case)
    assert plugin.stats()["bound"] == 0

    load_plugin(backend)
    ours, owner = call(case)

    assert plugin.stats()["bound"] == 1, "the call did not bind through kvplan"
    assert list(ours) == list(vanilla)
    assert describe(ours) == describe(vanilla)
    (cache,) = plugin.bound_caches()
    assert cache.backend.name == backend
    (pool,) = cache.pools.values()
    assert storages(ours) == {pool.untyped_storage().data_ptr()}
    assert storages(vanilla).isdisjoint(storages(ours))
    if path != "allocate_kv_cache":
        for sharer, target in case.shared.items():
            assert ours[sharer] is ours[target]
        _assert_layers_bound(case, ours)
    del owner  # a V1 runner owns its cache: it stays mapped until here


def test_paths_are_the_installed_releases_runners() -> None:
    """The V1 runner up to 0.33, the CPU build's init_kv_cache from 0.34 (read from the
    installed release's modules, each path above runs on every release that has it)."""
    import vllm

    release = tuple(int(part) for part in vllm.__version__.split(".")[:2])
    expected = ["v1", "v2"] if release <= (0, 33) else ["v2", "cpu"]
    assert list(RUNNER_PATHS) == expected
    assert sorted(PATHS) == sorted(["allocate_kv_cache", *expected])


def _assert_layers_bound(case: ModelCase, kv: dict[str, torch.Tensor]) -> None:
    """Every layer in the forward context now reads kvplan's memory."""
    lo = min(t.untyped_storage().data_ptr() for t in kv.values())
    hi = lo + max(t.untyped_storage().nbytes() for t in kv.values())
    for name in kv:
        bound = case.forward_context[name].kv_cache
        for tensor in bound if isinstance(bound, tuple) else (bound,):
            assert lo <= tensor.data_ptr() < hi, name


def test_gemma4_sharers_alias_their_targets(
    model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin
) -> None:
    case = model_case("gemma4-e2b")
    assert len(case.shared) == 20
    load_plugin("torch")
    kv, _ = via_v2(case)
    (cache,) = plugin.bound_caches()
    assert {a.layer: a.target for a in cache.plan.aliases} == case.shared
    assert set(kv) == set(cache.plan.layers)


@pytest.mark.parametrize("path", list(RUNNER_PATHS))
def test_elastic_mode_binds_only_the_null_block(
    path: str, model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin
) -> None:
    """Elastic mode backs vLLM's null block at bind; every other block is mapped when a step
    first uses it. Unbacked bytes read as the scratch page (zeros), they never fault."""
    case = model_case("llama")
    call = RUNNER_PATHS[path]
    vanilla, _ = call(case)
    load_plugin("host-vmm", mode="elastic")
    ours, runner = call(case)
    assert describe(ours) == describe(vanilla)
    (cache,) = plugin.bound_caches()
    assert cache.mode == "elastic"
    assert cache.mapped_blocks == frozenset({0})
    assert 0 < cache.mapped_bytes < cache.reserved_bytes // 8
    for tensor in ours.values():
        assert int(tensor.abs().sum()) == 0  # every byte readable: zeros
    del runner


@pytest.mark.parametrize("path", list(RUNNER_PATHS))
def test_profiling_config_is_planned_and_left_to_vllm(
    path: str, model_case: Callable[[str], ModelCase], load_plugin: LoadPlugin
) -> None:
    """vLLM's minimal profiling config (no layout stamped) is planned with the runner's
    layout argument and checked against vLLM's own allocation, which vLLM keeps."""
    import vllm.v1.worker.utils as utils

    from kvplan.integrations.vllm.inspect._build import runner_config

    case = model_case("gemma4-e2b")
    profiling = runner_config(case.profiling_config(), case.shared)
    expected = utils.allocate_kv_cache(profiling, CPU, case.layout, case.kernel_block_sizes)

    load_plugin("host-vmm")
    kv, _ = RUNNER_PATHS[path](case, config=profiling)

    counts = plugin.stats()
    assert (counts["plans"], counts["profiling"], counts["bound"]) == (1, 1, 0)
    assert plugin.bound_caches() == []  # vLLM's own torch.zeros, not a kvplan pool
    assert describe({k: kv[k] for k in expected}) == describe(expected)
    for sharer, target in case.shared.items():
        assert kv[sharer] is kv[target]
