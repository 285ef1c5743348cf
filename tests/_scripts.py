"""Load a script of ``benchmarks/`` as a module, for tests that run its functions (the
scripts are not a package: they are run as files)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as module ``name`` (its import runs no measure)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
