"""The second node of a two-node engine: vLLM's multiprocess executor across nodes, both
nodes on 127.0.0.1 (run inside the engine driver, engine venv).

vLLM serves a model over several machines with ``--nnodes N --node-rank R --master-addr A
--master-port P``: node 0 runs the engine (its engine core, its local workers), every other
node runs ``vllm serve ... --headless``, which starts that node's workers and nothing else;
the workers of all nodes meet in one ``torch.distributed`` world at ``A:P`` and the engine
core broadcasts each step to all of them. Here node 0 is the driver's ``LLM`` (its engine
options carry ``nnodes=2, node_rank=0``) and node 1 a :class:`RemoteNode`: vLLM's own CLI
(``_vllm_cli``) with the same engine options, in a process tree of its own, its own
``VLLM_CPU_OMP_THREADS_BIND`` (the machine's second core) and its own ``KVPLAN_DUMP_DIR``
(what its ranks dump lands on "its" machine). A headless node does not exit when node 0's
engine shuts down (its workers wait for the next engine), so the driver stops it as an
operator does: ``SIGTERM`` (vLLM's headless handler shuts its executor down), then
``SIGKILL`` for whatever of its tree is left after a short grace (:data:`STOP_GRACE_S`).

This file imports only the standard library and ``psutil`` (a vLLM dependency).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

CLI = Path(__file__).with_name("_vllm_cli.py")
NODE_ADDRESS = "127.0.0.1"
STOP_GRACE_S = 2.0
"""Seconds a headless node has, after ``SIGTERM``, before its tree is killed. Its worker
waits on the gone head and never exits by itself: vLLM's own shutdown waits 5 s for it,
signals it, waits 4 s more and kills it; the tests do not wait those 10 s for each engine."""
REFUSAL_EXIT_S = 180.0
"""Seconds a node that should refuse has to exit by itself before it is stopped: a headless
node refuses in its executor's start, as node 0 does, and exits with an error; stopping it
as soon as node 0 has refused would race that (a failure must end the node, not hang it)."""
NODE1_CORE = "1"
PID_FILE = "node1.pid"
"""In the driver's folder while a second node runs: its pid (its process group's id)."""
LOOPBACK_ENV = {"VLLM_HOST_IP": NODE_ADDRESS, "GLOO_SOCKET_IFNAME": "lo"}
"""What an operator sets on each node: the address the node's vLLM publishes to the other
nodes (the engine core's step broadcast; without it vLLM takes the address of the machine's
route to the internet, which a closed machine may lack or not reach), and the interface its
gloo connections use (here both nodes are 127.0.0.1)."""
NODE1_DUMP_SUFFIX = "-node1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the master port of one engine)."""
    with socket.socket() as s:
        s.bind((NODE_ADDRESS, 0))
        return int(s.getsockname()[1])


def node0_options(port: int) -> dict[str, Any]:
    """The engine options that make the driver's engine node 0 of two."""
    return {"nnodes": 2, "node_rank": 0, "master_addr": NODE_ADDRESS, "master_port": port}


def cli_options(engine: dict[str, Any]) -> list[str]:
    """Engine options as vLLM's CLI flags (``--max-model-len 128``, ``--enforce-eager``; a
    dict as JSON). An option set to ``False`` is left out: vLLM's flags for the options these
    tests turn off (``enforce_eager``, ``disable_log_stats``) are off by default, and some
    (``--disable-log-stats``) have no ``--no-`` form."""
    flags: list[str] = []
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:
            continue
        elif isinstance(value, dict | list):
            flags += [flag, json.dumps(value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def node1_env(env: dict[str, str]) -> dict[str, str]:
    """Node 1's environment: node 0's, on the other core, dumping to its own folder."""
    node = {**env, "VLLM_CPU_OMP_THREADS_BIND": NODE1_CORE}
    if node.get("KVPLAN_DUMP_DIR"):
        node["KVPLAN_DUMP_DIR"] = node["KVPLAN_DUMP_DIR"] + NODE1_DUMP_SUFFIX
    return node


class RemoteNode:
    """Node 1 (headless) of the engine the driver is about to start as node 0."""

    def __init__(self, model: str, engine: dict[str, Any], env: dict[str, str], log: Path):
        options = {k: v for k, v in engine.items() if k not in ("nnodes", "node_rank")}
        port = options.pop("master_port")
        address = options.pop("master_addr")
        self.command = [
            sys.executable, str(CLI), "serve", model, "--headless", "--nnodes", "2",
            "--node-rank", "1", "--master-addr", str(address), "--master-port", str(port),
            *cli_options(options),
        ]  # fmt: skip
        self.log = log
        self.env = node1_env(env)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RemoteNode:
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
            )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self, own_exit_s: float = 0.0) -> dict[str, Any]:
        """Stop the node (``SIGTERM``, then ``SIGKILL`` for its tree after the grace), once it
        has had ``own_exit_s`` to exit by itself; what happened: its exit code, whether it had
        exited by itself, whether anything had to be killed, processes left (0)."""
        import psutil

        assert self.process is not None
        tree = _tree(self.process.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(own_exit_s)
        exited_before = self.process.poll() is not None
        if not exited_before:
            self.process.send_signal(signal.SIGTERM)
        killed = False
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE_S)
        tree += [p for p in _tree(self.process.pid) if p not in tree]
        for proc in tree:  # the main process, and the worker it was still waiting for
            if _alive(proc):
                killed = True
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
        code = self.process.wait(10)
        psutil.wait_procs(tree, timeout=10)
        left = [p.pid for p in tree if _alive(p)]
        return {
            "returncode": code,
            "exited_before_stop": exited_before,
            "killed": killed,
            "left": left,
            "log": str(self.log),
            "pid": self.process.pid,
            "pids": [p.pid for p in tree],
        }


def _alive(proc: Any) -> bool:
    import psutil

    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _tree(pid: int) -> list[Any]:
    """The process ``pid`` and every descendant of it alive now."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
