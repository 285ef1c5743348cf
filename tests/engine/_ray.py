"""Ray beside the engine venv, for the test that shows vLLM's CPU build refusing it.

Ray is not a dependency of vLLM's CPU wheel, and installing it into the engine venv would put
it under every other engine test (vLLM picks its Ray executor on its own in some layouts). It
is installed instead with the engine venv's pip into a folder of its own,
``.venv-engine-ray/`` (``--target``, without dependencies: those Ray needs that vLLM does not
already bring are :data:`PACKAGES`), under a lock, and reaches only the engines given
``PYTHONPATH=<that folder>``.
"""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

from harness.engine.harness import ROOT, EngineEnvError

RAY_VERSION = "2.60.0"
PACKAGES = (f"ray=={RAY_VERSION}", "msgpack")
FOLDER = ROOT / ".venv-engine-ray"
STAMP = "kvplan-ray.stamp"


def ensure_ray(python: Path) -> Path:
    """The folder holding Ray for the engine venv's ``python`` (installed once)."""
    FOLDER.parent.mkdir(parents=True, exist_ok=True)
    with open(FOLDER.parent / f"{FOLDER.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = FOLDER / STAMP
        if stamp.is_file() and stamp.read_text() == " ".join(PACKAGES):
            return FOLDER
        command = [
            str(python), "-m", "pip", "--disable-pip-version-check", "install", "--quiet",
            "--no-deps", "--upgrade", "--target", str(FOLDER), *PACKAGES,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            tail = "\n".join(((done.stdout or "") + (done.stderr or "")).splitlines()[-30:])
            raise EngineEnvError(f"installing {' '.join(PACKAGES)} failed:\n{tail}")
        check = [str(python), "-c", "import ray; print(ray.__version__)"]
        probe = subprocess.run(
            check, capture_output=True, text=True, timeout=300, check=False,
            env={"PYTHONPATH": str(FOLDER), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        if probe.returncode != 0 or probe.stdout.strip() != RAY_VERSION:
            raise EngineEnvError(f"ray in {FOLDER} does not import:\n{probe.stderr[-2000:]}")
        stamp.write_text(" ".join(PACKAGES))
        return FOLDER
