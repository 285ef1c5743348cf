"""A failed map across processes is running out of blocks, as in-process.

With vLLM's multiprocess executor -- its default, and every tensor-parallel engine -- the
scheduler runs in the engine core's process and only the output rank's ``ModelRunnerOutput``
reaches it. So when a map fails on any rank, the ranks first agree on it before the forward
(one gloo all-reduce over the TP group), the ranks that mapped roll back too, the step runs
with those pages unbacked (scratch), and the failure rides on the step's output to the
scheduler, which preempts the requests that used the blocks (design: ``docs/notes/
failed-map-multiprocess.md``). Checked here: requests preempted, the engine alive, tokens as
the reference run's (the same map made, then reported as failed: the same recovery without a
step over unbacked memory), under the default executor at TP=1, and at TP=2 with the failure
on every rank or on rank 1 alone (which the output rank does not see). Under
``KVPLAN_POISON=1`` (unbacked pages fault) the engine stops with ``KVP532`` -- at once, also
when only rank 1 failed (before the agreement, the output rank hung in the forward's
all-reduce).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.engine._worker_hooks import HOOKS_ENV
from harness.engine.cases import IN_STEP
from harness.engine.harness import EngineRun, Variant, kvplan_env
from tests.engine._multiproc import SHARED, dumped, run_mp

FAILED_MAP = 2
"""The map (of each worker, 1-based) that fails: the second maps a block a request grows
into while decoding (the first maps the first round's prompts)."""
FAIL = {"KVPLAN_DEBUG_FAIL_MAP": str(FAILED_MAP), "KVPLAN_MAP_RETRY": "0", **IN_STEP}
STEP_TIMEOUT = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "60"}
"""Were the ranks not to agree, a failure on a rank that is not the output rank would leave
the output rank waiting in the forward's all-reduce until the engine core gives up after
``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` (default 300 s, bounded here so that such a test fails
in a minute rather than five)."""
CASES = {
    "tp1": (1, "every"),
    "tp2-every-rank": (2, "every"),
    "tp2-rank1": (2, "rank1"),
}
"""Case -> (TP size, where the map fails). The cases of one TP size share one driver run
(its vanilla and reference engines are the same), one failing engine per case."""


def failing(where: str) -> str:
    """The variant (and the suffix of its dump directory) whose map fails ``where``."""
    return f"map-fails-{where}"


def variants(work: Path, tp: int) -> list[Variant]:
    def env(name: str, **extra: str) -> dict[str, str]:
        return kvplan_env("host-vmm", "elastic", work / f"dump-{name}", **extra)

    hook = {HOOKS_ENV: f"fail-map=1:{FAILED_MAP}", "KVPLAN_MAP_RETRY": "0", **IN_STEP}
    how = {"every": FAIL, "rank1": hook}  # rank 1 alone: the driver's hook, in that worker
    wheres = [where for size, where in CASES.values() if size == tp]
    return [
        *(Variant(failing(where), env(failing(where), **how[where])) for where in wheres),
        Variant("vanilla"),
        Variant("map-reported", env("reported", **FAIL), reported_map_failure=True),
    ]


for _tp in sorted({size for size, _ in CASES.values()}):
    SHARED.contribute(_tp, lambda work, tp=_tp: variants(work, tp), STEP_TIMEOUT)


@pytest.fixture(scope="module")
def failed_run(
    engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], EngineRun]:
    """The run of a case's TP size (shared with ``test_multiprocessing`` at TP=1 and
    ``test_tensor_parallel`` at TP=2: one vanilla engine for both)."""
    return lambda case: SHARED.get(
        CASES[case][0], engine_python, llama_checkpoint, tmp_path_factory
    )


def _stats(run: EngineRun, dump: str) -> list[dict[str, Any]]:
    files = dumped(run.workdir / dump)
    return [v for k, v in sorted(files.items()) if k.endswith(".stats.json")]


@pytest.mark.parametrize("case", list(CASES))
def test_a_failed_map_is_running_out_of_blocks_across_processes(
    case: str, failed_run: Callable[[str], EngineRun]
) -> None:
    run = failed_run(case)
    name = failing(CASES[case][1])
    failed, reference = run.variants[name], run.variants["map-reported"]
    assert run.tokens(name) == run.tokens("map-reported")
    assert failed["preemptions"] == reference["preemptions"] > 0
    assert run.variants["vanilla"]["preemptions"] == 0
    assert "KVP532" not in run.log
    stats = _stats(run, f"dump-{name}")
    tp = CASES[case][0]
    assert len(stats) == tp
    assert sum(s["failed_maps"] for s in stats) >= 1
    # every rank is back in step with the scheduler: the same mapped bytes afterwards
    assert len({s["mapped_bytes"] for s in stats}) == 1


@pytest.mark.parametrize("case", list(CASES))
def test_the_engine_keeps_serving_after_a_failed_map(
    case: str, failed_run: Callable[[str], EngineRun]
) -> None:
    """The second round (after the failure) is served, from the prefix cache as in the
    reference."""
    run = failed_run(case)
    failed, reference = run.variants[failing(CASES[case][1])], run.variants["map-reported"]
    assert len(failed["rounds"]) == 2
    assert [r["cached"] for r in failed["rounds"]] == [r["cached"] for r in reference["rounds"]]


def test_under_poison_a_failed_map_on_one_rank_stops_the_engine_at_once(
    engine_python: Path, llama_checkpoint: Path, tmp_path: Path
) -> None:
    """``KVPLAN_POISON=1``: unbacked pages fault, so the step cannot run unbacked. Rank 1
    alone fails; both ranks learn it before the forward and refuse the step (``KVP532``), so
    the output rank's refusal stops the engine -- no rank is left waiting in a collective."""
    work = tmp_path / "failed-map-poison"
    hook = {HOOKS_ENV: f"fail-map=1:{FAILED_MAP}", "KVPLAN_MAP_RETRY": "0", **IN_STEP}
    env = kvplan_env("host-vmm", "elastic", work / "dump", KVPLAN_POISON="1", **hook)
    with pytest.raises(AssertionError) as failed:
        run_mp(
            engine_python, llama_checkpoint, [Variant("map-fails", env)], work, tp=2,
            extra_env=STEP_TIMEOUT, timeout=600,
        )  # fmt: skip
    log = (work / "engine.log").read_text(errors="replace")
    assert "KVP532" in log, str(failed.value)[-2000:]
    assert "rank 1 could not back" in log or "on rank 1" in log, log[-3000:]
    assert "timed out" not in log, log[-3000:]
