"""What the plugin patches in each supported vLLM version, and how to check it is there.

A target is a module global or a class attribute, with the parameter list kvplan's wrapper
was written for. Adding a vLLM version means adding its table to :data:`TARGETS` (see
``docs/integration.md``). Resolving imports vLLM; checking never patches anything.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvplan.schemas.errors import Code, Diagnostic, error

ALLOCATE = "allocate"
"""``allocate_kv_cache``: plan, validate and bind here."""
HISPARSE = "hisparse"
"""HiSparse's allocation site: kvplan refuses HiSparse configs."""
RUNNER = "runner"
"""A runner's ``initialize_kv_cache``: owner of the cache, and the ``is_profiling`` flag."""
V1_TENSORS = "v1-tensors"
"""V1 ``initialize_kv_cache_tensors``: the runner's sharing map; checks vLLM's aliases."""
V2_INIT = "v2-init"
"""V2 ``init_kv_cache``: the sharing map from the config; checks vLLM's aliases."""
READ = "read"
"""Not patched; the wrappers call it."""


@dataclass(frozen=True)
class Target:
    """One attribute kvplan patches (or reads) and the signature it expects."""

    module: str
    qualname: str
    """``name`` (module global) or ``Class.name`` (class attribute)."""
    params: tuple[str, ...]
    """Parameter names in order; keyword-only ones start with ``*``."""
    role: str
    why: str

    @property
    def name(self) -> str:
        return f"{self.module}.{self.qualname}"

    @property
    def expected_signature(self) -> str:
        return f"({', '.join(self.params)})"


_ALLOC = ("kv_cache_config", "device", "layout", "kernel_block_sizes")
_INIT = ("self", "kv_cache_config", "is_profiling", "kv_cache_allocation_context")

TARGETS: dict[str, tuple[Target, ...]] = {
    "0.33": (
        Target(
            "vllm.v1.worker.utils", "allocate_kv_cache", _ALLOC, ALLOCATE,
            "the single KV-cache allocation point (definition)",
        ),
        Target(
            "vllm.v1.worker.gpu_model_runner", "allocate_kv_cache", _ALLOC, ALLOCATE,
            "imported by name by the V1 runner",
        ),
        Target(
            "vllm.v1.worker.gpu.attn_utils", "allocate_kv_cache", _ALLOC, ALLOCATE,
            "imported by name by the V2 runner's init_kv_cache",
        ),
        Target(
            "vllm.v1.hisparse.binding", "allocate_kv_cache", _ALLOC, HISPARSE,
            "imported by name by HiSparse (refused: kvplan does not plan HiSparse)",
        ),
        Target(
            "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_kv_cache", _INIT,
            RUNNER, "V1 runner entry: owner of the cache and is_profiling",
        ),
        Target(
            "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_kv_cache_tensors",
            ("self", "kv_cache_config", "kernel_block_sizes", "kv_cache_allocation_context"),
            V1_TENSORS, "V1: runner.shared_kv_cache_layers; vLLM's alias loop is checked",
        ),
        Target(
            "vllm.v1.worker.gpu.model_runner", "GPUModelRunner.initialize_kv_cache", _INIT,
            RUNNER, "V2 runner entry: owner of the cache and is_profiling",
        ),
        Target(
            "vllm.v1.worker.gpu.attn_utils", "init_kv_cache",
            (
                "forward_context", "kv_cache_config", "device", "kernel_block_sizes",
                "vllm_config", "kv_cache_allocation_context", "*block_tables", "*attn_groups",
            ),
            V2_INIT, "V2: get_shared_kv_cache_layers(vllm_config); vLLM's alias loop is checked",
        ),
        Target(
            "vllm.v1.worker.gpu.model_runner", "init_kv_cache",
            (
                "forward_context", "kv_cache_config", "device", "kernel_block_sizes",
                "vllm_config", "kv_cache_allocation_context", "*block_tables", "*attn_groups",
            ),
            V2_INIT, "imported by name by the V2 runner",
        ),
        Target(
            "vllm.v1.worker.gpu.attn_utils", "get_shared_kv_cache_layers", ("vllm_config",),
            READ, "the V2 sharing map (read, not patched)",
        ),
    ),
}  # fmt: skip
"""Targets per supported ``major.minor`` vLLM version."""
TARGETS["0.32"] = TARGETS["0.33"]  # temporary: replaced by the version adapters


def version_key(version: str) -> str:
    """``0.33.0`` / ``0.33.1rc1.dev4+g1234`` → ``0.33``."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return f"{match.group(1)}.{match.group(2)}" if match else version


def supported_versions() -> list[str]:
    return [f"{key}.x" for key in TARGETS]


def targets_for(version: str) -> tuple[Target, ...] | None:
    return TARGETS.get(version_key(version))


@dataclass
class Resolved:
    """A target found in the running vLLM (``holder`` is the module or class)."""

    target: Target
    holder: Any = None
    attr: str = ""
    value: Any = None
    signature: str | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def _params(fn: Callable[..., Any]) -> tuple[str, ...]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append(f"*{p.name}" if p.kind is inspect.Parameter.KEYWORD_ONLY else p.name)
    return tuple(out)


def unwrap(value: Any) -> Any:
    """The original behind kvplan's wrappers (a kvplan wrapper keeps it in ``__wrapped__``)."""
    while getattr(value, "__kvplan_wrapper__", False):
        value = value.__wrapped__
    return value


def resolve(target: Target) -> Resolved:
    """Find ``target`` (importing its module) and compare its signature; never patches."""
    found = Resolved(target)
    try:
        holder: Any = importlib.import_module(target.module)
    except Exception as exc:  # any import failure makes the target unusable
        found.problem = f"module {target.module} cannot be imported ({type(exc).__name__}: {exc})"
        return found
    *owners, attr = target.qualname.split(".")
    for owner in owners:
        holder = getattr(holder, owner, None)
        if holder is None:
            found.problem = f"{target.module} has no {owner}"
            return found
    if owners and attr not in vars(holder):
        found.problem = f"{'.'.join(owners)} does not define {attr} itself"
        return found
    if not hasattr(holder, attr):
        found.problem = f"{target.module} has no {attr}"
        return found
    value = unwrap(vars(holder)[attr] if owners else getattr(holder, attr))
    found.holder, found.attr, found.value = holder, attr, value
    if not callable(value):
        found.problem = f"{target.name} is not callable"
        return found
    try:
        params = _params(value)
    except (TypeError, ValueError) as exc:
        found.problem = f"the signature of {target.name} cannot be read ({exc})"
        return found
    found.signature = f"({', '.join(params)})"
    if params != target.params:
        found.problem = (
            f"{target.name} has signature {found.signature}; kvplan expects "
            f"{target.expected_signature}"
        )
    return found


def check_version(version: str) -> Diagnostic | None:
    """``KVP501`` if kvplan has no target table for vLLM ``version``."""
    if targets_for(version) is not None:
        return None
    return error(
        Code.INTEGRATION,
        "vllm.__version__",
        f"kvplan's vLLM plugin does not support vLLM {version}; it supports "
        f"{', '.join(supported_versions())}.",
        "install a supported vLLM (pip install 'kvplan[vllm]'), or unset KVPLAN_ENABLE",
    )


def resolve_all(version: str) -> tuple[list[Resolved], list[Diagnostic]]:
    """Every target of ``version`` and a ``KVP501`` error per missing or changed one."""
    bad = check_version(version)
    if bad is not None:
        return [], [bad]
    found = [resolve(t) for t in targets_for(version) or ()]
    problems = [
        error(
            Code.INTEGRATION,
            r.target.name,
            f"vLLM {version}: patch target {r.target.name} is unusable: {r.problem}.",
            "this vLLM build differs from the release kvplan supports; see "
            "docs/integration.md (adding a vLLM version), or unset KVPLAN_ENABLE",
        )
        for r in found
        if not r.ok
    ]
    return found, problems
