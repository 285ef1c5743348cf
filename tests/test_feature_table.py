"""The feature table (``kvplan.integrations.vllm.pipeline.features``), the integration guide's
copy of it and the engine matrix that asserts it (``harness.engine.features``,
``tests/engine/test_features.py``) say the same."""

from __future__ import annotations

from pathlib import Path

from harness.engine import features as matrix
from kvplan.integrations.vllm.pipeline import features

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "integration.md"


def test_the_guide_holds_the_generated_table() -> None:
    text = GUIDE.read_text()
    assert features.markdown_table() in text, (
        "docs/integration.md's feature table is stale: run `python tools/gen_reference.py`"
    )


def test_every_engine_tested_row_has_its_cells_in_the_matrix() -> None:
    """A row that names the matrix's release is run there, with the outcome the row says;
    every feature the matrix runs has a row that says so."""
    tested = {f.key for f in features.FEATURES if f.outcome != features.NOT_TESTABLE}
    assert tested == matrix.tested_keys()
    for key in tested:
        assert set(features.BY_KEY[key].releases) <= set(matrix.RELEASES), key
    for name, (key, _) in matrix.SECOND.items():
        assert key in tested and name not in features.BY_KEY, name
    for key in matrix.REFUSED_BY_VANILLA:
        assert features.BY_KEY[key].outcome in (features.VANILLA_CANNOT, features.REFUSED)
        assert matrix.VANILLA_ERRORS[key]
    for key in tested - set(matrix.REFUSED_BY_VANILLA):
        assert features.BY_KEY[key].outcome == features.WORKS, key


def test_every_row_is_one_of_the_outcomes() -> None:
    keys = [f.key for f in features.FEATURES]
    assert len(keys) == len(set(keys))
    for feature in features.FEATURES:
        assert feature.outcome in features.OUTCOMES, feature.key
        assert (feature.code is not None) == (feature.outcome == features.REFUSED), feature.key
        if feature.outcome == features.NOT_TESTABLE:
            assert not feature.releases and feature.note, feature.key
        else:
            assert feature.releases, feature.key


def test_the_matrix_runs_every_kvplan_mode_of_the_table() -> None:
    assert len(matrix.MODE_NAMES) == len(features.MODES)
    for (name, backend, mode, _), table_name in zip(matrix.MODES, features.MODES, strict=True):
        assert backend in table_name or name == "elastic-limit"
        assert ("elastic" in table_name) == (mode == "elastic"), name


def test_the_async_connectors_log_line_is_the_one_the_matrix_counts() -> None:
    source = (ROOT / "harness" / "engine" / "_async_connector.py").read_text()
    assert f'LOADED = "{matrix.ASYNC_LOADED}"' in source
