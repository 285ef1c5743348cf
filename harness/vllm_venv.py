"""Venvs of earlier vLLM (GPU build) releases, for the in-process vLLM tests.

The suite's ``.venv`` holds the release the ``vllm`` extra names (0.34); the in-process tests
also run against each release of :data:`RELEASES` in a venv of its own, built here once and
reused: ``.venv-vllm-0.33/`` in the repository root, or the venv the release's variable names
(``KVPLAN_VLLM_VENV_0_33``; completed in place). As with the engine venvs
(``harness.engine.harness``), a stamp file records a finished build and a file lock per venv
serializes concurrent builds of it.

The suite's own ``uv`` installs, from the suite's own uv cache and package index: these
releases pin the same torch as the ``vllm`` extra's, so uv hard-links the files it unpacked for
the suite's venv (a build of some 20 GB of files takes seconds of I/O, not a download).
Bytecode is not compiled at install; the venv caches it on first import (the engine venvs'
``.pth`` files, :data:`harness.engine.harness.ENGINE_PTHS`: also a vLLM cache of the venv's
own, so the releases never overwrite each other's model-class cache), and vLLM's model-class
cache is warmed for the suite's models once, when the venv is built. uv reads no
configuration file for the release's install (``--no-config``): the project's
``[tool.uv] override-dependencies`` are the ``vllm`` extra's, not an earlier release's.
kvplan itself is installed editable and without dependencies (every one is vLLM's too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import vllm_cache
from harness.engine.harness import ENGINE_PTHS, ENTRY_POINTS, ROOT, Report, _locked, _run


@dataclass(frozen=True)
class Release:
    """One vLLM (GPU build) release the in-process tests also run on."""

    version: str
    """The exact release, e.g. ``0.33.0``."""
    venv_name: str
    """The venv's folder in the repository root (when its variable is unset)."""
    variable: str
    """The environment variable that names an existing venv to complete and use instead."""
    pins: tuple[str, ...] = ()
    """Requirements installed with it (what its own metadata resolves wrongly here)."""

    @property
    def key(self) -> str:
        return ".".join(self.version.split(".")[:2])


RELEASES = {
    r.key: r
    for r in (
        # vLLM's cuda-bindings are 13.x; a cuda-python 12.x beside them breaks `import vllm`
        Release("0.33.0", ".venv-vllm-0.33", "KVPLAN_VLLM_VENV_0_33", ("cuda-python>=13",)),
    )
}
"""Every earlier release the in-process tests run on, by ``major.minor``."""
TEST_TOOLS = ("pytest>=8", "hypothesis>=6.100")
STAMP = "kvplan-vllm.stamp"
ARCHITECTURES = vllm_cache.suite_architectures()


class VllmVenvError(RuntimeError):
    """Building a release's venv failed; the message ends with the command's output tail."""


def release_of(release: str) -> Release:
    """The :class:`Release` of ``release`` (``0.33`` or ``0.33.0``); ``KeyError`` if unknown."""
    key = ".".join(release.split(".")[:2])
    if key not in RELEASES:
        raise KeyError(f"no vLLM venv for {release} (known: {', '.join(RELEASES)})")
    return RELEASES[key]


def venv_path(release: str) -> Path:
    """Where ``release``'s venv is: its variable's venv, else the repository's."""
    found = release_of(release)
    named = os.environ.get(found.variable, "").strip()
    return Path(named).expanduser().resolve() if named else ROOT / found.venv_name


def _stamp_wanted(release: Release) -> dict[str, Any]:
    return {
        "vllm": f"vllm=={release.version}",
        "pins": list(release.pins),
        "kvplan_source": str(ROOT),
        "tools": list(TEST_TOOLS),
        "entry_points": ENTRY_POINTS,
        "pth": [text for _, text in ENGINE_PTHS],
        "warmed": ARCHITECTURES,
    }


_PROBE = """
import importlib.metadata as m, json, sysconfig
def v(n):
    try:
        return m.version(n)
    except m.PackageNotFoundError:
        return None
eps = {g: [e.value for e in m.entry_points(group=g) if e.name == n] for g, (n, _) in %r.items()}
print(json.dumps({"versions": {n: v(n) for n in ("vllm", "kvplan", "cuda-python", "pytest")},
                  "entry_points": eps, "purelib": sysconfig.get_paths()["purelib"]}))
"""


def _probe(python: Path) -> dict[str, Any]:
    """What the venv holds now: the versions that matter, kvplan's entry points."""
    done = subprocess.run(
        [str(python), "-c", _PROBE % (ENTRY_POINTS,)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        raise VllmVenvError(f"probing {python} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ensure_vllm_venv(release: str, report: Report = print) -> Path:
    """``release``'s venv's python, building or completing the venv if needed (module doc)."""
    wanted = release_of(release)
    venv = venv_path(wanted.key)
    python = venv / "bin" / "python"
    label = f"vLLM venv {wanted.key}"
    with _locked(venv):
        stamp = venv / STAMP
        if stamp.is_file() and python.is_file():
            try:
                if json.loads(stamp.read_text()) == _stamp_wanted(wanted):
                    report(f"{label}: reusing {venv}")
                    return python
            except ValueError:
                pass
        started = time.perf_counter()
        uv = [sys.executable, "-m", "uv"]
        into = ("--python", str(python))

        def step(command: list[str], what: str, timeout: float = 1800) -> str:
            what = f"{wanted.key}: {what}"
            return _run(command, what, report, timeout, label="vLLM venv", error=VllmVenvError)

        if not python.is_file():
            step([*uv, "venv", "--no-config", "--python", sys.executable, str(venv)], "venv")
        packages = [f"vllm=={wanted.version}", *wanted.pins, *TEST_TOOLS]
        step([*uv, "pip", "install", "--no-config", *into, *packages], " ".join(packages))
        step(
            [*uv, "pip", "install", "--no-config", *into, "--no-deps", "-e", str(ROOT)],
            f"install -e {ROOT} (kvplan)",
        )
        state = _probe(python)
        for name, text in ENGINE_PTHS:
            (Path(state["purelib"]) / name).write_text(text)
        problems = []
        if state["versions"]["vllm"] != wanted.version:
            problems.append(f"vllm {state['versions']['vllm']} is not {wanted.version}")
        if state["entry_points"] != {group: [value] for group, (_, value) in ENTRY_POINTS.items()}:
            problems.append(f"kvplan's vllm entry points: {state['entry_points']}")
        if problems:
            raise VllmVenvError(f"{label} ({venv}) is incomplete: {'; '.join(problems)}")
        warmed = step(
            vllm_cache.warm_command(python, ARCHITECTURES),
            "import vllm, kvplan; warm vLLM's model-class cache",
            timeout=900,
        )
        report(f"{label}: {vllm_cache.parse(0, warmed, '').describe()}")
        stamp.write_text(json.dumps(_stamp_wanted(wanted)))
        report(f"{label}: ready in {time.perf_counter() - started:.0f} s ({venv})")
        return python


def main(argv: list[str]) -> int:
    """``python -m harness.vllm_venv [RELEASE ...]``: build (or reuse) the venvs of the given
    releases (default: all) and print how long each took."""
    for release in argv or list(RELEASES):
        started = time.perf_counter()
        try:
            python = ensure_vllm_venv(release, lambda m: print(m, flush=True))
        except (VllmVenvError, KeyError) as exc:
            print(f"vLLM venv {release}: {exc}", file=sys.stderr)
            return 1
        print(f"vLLM venv {release}: {python} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
