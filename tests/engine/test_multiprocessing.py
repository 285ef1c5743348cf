"""vLLM's default executor configuration: ``VLLM_ENABLE_V1_MULTIPROCESSING`` left at 1.

The other engine tests run the engine core in the driver's process. By default vLLM runs it in
a process of its own, and the CPU build then runs the worker in a third one even at TP=1 (its
platform turns the uniprocess executor into the multiprocess one, ``platforms/cpu.py``): the
``SchedulerOutput`` carrying kvplan's elastic operations is pickled to the worker through
vLLM's shared-memory message queue. One driver process (shared with
``test_failed_map_multiprocess``'s TP=1 engines) runs vanilla, kvplan host-vmm eager and
kvplan host-vmm elastic (unbacked memory poisoned) that way; kvplan must give vanilla's tokens,
bind in the worker process (its dumps), and in elastic mode map and give back memory there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.engine.harness import EngineRun, Variant, kvplan_env
from tests.engine._multiproc import (
    MAX_TOKENS,
    NUM_BLOCKS,
    REQUESTS,
    SHARED,
    block_bytes,
    dumped,
    run_mp,
)

KVPLAN = ("host-vmm-eager", "host-vmm-elastic")


def variants(work: Path) -> list[Variant]:
    return [
        Variant("host-vmm-eager", kvplan_env("host-vmm", "eager", work / "dump-eager")),
        Variant("vanilla"),
        Variant(
            "host-vmm-elastic",
            kvplan_env("host-vmm", "elastic", work / "dump-elastic", KVPLAN_POISON="1"),
        ),
    ]


SHARED.contribute(1, variants)


@pytest.fixture(scope="module")
def mp_run(
    engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], EngineRun]:
    """The TP=1 run (shared with ``test_failed_map_multiprocess``: one vanilla for both)."""
    return lambda: SHARED.get(1, engine_python, llama_checkpoint, tmp_path_factory)


def test_kvplan_gives_vanillas_tokens_with_the_default_executor(
    mp_run: Callable[[], EngineRun],
) -> None:
    run = mp_run()
    vanilla = run.tokens("vanilla")
    assert len(vanilla) == REQUESTS and all(len(t) == MAX_TOKENS for t in vanilla)
    for name in KVPLAN:
        assert run.variants[name]["multiprocessing"]
        assert run.tokens(name) == vanilla, name
        assert run.variants[name]["preemptions"] == 0, name
    assert [r["cached"] for r in run.variants["host-vmm-elastic"]["rounds"]] == [
        r["cached"] for r in run.variants["vanilla"]["rounds"]
    ]


def test_the_worker_is_another_process_and_binds_there(mp_run: Callable[[], EngineRun]) -> None:
    run = mp_run()
    for name in KVPLAN:
        dump = run.workdir / f"dump-{name.split('-')[-1]}"
        files = dumped(dump)
        assert {"rank0.input.json", "rank0.plan.json"} <= set(files), sorted(files)
        assert files["rank0.plan.json"]["summary"]["bytes_per_block"] == block_bytes(1)
        # the driver's own process bound nothing: the engine core and worker are vLLM's
        assert run.variants[name]["stats"]["bound"] == 0, name
    stats = dumped(run.workdir / "dump-elastic")["rank0.stats.json"]
    assert stats["pid"] != run.variants["host-vmm-elastic"]["driver_pid"]
    assert stats["num_blocks"] == NUM_BLOCKS
    assert stats["maps"] > 0 and stats["failed_maps"] == 0
    assert 4 * block_bytes(1) <= stats["peak_mapped_bytes"] <= stats["reserved_bytes"] // 4


def test_a_refused_engine_core_shows_kvplans_paragraph_once_before_vllms_traceback(
    engine_python: Path, tmp_path: Path
) -> None:
    """The engine core (a process of vLLM's own) refuses a limit below the floor (``KVP533``):
    vLLM prints ``EngineCore failed to start`` with its traceback and the front end fails with
    ``Engine core initialization failed``; kvplan's paragraphs come first, once, as a block of
    their own (``pipeline.announce``), before any traceback and any other error line."""
    from harness.engine._models import write_model
    from kvplan.integrations.vllm.pipeline.announce import HEADING, RULE

    refused = Variant(
        "too-small",
        kvplan_env("host-vmm", "elastic", tmp_path / "dump", KVPLAN_MEMORY_LIMIT="4096"),
        expect_refusal=True,
    )
    model = write_model("llama", tmp_path / "model")
    run = run_mp(engine_python, model, [refused], tmp_path, engine={"load_format": "dummy"})
    result = run.variants["too-small"]
    assert result["refused"], result
    assert "Engine core initialization failed" in result["error"], result["error"]
    lines = run.log.splitlines()
    headings = [i for i, line in enumerate(lines) if HEADING in line]
    assert len(headings) == 1, run.log[-4000:]
    at = headings[0]
    tracebacks = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    assert tracebacks and at < tracebacks[0], run.log[-4000:]  # vLLM's tracebacks still follow
    errors = [i for i, line in enumerate(lines) if " ERROR " in line or line.startswith("ERROR")]
    assert errors[0] == at, lines[errors[0]]  # the first error line of the output is kvplan's
    # vLLM's log format prefixes every line of the block: "(EngineCore pid=N) ERROR ... [f:n] "
    block = [re.sub(r"^.*? \[[\w.]+:\d+\] ", "", line) for line in lines[at : at + 5]]
    assert block[0] == HEADING and block[1] == RULE and block[4] == RULE, block
    assert block[2].startswith("KVP501 error at kvplan.integrations.vllm.plugin: kvplan refused")
    assert block[3].startswith("KVP533 error at KVPLAN_MEMORY_LIMIT"), block
