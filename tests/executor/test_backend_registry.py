"""The backend registry: capabilities on the class, one call log, and a new backend usable
from the CLI, the plugin settings and ``kvplan doctor`` without editing another module."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.executor import _plans as plans
from kvplan.executor.backends import (
    BACKENDS,
    PRIMITIVES,
    BackendInfo,
    FaultyBackend,
    backend_class,
    backend_info,
    backend_names,
    create_backend,
    register_backend,
)
from kvplan.executor.backends.meta import MetaBackend
from kvplan.schemas.errors import Code, KVPlanError
from kvplan.schemas.loading import dump

cli = CliRunner()


class WrappedMeta(MetaBackend):
    """A thin wrapper over ``meta`` that claims it can hold a vLLM cache (for the test)."""

    name = "wrapped-meta"
    info = dataclasses.replace(MetaBackend.info, plugin=True, summary="meta, wrapped by a test")
    made = 0

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        WrappedMeta.made += 1


@pytest.fixture
def wrapped() -> Iterator[str]:
    register_backend("wrapped-meta", WrappedMeta)
    yield "wrapped-meta"
    del BACKENDS["wrapped-meta"]


def test_registry_lists_every_backend_with_its_capabilities() -> None:
    assert backend_names() == ("meta", "torch", "host-vmm", "cuda-vmm")
    assert backend_names(plugin=True) == ("torch", "host-vmm", "cuda-vmm")
    assert not backend_info("torch").elastic and backend_info("torch").pooled_allocation_ok
    assert all(backend_info(n).elastic for n in ("meta", "host-vmm", "cuda-vmm"))
    assert backend_info("cuda-vmm").granularity_default == 2 << 20
    assert backend_info("host-vmm").accepts_device("cpu")
    assert not backend_info("host-vmm").accepts_device("cuda:1")
    assert backend_info("torch").accepts_device("cuda:1")
    assert all(isinstance(backend_info(n), BackendInfo) for n in backend_names())
    with pytest.raises(KVPlanError) as info:
        backend_info("nope")
    assert info.value.code is Code.BACKEND_UNAVAILABLE and "host-vmm" in str(info.value)


@pytest.mark.parametrize("name", ["meta", "torch", "host-vmm"])
def test_granularity_default_is_what_a_created_backend_reports(name: str) -> None:
    assert backend_class(name).available() is None
    backend = create_backend(name)
    assert backend.granularity() == backend_info(name).granularity_default
    assert backend.info is backend_info(name)


def test_every_primitive_is_counted_once() -> None:
    backend = create_backend("host-vmm")
    backend.granularity()
    address = backend.reserve(1 << 16, 1 << 12)
    handle = backend.create(1 << 16)
    backend.map(address, 1 << 16, handle)
    backend.set_access(address, 1 << 16)
    backend.zero(address, 1 << 16)
    backend.synchronize()
    backend.wait_zeroed()
    assert backend.wrap(address, 1 << 16).numel() == 1 << 16
    backend.unmap(address, 1 << 16)
    backend.release(handle)
    backend.map_run(address, 1 << 16)  # host-vmm backs runs of chunks too (maps_runs)
    backend.unmap_run(address, 1 << 16)
    backend.free(address, 1 << 16)
    assert backend.calls.counts == dict.fromkeys(PRIMITIVES, 1)
    assert backend.calls.total == len(PRIMITIVES) and backend.live().clean


def test_an_override_calling_super_counts_once_and_a_failing_call_counts() -> None:
    class Noisy(MetaBackend):
        def reserve(self, size: int, alignment: int) -> int:
            return super().reserve(size, alignment)

        def map(self, address: int, size: int, handle: Any) -> None:
            raise RuntimeError("boom")

    backend = Noisy()
    address = backend.reserve(4096, 4096)
    with pytest.raises(RuntimeError):
        backend.map(address, 4096, 1)
    assert backend.calls.counts == {"reserve": 1, "map": 1}
    backend.reserve(4096, 4096)  # the in-primitive flag was reset by the failure
    assert backend.calls.counts["reserve"] == 2


def test_faulty_backend_counts_and_fails_through_the_same_log() -> None:
    inner = MetaBackend()
    faulty = FaultyBackend(inner, fail_at=1)
    assert faulty.info is inner.info
    faulty.granularity()
    with pytest.raises(Exception, match="injected failure at call #1"):
        faulty.reserve(4096, 4096)
    assert faulty.calls.total == 2 and inner.calls.counts == {"granularity": 1}


def test_registered_backend_is_usable_from_apply_cli(wrapped: str, tmp_path: Path) -> None:
    from kvplan.cli import app

    plan = tmp_path / "plan.json"
    dump(plans.llama_plan(), plan)
    before = WrappedMeta.made
    result = cli.invoke(app, ["apply", str(plan), "--backend", wrapped, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["backend"] == "wrapped-meta"
    assert WrappedMeta.made == before + 1
    unknown = cli.invoke(app, ["apply", str(plan), "--backend", "nope"])
    assert unknown.exit_code == 2 and wrapped in unknown.output


def test_registered_backend_is_accepted_by_the_plugin_settings(wrapped: str) -> None:
    from kvplan.integrations.vllm.plugin._preflight import read_mode

    settings, _, problems = read_mode({"KVPLAN_ENABLE": "1", "KVPLAN_BACKEND": wrapped})
    assert problems == [] and settings.backend == wrapped
    elastic, mode, problems = read_mode({"KVPLAN_BACKEND": wrapped, "KVPLAN_MODE": "elastic"})
    assert problems == [] and elastic.mode == mode.name == "elastic"  # meta maps on demand
    _, _, problems = read_mode({"KVPLAN_BACKEND": "meta"})  # meta holds no vLLM cache
    assert [p.location for p in problems] == ["KVPLAN_BACKEND"]
    assert wrapped in str(problems[0].hint)


@pytest.mark.vllm
def test_registered_backend_is_shown_by_doctor(
    wrapped: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvplan.cli import app

    for name, value in (("VLLM_LOGGING_LEVEL", "ERROR"), ("KVPLAN_ENABLE", "1"),
                        ("KVPLAN_BACKEND", wrapped)):  # fmt: skip
        monkeypatch.setenv(name, value)
    result = cli.invoke(app, ["doctor", "--json"])
    report = json.loads(result.stdout)
    rows = {row["name"]: row for row in report["backends"]}
    assert rows[wrapped] == {**rows[wrapped], "available": True, "devices": ["meta"]}
    assert report["backend"] == {
        "name": wrapped,
        "available": True,
        "detail": "meta, wrapped by a test",
    }
    assert result.exit_code == 0, result.stdout
    text = cli.invoke(app, ["doctor"]).stdout
    assert f"* {wrapped}" in text and "meta, wrapped by a test" in text
