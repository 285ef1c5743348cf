"""vLLM's OpenAI server with its defaults, kvplan elastic, a live ``kvplan limit`` mid-load.

Three servers (``python -m vllm.entrypoints.openai.api_server``, one after the other, each
with vLLM's default multiprocess executor: API server, engine core and worker are three
processes) serve the tiny llama with real re-drawn weights (``_weights``), driven by the real
``openai`` client (``_client``) with 13 concurrent completions: four families of three
prompts sharing two blocks each (24 tokens each), plus one long request (900 tokens) that
keeps the engine busy while the limit changes.

* **vanilla**: kvplan off.
* **elastic**: kvplan host-vmm elastic, strict, unbacked memory poisoned (``KVPLAN_POISON=1``:
  a step that touched an unmapped block would kill the engine). While the requests are in
  flight (the engine's stats file shows blocks in use), ``python -m kvplan limit DIR 12MiB``
  lowers the budget from the whole reservation (32 MiB); the first stats snapshot under the
  new limit must still show blocks in use (a step with requests in flight applied it). Each
  of its steps waits 8 ms first (the ``slow-steps`` worker hook): the long request then lasts
  at least 7 s whatever the machine, where the limit lands within about 2 s of the command
  (a loaded CI machine once finished the load first).
* **broken**: the same elastic server with the binding broken on purpose (the driver's
  ``swap``, installed in the worker process through vLLM's ``worker_cls``): the comparison
  below must fail on it.

**Why the comparison is exact.** vLLM on the CPU is not batch-invariant in one way that
matters here: a request that is preempted and recomputed gets KV computed by a prefill where
it had decode-computed KV, which can change its tokens. Arrival timing (which requests share
a step) is the same kind of noise in both servers and, without preemption, does not change a
request's tokens on this build (checked with 6 batchings of these engines: all-together,
reversed, permuted, pairs, one at a time, at ``max_num_seqs`` 1/2/4/8). So the binding must not
be able to preempt or to change the prefix cache: the new limit (12 MiB = 96 blocks) stays
above all the load ever needs (~58 blocks: it binds in kvplan's ledger, so the pool's free
count is kvplan's, but never below what vLLM asks for), and ``KVPLAN_CACHE_LIMIT`` is the
whole reservation, so kvplan evicts no cached block vanilla would keep. The test checks both
preconditions on both servers (no preemption; the same prefix-cache hits, the number the
families imply) before comparing tokens.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.engine._models import BLOCK_SIZE
from harness.engine._server import (
    BLOCK_BYTES,
    MODEL_NAME,
    NUM_BLOCKS,
    RESERVED,
    SERVER_OPTIONS,
    ClientRun,
    Server,
    run_client,
    start_server,
)
from harness.engine._worker_hooks import FOLDER as HOOKS_FOLDER
from harness.engine._worker_hooks import HOOKS_ENV, WORKER_CLS
from harness.engine.harness import kvplan_env
from kvplan.elastic.files import ElasticStats, read_stats

NEW_LIMIT = "12MiB"
NEW_LIMIT_BYTES = 12 << 20
OPTIONS = SERVER_OPTIONS

PREFIX_TOKENS = 2 * BLOCK_SIZE
FAMILIES, MEMBERS = 4, 3
MAX_TOKENS = 24
LONG_MAX_TOKENS = 900
STEP_DELAY_MS = 8


def _requests() -> list[dict[str, Any]]:
    requests = []
    for f in range(FAMILIES):
        prefix = [(31 * f + 7 * i) % 500 + 3 for i in range(PREFIX_TOKENS)]
        for m in range(MEMBERS):
            suffix = [(11 * (f + 1) + 13 * m + 17 * i) % 500 + 3 for i in range(6 + 9 * m)]
            requests.append({"prompt": prefix + suffix, "max_tokens": MAX_TOKENS})
    long = [(19 * i) % 500 + 5 for i in range(40)]
    requests.insert(1, {"prompt": long, "max_tokens": LONG_MAX_TOKENS})  # sent second
    return requests


REQUESTS = _requests()
EXPECTED_HITS = FAMILIES * (MEMBERS - 1) * PREFIX_TOKENS
"""Prefix-cache hits (tokens) of the load: every family member but the first scheduled hits
the family's two blocks (the first member's blocks are cached when they are allocated, so a
member scheduled in the same step hits them too)."""


@dataclass
class Served:
    """One server's run: what the client saw, the server's metrics, how it stopped."""

    server: Server
    client: ClientRun
    metrics: dict[str, float]
    exit_code: int
    leftovers: bool
    dump: Path | None


PLANTED_BYTES = 1 << 50
"""What nobody's planted ``limit.json`` asks: 1 PiB."""
PLANT_WAIT_SECONDS = 1.5
"""How long the client waits after the plant (the engine looks at ``limit.json`` every half
second while it steps)."""


def _plant(dump: Path) -> list[str]:
    """As ``nobody`` (a real second uid, through ``setpriv``): write a valid limit document
    of 1 PiB to a temporary file in ``dump`` and rename it to ``limit.json``."""
    setpriv = shutil.which("setpriv")
    assert os.geteuid() == 0 and setpriv, "run as root with setpriv (CI does): uid nobody plants"
    document = json.dumps({"kind": "kvplan-elastic-limit", "version": 1,
                           "limit_bytes": PLANTED_BYTES, "written_at": 1.0})  # fmt: skip
    script = 'printf %s "$1" > "$2/.planted" && mv "$2/.planted" "$2/limit.json"'
    return [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups",
            "/bin/sh", "-c", script, "sh", document, str(dump)]  # fmt: skip


def _serve(
    engine_python: Path,
    model: Path,
    work: Path,
    name: str,
    kvplan: dict[str, str],
    *,
    limit: bool = False,
    options: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> Served:
    dump = Path(kvplan["KVPLAN_DUMP_DIR"]) if "KVPLAN_DUMP_DIR" in kvplan else None
    server = start_server(
        name, engine_python, model, work, {**OPTIONS, **(options or {})}, kvplan, extra_env
    )
    try:
        job: dict[str, Any] = {
            "name": name,
            "base_url": server.url,
            "model": MODEL_NAME,
            "requests": REQUESTS,
        }
        if limit:
            assert dump is not None
            job["limit"] = {
                "dir": str(dump),
                "size": NEW_LIMIT,
                "bytes": NEW_LIMIT_BYTES,
                "stats_file": str(dump / "rank0.stats.json"),
                "plant": {"command": _plant(dump), "wait": PLANT_WAIT_SECONDS},
            }
        client = run_client(engine_python, job, work)
        metrics = server.metrics()
        alive = server.alive()
        code = server.stop()
        leftovers = server.leftover_processes()
    except BaseException:
        server.kill()
        raise
    assert alive, f"server {name} died during the load:\n{server.tail()}"
    return Served(server, client, metrics, code, leftovers, dump)


@pytest.fixture(scope="module")
def served(
    engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Served]]:
    work = tmp_path_factory.mktemp("serving")
    # the elastic engine dumps into a sticky directory every user can write (/tmp-style),
    # reachable by nobody: nobody plants a limit there mid-load (see _plant)
    shared = Path(tempfile.mkdtemp(prefix="kvplan-served-"))
    shared.chmod(0o755)
    dump = shared / "dump-elastic"
    dump.mkdir()
    dump.chmod(0o1777)
    elastic_env = kvplan_env(
        "host-vmm", "elastic", dump, KVPLAN_POISON="1", KVPLAN_CACHE_LIMIT=str(RESERVED),
    )  # fmt: skip
    model = llama_checkpoint
    # every elastic step waits 8 ms first: the long request lasts at least 7 s on any machine,
    # so the limit (applied within ~2 s of the command) lands while it runs
    slow = {HOOKS_ENV: f"slow-steps={STEP_DELAY_MS}", "PYTHONPATH": HOOKS_FOLDER}
    try:
        vanilla = _serve(engine_python, model, work, "vanilla", {})
        elastic = _serve(
            engine_python, model, work, "elastic", elastic_env, limit=True,
            options={"worker_cls": WORKER_CLS}, extra_env=slow,
        )  # fmt: skip
        yield {"vanilla": vanilla, "elastic": elastic}
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def check_same_as_vanilla(run: ClientRun, vanilla: ClientRun) -> None:
    """Every request finished, with ``max_tokens`` greedy tokens, and vanilla's tokens."""
    assert not run.errors(), run.errors()[:3]
    for spec, got in zip(REQUESTS, run.requests, strict=True):
        assert got["finish_reason"] == "length", got
        assert got["prompt_token_ids"] == spec["prompt"]
        assert len(got["token_ids"]) == spec["max_tokens"]
    assert run.tokens() == vanilla.tokens()


def test_every_request_finishes_with_vanillas_tokens(served: dict[str, Served]) -> None:
    vanilla, elastic = served["vanilla"].client, served["elastic"].client
    check_same_as_vanilla(vanilla, vanilla)
    check_same_as_vanilla(elastic, vanilla)


def test_logprobs_are_the_greedy_tokens(served: dict[str, Served]) -> None:
    """The logprobs name the returned tokens, each the most likely (greedy sampling)."""
    for name in ("vanilla", "elastic"):
        for got in served[name].client.requests:
            assert got["logprob_tokens"] == got["token_ids"], name
            for token, logprob, top in zip(
                got["token_ids"], got["token_logprobs"], got["top_logprobs"], strict=True
            ):
                assert top[str(token)] == logprob, name
                assert logprob == max(top.values()), name


def test_the_binding_could_not_change_the_batching(served: dict[str, Served]) -> None:
    """The preconditions of an exact comparison: nothing preempted, the same prefix hits."""
    for name in ("vanilla", "elastic"):
        metrics = served[name].metrics
        assert metrics["vllm:num_preemptions_total"] == 0, name
        assert metrics["vllm:prefix_cache_hits_total"] == EXPECTED_HITS, name
        assert metrics["vllm:request_success_total"] == len(REQUESTS), name


def test_the_limit_changed_mid_load(served: dict[str, Served]) -> None:
    elastic = served["elastic"]
    limit = elastic.client.limit
    assert limit is not None and "error" not in limit, limit
    assert limit["cli"]["rc"] == 0, limit["cli"]
    applied = limit["applied"]["snapshot"]
    assert applied["limit_bytes"] == NEW_LIMIT_BYTES
    assert applied["live_blocks"] > 0, applied  # a step with blocks in use applied it
    assert f"kvplan: elastic memory limit now {NEW_LIMIT_BYTES} bytes" in elastic.server.log()
    assert elastic.dump is not None
    final = json.loads((elastic.dump / "rank0.stats.json").read_text())
    assert final["limit_bytes"] == NEW_LIMIT_BYTES
    assert final["reserved_bytes"] == RESERVED and final["num_blocks"] == NUM_BLOCKS
    assert 0 < final["peak_mapped_bytes"] <= NEW_LIMIT_BYTES
    assert final["maps"] > 0 and final["failed_maps"] == 0


def test_another_uid_cannot_change_the_limit_through_the_dump_directory(
    served: dict[str, Served],
) -> None:
    """``nobody`` renames a 1 PiB limit document to ``limit.json`` in the engine's sticky
    dump directory mid-load: the engine refuses it and logs whose it is; the operator's
    ``kvplan limit`` (above) then still changes the limit."""
    elastic = served["elastic"]
    assert elastic.client.limit is not None
    plant = elastic.client.limit["plant"]
    assert plant["rc"] == 0 and plant["owner"] == 65534, plant
    snap = plant["snapshot"]
    assert snap is not None and snap["limit_bytes"] == RESERVED, snap  # still the default
    assert snap["asked_limit_bytes"] is None, snap
    log = elastic.server.log()
    ignored = [line for line in log.splitlines() if "elastic limit file ignored" in line]
    assert ignored and "uid 65534 (nobody)" in ignored[0], ignored or log[-3000:]
    assert f"memory limit now {PLANTED_BYTES} bytes" not in log
    assert f"limit now {NEW_LIMIT_BYTES} bytes" in log and "of uid 0 (root)" in log


def test_sigterm_stops_every_process_and_leaves_the_dumps(served: dict[str, Served]) -> None:
    for name, run in served.items():
        assert run.exit_code == 0, (name, run.server.tail())
        assert not run.leftovers, name
    dump = served["elastic"].dump
    assert dump is not None
    names = sorted(p.name for p in dump.iterdir())
    for wanted in ("rank0.input.json", "rank0.plan.json", "rank0.stats.json", "limit.json"):
        assert wanted in names, names
    document = json.loads((dump / "rank0.input.json").read_text())
    assert document["metadata"] == {
        "source": "kvplan vLLM plugin",
        "rank": "rank0",
        "phase": "serving",
    }
    plan = json.loads((dump / "rank0.plan.json").read_text())
    assert plan["summary"]["pool_bytes"] == RESERVED
    assert plan["summary"]["bytes_per_block"] == BLOCK_BYTES
    # the worker's last snapshot: vLLM's default SIGTERM (shutdown_timeout 0) kills the engine
    # core and the worker at once, so the cache never closes and no "closed" snapshot follows
    stats = read_stats(dump / "rank0.stats.json")
    assert isinstance(stats, ElasticStats), stats
    assert stats.limit_bytes == NEW_LIMIT_BYTES and stats.backend == "host-vmm"


def test_a_broken_binding_fails_the_comparison(
    served: dict[str, Served],
    engine_python: Path,
    llama_checkpoint: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Negative control: the same elastic server, one layer given another layer's cache in
    the worker process; every request still finishes, and the comparison fails. (Not strict:
    kvplan's rebind watch sees the swap, says ``KVP507`` and serves on; strict, it would
    refuse to start, ``tests/engine/test_engines.py``.)"""
    work = tmp_path_factory.mktemp("serving-broken")
    env = kvplan_env(
        "host-vmm", "elastic", work / "dump", KVPLAN_POISON="1", KVPLAN_CACHE_LIMIT=str(RESERVED),
        KVPLAN_STRICT="0",
    )  # fmt: skip
    hooks = {HOOKS_ENV: "break=swap", "PYTHONPATH": HOOKS_FOLDER}
    broken = _serve(
        engine_python, llama_checkpoint, work, "broken", env,
        options={"worker_cls": WORKER_CLS}, extra_env=hooks,
    )  # fmt: skip
    assert not broken.client.errors()
    with pytest.raises(AssertionError):
        check_same_as_vanilla(broken.client, served["vanilla"].client)
    assert broken.exit_code == 0
    assert "KVP507" in broken.server.log()
