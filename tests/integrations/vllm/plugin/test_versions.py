"""Version adapters: discovery, the supported range, per-release refusals, and the plugin's
rank and host-vmm checks."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvplan.integrations.vllm import plugin, versions
from kvplan.integrations.vllm.versions import adapter_for, all_adapters, supported_range
from kvplan.schemas.errors import Code, KVPlanError
from tests.integrations.vllm.plugin._models import ModelCase
from tests.integrations.vllm.plugin._runners import (
    HAS_V1,
    RUNNER_PATHS,
    import_runners,
    via_v2,
)
from tests.integrations.vllm.plugin.conftest import LoadPlugin

pytestmark = pytest.mark.vllm


def _text(exc: KVPlanError) -> str:
    """Every diagnostic of ``exc``, rendered (the exception's own text is a bounded summary)."""
    return "\n".join(d.render() for d in exc.diagnostics)


def test_registry_api() -> None:
    names = [a.name for a in all_adapters()]
    assert names == ["vllm-0.29", "vllm-0.30-0.31", "vllm-0.32-0.33", "vllm-0.34"]
    adapter = adapter_for("0.33.0")
    assert adapter is not None and adapter.releases == ("0.32", "0.33")
    assert adapter.form == "placement"
    assert adapter_for("0.32.1rc1.dev4+g12") is adapter
    for release, name in (
        ("0.29.0", "vllm-0.29"), ("0.30.1", "vllm-0.30-0.31"), ("0.34.0", "vllm-0.34"),
        ("0.34.2rc1", "vllm-0.34"),
    ):  # fmt: skip
        found = adapter_for(release)
        assert found is not None and found.name == name and found.form == "placement"
    assert adapter_for("0.31.0") is adapter_for("0.30.0")
    for unsupported in ("0.28.0", "0.35.0", "garbage"):
        assert adapter_for(unsupported) is None
    assert supported_range() == "0.29–0.34"
    v1_entry = "vllm.v1.worker.gpu_model_runner.GPUModelRunner.initialize_kv_cache"
    for each in all_adapters():
        runners = {t.name: t.runner for t in each.targets if t.role in ("runner", "tensors")}
        if each.name == "vllm-0.34":  # the V1 runner is gone: nothing of its module is read
            assert not [t for t in each.targets if t.module == "vllm.v1.worker.gpu_model_runner"]
            cpu = "vllm.v1.worker.cpu.standalone_model_runner.StandaloneCPUModelRunner"
            assert runners[f"{cpu}.initialize_kv_cache"] == "V2"
        else:
            assert runners[v1_entry] == "V1"
        assert runners["vllm.v1.worker.gpu.model_runner.GPUModelRunner.initialize_kv_cache"] == "V2"
        assert all(t.handler is not None for t in each.targets if t.patched)


def test_every_supported_release_replays_its_engine_core() -> None:
    """``kvplan inspect`` builds models on every release the plugin supports; what differs
    is declared (the replays run against the real releases in tests/engine/test_differential)."""
    planned = {r: a.engine_core_planning(f"{r}.0") for a in all_adapters() for r in a.releases}
    assert list(planned) == ["0.29", "0.30", "0.31", "0.32", "0.33", "0.34"]
    assert all(p is not None for p in planned.values())
    no_hash = [r for r, p in planned.items() if p is not None and not p.resolves_hash_block_size]
    assert no_hash == ["0.29", "0.30", "0.31"]  # no resolve_cache_hit_alignment_tokens there
    all_groups = [
        r for r, p in planned.items() if p is not None and not p.block_size_of_cacheable_groups
    ]
    assert all_groups == ["0.29"]  # its block size is the smallest of every group's


_V2_INIT = "init_kv_cache"
_COMMON = (
    "vllm.v1.worker.utils.allocate_kv_cache",
    "vllm.v1.worker.gpu_model_runner.allocate_kv_cache",
    "vllm.v1.worker.gpu.attn_utils.allocate_kv_cache",
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner.initialize_kv_cache",
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner.initialize_kv_cache_tensors",
    "vllm.v1.worker.gpu.model_runner.GPUModelRunner.initialize_kv_cache",
    "vllm.v1.worker.gpu.attn_utils.init_kv_cache",
    "vllm.v1.worker.gpu.model_runner.init_kv_cache",
    "vllm.v1.worker.gpu.attn_utils.get_shared_kv_cache_layers",
    "vllm.v1.worker.gpu_worker.Worker.execute_model",
)


@pytest.mark.parametrize(
    ("release", "v2_init", "hisparse"),
    [
        (
            "0.29",
            "(runner_kv_caches, forward_context, kv_cache_config, device, kernel_block_sizes, "
            "vllm_config, kv_cache_allocation_context)",
            False,
        ),
        (
            "0.31",
            "(forward_context, kv_cache_config, device, kernel_block_sizes, vllm_config, "
            "kv_cache_allocation_context, *block_tables)",
            True,
        ),
        (
            "0.33",
            "(forward_context, kv_cache_config, device, kernel_block_sizes, vllm_config, "
            "kv_cache_allocation_context, *block_tables, *attn_groups)",
            True,
        ),
    ],
)
def test_each_adapter_declares_its_release_targets(
    release: str, v2_init: str, hisparse: bool
) -> None:
    """The targets as read from each release's wheel (docs/integration.md): the same
    allocation and runner functions; init_kv_cache's signature differs; 0.29 has no HiSparse."""
    adapter = adapter_for(release)
    assert adapter is not None
    names = [t.name for t in adapter.targets]
    assert set(_COMMON) <= set(names)
    assert ("vllm.v1.hisparse.binding.allocate_kv_cache" in names) is hisparse
    elastic = [t for t in adapter.targets if t.elastic_only]
    assert adapter.elastic  # elastic serving: every release, 0.29-0.34
    assert len(names) == len(_COMMON) + hisparse + len(elastic)
    for target in adapter.targets:
        if target.qualname == "request_memory":  # the start-up guard: 0.32 added a parameter
            params = ("init_snapshot", "cache_config")
            assert (
                target.params
                == (*params, "external_weight_memory")[: 3 if release == "0.33" else 2]
            )
        elif target.qualname == _V2_INIT:
            assert target.expected_signature == v2_init
            assert target.calls == ("allocate_kv_cache", "get_shared_kv_cache_layers")
        else:
            same = versions.adapter_for("0.33").target(target.name)  # type: ignore[union-attr]
            assert target == same
            # 0.29 has no has_layer_views: its allocate handler views every spec's layers.
            if release != "0.29" or target.role != "allocate":
                assert target.handler is same.handler


_ALLOC_034 = "(kv_cache_config, device, layout, kernel_block_sizes, allocate)"
_V2_INIT_034 = (
    "(forward_context, kv_cache_config, device, kernel_block_sizes, vllm_config, "
    "kv_cache_allocation_context, *block_tables, *attn_groups, *allocate)"
)
_CPU_INIT_034 = (
    "(forward_context, kv_cache_config, device, kernel_block_sizes, vllm_config, "
    "kv_cache_allocation_context, *attn_groups)"
)
_V034_TARGETS = {
    "vllm.config.vllm.VllmConfig._resolve_extensible_kv_cache": ("(self)", ()),
    "vllm.v1.worker.utils.allocate_kv_cache": (_ALLOC_034, ()),
    "vllm.v1.worker.gpu.attn_utils.allocate_kv_cache": (_ALLOC_034, ()),
    "vllm.v1.worker.cpu.attn_utils.allocate_kv_cache": (_ALLOC_034, ()),
    "vllm.v1.hisparse.binding.allocate_kv_cache": (_ALLOC_034, ()),
    "vllm.v1.worker.gpu.model_runner.GPUModelRunner.initialize_kv_cache": (
        "(self, kv_cache_config, is_profiling, kv_cache_allocation_context, extensible)",
        ("init_kv_cache",),
    ),
    "vllm.v1.worker.cpu.standalone_model_runner.StandaloneCPUModelRunner.initialize_kv_cache": (
        "(self, kv_cache_config, is_profiling, kv_cache_allocation_context)", ("init_kv_cache",),
    ),
    "vllm.v1.worker.gpu.attn_utils.init_kv_cache": (
        _V2_INIT_034, ("allocate_kv_cache", "bind_kv_caches"),
    ),
    "vllm.v1.worker.gpu.model_runner.init_kv_cache": (
        _V2_INIT_034, ("allocate_kv_cache", "bind_kv_caches"),
    ),
    "vllm.v1.worker.cpu.attn_utils.init_kv_cache": (
        _CPU_INIT_034, ("allocate_kv_cache", "get_shared_kv_cache_layers"),
    ),
    "vllm.v1.worker.cpu.standalone_model_runner.init_kv_cache": (
        _CPU_INIT_034, ("allocate_kv_cache", "get_shared_kv_cache_layers"),
    ),
    "vllm.v1.worker.gpu.attn_utils.get_shared_kv_cache_layers": ("(vllm_config)", ()),
    "vllm.v1.worker.cpu.attn_utils.get_shared_kv_cache_layers": ("(vllm_config)", ()),
    "vllm.v1.worker.gpu_worker.Worker.execute_model": (
        "(self, scheduler_output)", ("execute_model",),
    ),
}  # fmt: skip
"""vLLM 0.34's targets as read from its wheel: (signature, the calls each must still make)."""


def test_release_0_34_declares_the_v2_and_cpu_targets() -> None:
    """0.34 (docs/integration.md): no V1 runner; allocate_kv_cache gains ``allocate``, the V2
    runner ``extensible``; the CPU build's init_kv_cache and standalone runner are sites; the
    elastic targets are 0.33's."""
    adapter = adapter_for("0.34")
    previous = adapter_for("0.33")
    assert adapter is not None and previous is not None
    eager = {t.name: t for t in adapter.targets if not t.elastic_only}
    assert set(eager) == set(_V034_TARGETS)
    for name, (signature, calls) in _V034_TARGETS.items():
        assert (eager[name].expected_signature, eager[name].calls) == (signature, calls), name
    assert [t for t in adapter.targets if t.elastic_only] == [
        t for t in previous.targets if t.elastic_only
    ]


def test_field_tables_of_the_older_releases() -> None:
    a29, a31, a33, a34 = all_adapters()
    assert a29.fields_absent_in("0.29.0") == {
        "KVCacheConfig": {
            "hash_block_size": None,
            "cache_hit_alignment_tokens": None,
            "hisparse_host_num_blocks": None,
            "hisparse_host_block_stride": None,
            "hisparse_shared_host_pool": False,
            "kv_tp_replicas": 1,
        },
        "KVCacheTensor": {"host_resident": False},
        "KVCacheGroupSpec": {"host_resident": False, "role": "DEFAULT"},
        "KVCacheSpec": {"is_draft": False, "dcp_sharded": False, "block_stride_alignment": None},
        "AttentionSpec": {"dcp_sharded": True, "max_tp_shards": None},
        "MLAAttentionSpec": {
            "topk_buffer_width": None,
            "storage_block_size": None,
            "cache_role": "SPARSE",
            "is_index_group_leader": False,
        },
        "SlidingWindowMLASpec": {"bounded_replay": False},
        "MambaSpec": {"prefill_checkpoint_alignment": None},
    }
    assert a31.fields_absent_in("0.31.0") == {
        "KVCacheConfig": {"hash_block_size": None, "cache_hit_alignment_tokens": None},
        "KVCacheSpec": {"is_draft": False},
        "MLAAttentionSpec": {"topk_buffer_width": None},
    }
    in_030 = a31.fields_absent_in("0.30.0")
    assert in_030["KVCacheConfig"]["kv_tp_replicas"] == 1
    assert in_030["AttentionSpec"] == {"dcp_sharded": True, "max_tp_shards": None}
    assert in_030["SlidingWindowMLASpec"] == {"bounded_replay": False}
    assert "storage_block_size" not in in_030["MLAAttentionSpec"]  # 0.30-0.31 have it
    for release in ("0.32.0", "0.33.0"):
        assert a33.fields_absent_in(release)["MLAAttentionSpec"]["storage_block_size"] is None
    assert a34.fields_absent_in("0.34.0") == {"MLAAttentionSpec": {"storage_block_size": None}}
    assert set(a31.unmodelled_specs) == {"KpoolTailSpec"}
    assert not a29.unmodelled_specs and not a33.unmodelled_specs and not a34.unmodelled_specs


@pytest.fixture
def extra_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A second folder on the versions package's path, discovery cache cleared around it."""
    monkeypatch.setattr(versions, "__path__", [*versions.__path__, str(tmp_path)])
    versions._discover.cache_clear()
    yield tmp_path
    versions._discover.cache_clear()


def test_a_new_release_is_one_new_module(extra_module: Path) -> None:
    (extra_module / "v0_35.py").write_text(
        textwrap.dedent(
            """
            import dataclasses
            from kvplan.integrations.vllm.versions.v0_34 import ADAPTER as _PREVIOUS
            ADAPTER = dataclasses.replace(_PREVIOUS, name="vllm-0.35", releases=("0.35",))
            """
        )
    )
    assert [a.name for a in all_adapters()][-2:] == ["vllm-0.34", "vllm-0.35"]
    adapter = adapter_for("0.35.2")
    assert adapter is not None and adapter.name == "vllm-0.35"
    assert supported_range() == "0.29–0.35"


def test_two_modules_claiming_a_release_is_an_error(extra_module: Path) -> None:
    (extra_module / "v0_33_again.py").write_text(
        "from kvplan.integrations.vllm.versions.v0_33 import ADAPTER\n"
    )
    with pytest.raises(RuntimeError, match="claimed by both"):
        all_adapters()


@pytest.mark.parametrize(
    ("version", "function", "needle"),
    [
        ("0.31.0", "vllm.v1.worker.gpu.attn_utils.init_kv_cache", "*attn_groups"),
        ("0.30.1", "vllm.v1.worker.gpu.model_runner.init_kv_cache", "*attn_groups"),
        ("0.29.0", "vllm.v1.worker.gpu.attn_utils.init_kv_cache", "runner_kv_caches"),
    ],
)
def test_release_whose_functions_differ_is_refused_with_the_difference(
    version: str,
    function: str,
    needle: str,
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0.33's code reported as an older release: that release's adapter expects its own
    init_kv_cache, so the plugin refuses naming the function and the signature."""
    import vllm

    monkeypatch.setattr(vllm, "__version__", version)
    with pytest.raises(KVPlanError) as info:
        load_plugin("torch")
    assert info.value.code is Code.INTEGRATION
    locations = [d.location for d in info.value.diagnostics[1:]]
    assert function in locations
    message = _text(info.value)
    assert version in message and needle in message
    assert not plugin.is_active()


if HAS_V1:  # vLLM 0.33 installed: 0.32 shares its adapter

    def test_release_0_32_binds_with_the_same_adapter(
        model_case: Callable[[str], ModelCase],
        load_plugin: LoadPlugin,
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
    ) -> None:
        """0.32's wrapped functions are 0.33's: the plugin starts, and the document records
        the release it was captured from."""
        import vllm

        import kvplan
        from tests.integrations.vllm.plugin._runners import via_v1

        case = model_case("llama")  # built by 0.33's engine core, before the version is faked
        monkeypatch.setattr(vllm, "__version__", "0.32.0")
        load_plugin("torch", dump_dir=tmp_path)
        _kv, runner = via_v1(case)
        assert plugin.stats()["bound"] == 1
        document = kvplan.load_input(tmp_path / "rank0.input.json")
        assert document.vllm_version == "0.32.0"
        assert kvplan.load_plan(tmp_path / "rank0.plan.json").source.vllm_version == "0.32.0"
        del runner

else:  # vLLM 0.34 on: no V1 runner

    def test_the_v1_runner_is_gone_from_0_34_so_its_code_is_not_0_33(
        load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """0.34's code reported as 0.33: 0.33's adapter wraps the V1 runner, which 0.34 has
        no module for; the plugin refuses naming it and patches nothing."""
        import vllm

        monkeypatch.setattr(vllm, "__version__", "0.33.0")
        with pytest.raises(KVPlanError) as info:
            load_plugin("torch")
        assert info.value.code is Code.INTEGRATION
        locations = [d.location for d in info.value.diagnostics[1:]]
        assert "vllm.v1.worker.gpu_model_runner.allocate_kv_cache" in locations
        assert "0.33.0" in _text(info.value)
        assert not plugin.is_active()


def _no_calls_v1(
    self: Any,
    kv_cache_config: Any,
    kernel_block_sizes: Any,
    kv_cache_allocation_context: Any = None,
) -> dict[str, Any]:
    return {}


def _no_calls_cpu(
    forward_context: Any,
    kv_cache_config: Any,
    device: Any,
    kernel_block_sizes: Any,
    vllm_config: Any,
    kv_cache_allocation_context: Any = None,
    *,
    attn_groups: Any = (),
) -> dict[str, Any]:
    return {}


_STOPS_CALLING = {
    "v1": (
        "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "initialize_kv_cache_tensors",
        _no_calls_v1, "allocate_kv_cache, shared_kv_cache_layers",
    ),
    "cpu": (
        "vllm.v1.worker.cpu.attn_utils", None, "init_kv_cache", _no_calls_cpu,
        "allocate_kv_cache, get_shared_kv_cache_layers",
    ),
}  # fmt: skip
"""Per runner: (module, class, function, a stand-in of the same signature that calls
nothing, what kvplan says it no longer calls)."""


@pytest.mark.parametrize("path", [p for p in RUNNER_PATHS if p in _STOPS_CALLING])
def test_a_runner_function_that_stops_calling_what_kvplan_relies_on_is_refused(
    path: str, load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    module, owner, name, stand_in, calls = _STOPS_CALLING[path]
    import_runners()  # before the stand-in is in place
    holder: Any = importlib.import_module(module)
    if owner is not None:
        holder = getattr(holder, owner)
    monkeypatch.setattr(holder, name, stand_in)
    with pytest.raises(KVPlanError) as info:
        load_plugin("torch")
    assert f"no longer calls {calls}" in _text(info.value)
    assert not plugin.is_active()


def test_unreadable_rank_refuses_instead_of_guessing(
    model_case: Callable[[str], ModelCase],
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    import torch.distributed as dist

    case = model_case("llama")
    assert dist.is_initialized()

    def broken_rank(group: Any = None) -> int:
        raise RuntimeError("the default process group is being torn down")

    monkeypatch.setattr(dist, "get_rank", broken_rank)
    load_plugin("torch", dump_dir=tmp_path)
    with pytest.raises(KVPlanError) as info:
        via_v2(case)
    codes = [d.code for d in info.value.diagnostics]
    assert codes[0] is Code.INTEGRATION and Code.RANK_UNKNOWN in codes
    assert "rank?" in _text(info.value) and "torn down" in _text(info.value)
    assert plugin.stats()["bound"] == 0 and list(tmp_path.iterdir()) == []


def test_host_vmm_needs_a_working_memfd(
    load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from kvplan.executor.backends import backend_class

    assert backend_class("host-vmm").available() is None

    def no_memfd(name: str, flags: int = 0) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    why = backend_class("host-vmm").available()
    assert why is not None and "memfd_create" in why and "not permitted" in why
    with pytest.raises(KVPlanError, match="memfd_create"):
        load_plugin("host-vmm")
    assert not plugin.is_active()


_DEEPSEEK = Path(__file__).parents[4] / "examples/golden/deepseek-ai__DeepSeek-V2-Lite/input.json"


def _with_storage_block_size(document: Any, value: int | None, kernel: list[int] | None) -> Any:
    config = document.kv_cache_config
    group = config.kv_cache_groups[0]
    spec = group.kv_cache_spec.model_copy(update={"storage_block_size": value})
    groups = [group.model_copy(update={"kv_cache_spec": spec})]
    return document.model_copy(
        update={
            "kv_cache_config": config.model_copy(update={"kv_cache_groups": groups}),
            "kernel_block_sizes": kernel,
        }
    )


def test_mla_storage_block_size_is_the_kernel_block_size_of_its_views() -> None:
    """vLLM 0.30-0.31's allocate_kv_cache views an MLA spec with storage_block_size set in
    blocks of that many tokens, whatever kernel_block_sizes says (hand-checked below)."""
    import kvplan
    from kvplan.planner import build_plan

    document = kvplan.load_input(_DEEPSEEK)  # the golden input: vLLM 0.34, 64-token blocks
    num_blocks = document.kv_cache_config.num_blocks  # 38836 blocks of 64 tokens
    assert document.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size == 64
    plain, _ = build_plan(document)
    assert plain is not None
    assert plain.views[0].shape == [num_blocks, 1, 64, 576]
    assert plain.views[0].stride == [36864, 576, 576, 1]  # block_stride 73728 B = 36864 bf16

    for kernel in ([64], None):
        stored, problems = build_plan(_with_storage_block_size(document, 8, kernel))
        assert stored is not None and not [p for p in problems if p.is_error]
        # 8-token views: 8 times the blocks, an eighth of the block stride, same bytes and
        # offsets.
        for view, before in zip(stored.views, plain.views, strict=True):
            assert view.shape == [8 * num_blocks, 1, 8, 576]
            assert view.stride == [4608, 576, 576, 1]
            assert view.offset_bytes == before.offset_bytes
    split, _ = build_plan(_with_storage_block_size(document, None, [8]))
    assert split is not None and [v.shape for v in split.views] == [v.shape for v in stored.views]

    bad, problems = build_plan(_with_storage_block_size(document, 5, [64]))
    assert bad is None or any(p.is_error for p in problems)
    assert any("5" in p.message for p in problems if p.is_error)


def test_storage_block_size_is_written_only_when_set() -> None:
    """Documents of releases without the field keep their bytes and fingerprints."""
    import kvplan
    from kvplan.schemas.canonical import fingerprint, to_json
    from kvplan.schemas.loading import parse_input, parse_text

    document = kvplan.load_input(_DEEPSEEK)
    assert "storage_block_size" not in to_json(document)
    unset = _with_storage_block_size(document, None, document.kernel_block_sizes)
    assert fingerprint(unset) == fingerprint(document)
    stored = _with_storage_block_size(document, 8, document.kernel_block_sizes)
    assert '"storage_block_size": 8' in to_json(stored)
    assert parse_input(parse_text(to_json(stored))) == stored


def test_storage_block_size_cannot_be_rebuilt_on_a_release_without_it() -> None:
    import kvplan
    from kvplan.integrations.vllm import to_vllm

    document = kvplan.load_input(_DEEPSEEK)
    with pytest.raises(KVPlanError) as info:
        to_vllm(_with_storage_block_size(document, 8, document.kernel_block_sizes))
    assert info.value.code is Code.FIELD_NOT_IN_RELEASE
    assert "storage_block_size" in _text(info.value)


def test_a_spec_class_the_release_has_and_kvplan_does_not_model_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    import torch
    import vllm
    from vllm.v1.kv_cache_interface import (
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
        SlidingWindowSpec,
    )

    from kvplan.integrations.vllm import capture

    @dataclasses.dataclass(frozen=True)
    class KpoolTailSpec(SlidingWindowSpec):  # stands in for 0.30-0.31's class of that name
        pass

    spec = KpoolTailSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, sliding_window=128
    )
    config = KVCacheConfig(
        num_blocks=8,
        kv_cache_tensors=[
            KVCacheTensor(size=1 << 20, layers=["a"], layer_stride=1 << 16, block_stride=1 << 12)
        ],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=["a"], kv_cache_spec=spec)],
        kv_cache_layout="LBNHC",
    )
    monkeypatch.setattr(vllm, "__version__", "0.31.0")
    with pytest.raises(KVPlanError) as info:
        capture(config, shared_kv_cache_layers={})
    assert info.value.code is Code.INTEGRATION
    assert "KpoolTailSpec" in _text(info.value) and "0.31.0" in _text(info.value)
    assert info.value.diagnostics[0].location == "kv_cache_config.kv_cache_groups[0].kv_cache_spec"


def test_elastic_mode_refuses_a_release_whose_adapter_declares_no_elastic_targets() -> None:
    """Every release kvplan knows serves elastic mode; an adapter without elastic targets (a
    future release read before its block lifecycle is) is refused up front, ``KVP530``."""
    import dataclasses

    from kvplan.integrations.vllm.elastic import ElasticMode, ElasticSettings

    full = adapter_for("0.31")
    assert full is not None
    eager_only = dataclasses.replace(
        full, targets=tuple(t for t in full.targets if not t.elastic_only)
    )
    mode = ElasticMode(ElasticSettings(), backend="host-vmm")
    assert mode.check(full, "0.31.0") == []
    (refused,) = mode.check(eager_only, "0.31.0")
    assert refused.code is Code.ELASTIC_UNSUPPORTED
    assert "vLLM 0.31.0 (vllm-0.30-0.31) is served in eager mode only" in refused.message
