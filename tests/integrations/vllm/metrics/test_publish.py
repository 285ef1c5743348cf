"""Where the series go: vLLM's registry with one API server, the multiprocess directory in
vLLM's multiprocess metrics mode (one writer), and the stat logger vLLM loads."""

from __future__ import annotations

import importlib.metadata
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from kvplan.elastic.files import write_stats
from kvplan.integrations.vllm import metrics
from kvplan.integrations.vllm.metrics import EngineSource, Reader, file_names, write_samples
from tests.integrations.vllm.metrics._helpers import parse, scrape, stats, write_plan

ROOT = Path(__file__).resolve().parents[4]
ENTRY_POINT = "kvplan.integrations.vllm.metrics.stat_logger:KVPlanStatLogger"


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    metrics.unpublish()
    yield
    metrics.unpublish()


def multiproc_scrape(directory: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return parse(generate_latest(registry).decode())


def without_age(found: dict[str, Any]) -> dict[str, Any]:
    return {k: sorted(map(repr, v)) for k, v in found.items() if "age" not in k}


def test_the_multiprocess_files_read_back_as_the_registry_does(tmp_path: Path) -> None:
    dump, prom = tmp_path / "dump", tmp_path / "prom"
    dump.mkdir()
    prom.mkdir()
    write_stats(dump, stats(rank=0))
    write_stats(dump, stats(rank=1, mapped_bytes=1 << 20))
    reader = Reader()
    reader.add(EngineSource("tiny", "0", dump))
    write_samples(prom, reader.samples(), "kvplan1")
    assert sorted(p.name for p in prom.iterdir()) == sorted(file_names("kvplan1").values())
    assert without_age(multiproc_scrape(prom)) == without_age(scrape(reader))


def test_a_series_that_went_away_leaves_no_stale_value(tmp_path: Path) -> None:
    dump, prom = tmp_path / "dump", tmp_path / "prom"
    dump.mkdir()
    prom.mkdir()
    write_stats(dump, stats(rank=0))
    write_stats(dump, stats(rank=1))
    reader = Reader()
    reader.add(EngineSource("tiny", "0", dump))
    write_samples(prom, reader.samples(), "kvplan1")
    (dump / "rank1.stats.json").unlink()
    write_samples(prom, reader.samples(), "kvplan1")
    found = multiproc_scrape(prom)
    assert {lab["rank"] for lab, _ in found["kvplan_kv_mapped_bytes"]} == {"0"}
    assert {lab["rank"] for lab, _ in found["kvplan_kv_mapped_chunks_total"]} == {"0"}


def test_an_earlier_mirrors_files_go_when_its_process_is_gone(tmp_path: Path) -> None:
    from kvplan.integrations.vllm.metrics._multiproc import remove_dead

    gone = 2**22 + 4321  # above pid_max's default: no such process
    for ident in (f"kvplan{gone}", f"kvplan{os.getpid()}", f"kvplan{os.getppid()}"):
        for name in file_names(ident).values():
            (tmp_path / name).write_bytes(b"")
    (tmp_path / "counter_123.db").write_bytes(b"")  # vLLM's own: never touched
    removed = remove_dead(tmp_path)
    assert sorted(removed) == sorted(file_names(f"kvplan{gone}").values())
    assert len(list(tmp_path.iterdir())) == 7


def test_one_api_server_publishes_in_the_registry(tmp_path: Path) -> None:
    write_plan(tmp_path)
    registry = CollectorRegistry()
    assert metrics.publish(EngineSource("tiny", "0", tmp_path), registry=registry) == "registry"
    again = metrics.publish(EngineSource("tiny", "1", tmp_path), registry=registry)
    assert again == "registry"  # one collector per process
    found = parse(generate_latest(registry).decode())
    assert [lab["engine"] for lab, _ in found["kvplan_kv_reserved_bytes"]] == ["0"]


def test_multiprocess_mode_has_one_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump, prom = tmp_path / "dump", tmp_path / "prom"
    dump.mkdir()
    prom.mkdir()
    write_stats(dump, stats())
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(prom))
    assert metrics.publish(EngineSource("tiny", "0", dump), api_rank=1) is None
    assert list(prom.iterdir()) == []  # API server 1 writes nothing: rank 0 does
    metrics.unpublish()
    assert metrics.publish(EngineSource("tiny", "0", dump), api_rank=0) == "multiprocess"
    found = multiproc_scrape(prom)
    assert found["kvplan_kv_mapped_bytes"][0][1] == stats().mapped_bytes


def _config(name: Any = "tiny", api_rank: int = 0) -> Any:
    return SimpleNamespace(
        model_config=SimpleNamespace(served_model_name=name, model="/models/tiny"),
        parallel_config=SimpleNamespace(_api_process_rank=api_rank),
    )


def test_the_stat_logger_publishes_only_for_an_active_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvplan.integrations.vllm import plugin
    from kvplan.integrations.vllm.metrics import stat_logger
    from kvplan.integrations.vllm.pipeline.settings import Settings

    calls: list[tuple[EngineSource, int]] = []
    monkeypatch.setattr(
        stat_logger, "publish", lambda s, api_rank: calls.append((s, api_rank)) or "registry"
    )
    monkeypatch.setattr(plugin, "active_settings", lambda: None)
    assert stat_logger.KVPlanStatLogger(_config()).published is None
    monkeypatch.setattr(plugin, "active_settings", lambda: Settings(enabled=True))
    assert stat_logger.KVPlanStatLogger(_config()).published is None  # no dump directory
    assert calls == []
    settings = Settings(enabled=True, mode="elastic", dump_dir=tmp_path)
    monkeypatch.setattr(plugin, "active_settings", lambda: settings)
    logger = stat_logger.KVPlanStatLogger(_config(["tiny", "alias"]), engine_index=2)
    assert logger.published == "registry"
    assert calls == [(EngineSource("tiny", "2", tmp_path), 0)]
    logger.record(None, None, None, engine_idx=2)  # per step: nothing
    logger.log_engine_initialized()
    assert len(calls) == 1


def test_vllm_loads_the_stat_logger_from_kvplans_entry_point() -> None:
    from vllm.v1.metrics.loggers import StatLoggerBase, load_stat_logger_plugin_factories

    from kvplan.integrations.vllm.metrics.stat_logger import KVPlanStatLogger

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["vllm.stat_logger_plugins"] == {"kvplan-metrics": ENTRY_POINT}
    found = importlib.metadata.entry_points(group="vllm.stat_logger_plugins")
    assert [e.value for e in found if e.name == "kvplan-metrics"] == [ENTRY_POINT]
    assert issubclass(KVPlanStatLogger, StatLoggerBase)
    assert KVPlanStatLogger in load_stat_logger_plugin_factories()
