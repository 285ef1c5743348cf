"""What a version adapter declares, and how a declared target is found in the running vLLM.

A :class:`VersionAdapter` is data: the releases it covers, the config form, the fields those
releases lack, and the :class:`Target` s the plugin wraps (each with the handler that runs
when vLLM calls it, and the runner it belongs to). Resolving a target imports its vLLM module
and compares the signature and the calls kvplan relies on; it never patches anything.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvplan.integrations.vllm.versions._provenance import Foreign, foreign_layer

PLACEMENT = "placement"
"""``KVCacheTensor(size, layers, layer_stride, block_stride, ...)``: vLLM 0.29 and later."""
SHARED_BY = "shared_by"
"""``KVCacheTensor(size, shared_by)``: vLLM 0.28 and earlier (``kvplan.input-legacy/1``)."""

ALLOCATE = "allocate"
"""``allocate_kv_cache``: plan, validate and bind here."""
HISPARSE = "hisparse"
"""HiSparse's allocation site: kvplan refuses HiSparse configs."""
RUNNER = "runner"
"""A runner's ``initialize_kv_cache``: owner of the cache, and the ``is_profiling`` flag."""
TENSORS = "tensors"
"""A runner-level function that allocates and aliases; vLLM's dict is checked against the plan."""
STEP = "step"
"""A worker's step entry (``Worker.execute_model``): the caches vLLM holds are checked against
what kvplan bound, and a mode may act first (elastic: map and unmap)."""
READ = "read"
"""Not patched; the handlers call it."""
CONFIG = "config"
"""A method of vLLM's engine config kvplan settles a setting in (0.34: the extensible KV cache)."""
ELASTIC = "elastic"
"""Patched only in elastic mode: the scheduler's block pool and the workers' step entry."""

V1 = "V1"
V2 = "V2"


@dataclass(frozen=True)
class Target:
    """One attribute kvplan patches (or reads), the signature it expects, and its handler."""

    module: str
    qualname: str
    """``name`` (module global) or ``Class.name`` (class attribute)."""
    params: tuple[str, ...]
    """Parameter names in order; keyword-only ones start with ``*``."""
    role: str
    why: str
    handler: str | None = field(default=None, compare=False)
    """The name of the handler that runs in the wrapper (``None`` for a ``READ`` target).
    Adapters name handlers; the plugin's rooms define them (``pipeline.HANDLERS`` and each
    mode's own), so this package asks nothing of the plugin."""
    runner: str | None = None
    """``V1`` or ``V2`` for a runner-level target (declared, never guessed from the name)."""
    calls: tuple[str, ...] = ()
    """Names the function's code must use (what kvplan's handler relies on it calling)."""

    @property
    def name(self) -> str:
        return f"{self.module}.{self.qualname}"

    @property
    def patched(self) -> bool:
        return self.role != READ

    @property
    def elastic_only(self) -> bool:
        """Resolved and wrapped only when the plugin runs in elastic mode."""
        return self.role == ELASTIC

    @property
    def expected_signature(self) -> str:
        return f"({', '.join(self.params)})"


@dataclass(frozen=True)
class EngineCorePlanning:
    """How a release's engine core turns the workers' specs into ``KVCacheConfig`` s.

    ``kvplan inspect`` replays ``EngineCore._initialize_kv_caches`` with these two steps:
    ``groups`` runs where the engine core forms its global groups before recording the layout
    (``None`` where the release forms them inside ``configs``), ``configs`` where it plans.
    """

    groups: Callable[[Any, list[Any]], Any]
    configs: Callable[[Any, list[Any], list[int], Any], list[Any]]
    block_size_of_cacheable_groups: bool = True
    """The global block size is the smallest of the prefix-cacheable groups' (all groups'
    when none is); ``False``: of every group's (0.29)."""
    resolves_hash_block_size: bool = True
    """The engine core resolves ``hash_block_size`` and ``cache_hit_alignment_tokens`` into
    every ``KVCacheConfig`` (0.32 and later); ``False``: the release's configs have neither."""


@dataclass(frozen=True)
class VersionAdapter:
    """One vLLM version family: everything release-specific kvplan needs to know."""

    name: str
    releases: tuple[str, ...]
    """``major.minor`` releases covered, e.g. ``("0.32", "0.33")``."""
    form: str
    """``placement`` or ``shared_by`` (see the module constants)."""
    targets: tuple[Target, ...]
    absent_fields: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    """Per release: vLLM class name -> {field the release lacks: the value that means "unset"}.

    Such a field is not read from the release (kvplan's schema default applies) and is not
    passed to it; a document that sets it to anything else cannot be rebuilt there.
    """
    unmodelled_specs: Mapping[str, str] = field(default_factory=dict)
    """vLLM spec class name -> why kvplan cannot plan it: capture refuses it (``KVP501``)."""
    engine_core: Mapping[str, EngineCorePlanning] = field(default_factory=dict)
    """Per release: the engine core's planning steps (``kvplan inspect`` builds with them).
    A release without an entry cannot be inspected (``KVP501``)."""
    notes: str = ""

    def covers(self, version: str) -> bool:
        return version_key(version) in self.releases

    def fields_absent_in(self, version: str) -> dict[str, dict[str, Any]]:
        """``{class name: {field: unset value}}`` for ``version`` (empty if it has them all)."""
        table = self.absent_fields.get(version_key(version), {})
        return {cls: dict(fields) for cls, fields in table.items()}

    def engine_core_planning(self, version: str) -> EngineCorePlanning | None:
        """How ``version``'s engine core plans, or ``None`` if kvplan cannot replay it."""
        return self.engine_core.get(version_key(version))

    @property
    def elastic(self) -> bool:
        """Whether kvplan can serve this family elastically (it declares elastic targets)."""
        return any(t.elastic_only for t in self.targets)

    def target(self, qualname: str) -> Target:
        """The target whose ``qualname`` (or ``module.qualname``) is given."""
        for t in self.targets:
            if qualname in (t.qualname, t.name):
                return t
        raise KeyError(qualname)


@dataclass(frozen=True)
class Difference:
    """A wrapped function of a release that differs in a way kvplan was not written for."""

    function: str
    difference: str
    releases: tuple[str, ...]
    """The releases (``major.minor``) that differ this way."""


@dataclass(frozen=True)
class RefusedReleases:
    """Releases kvplan knows and refuses, with each difference that makes it refuse."""

    releases: tuple[str, ...]
    form: str
    differences: tuple[Difference, ...]

    def differences_of(self, version: str) -> tuple[Difference, ...]:
        key = version_key(version)
        return tuple(d for d in self.differences if key in d.releases)


def version_key(version: str) -> str:
    """``0.33.0`` / ``0.33.1rc1.dev4+g1234`` → ``0.33``."""
    match = re.match(r"\s*v?([0-9]+)\.([0-9]+)", version)
    return f"{match.group(1)}.{match.group(2)}" if match else version


@dataclass
class Resolved:
    """A target found in the running vLLM (``holder`` is the module or class)."""

    target: Target
    holder: Any = None
    attr: str = ""
    value: Any = None
    signature: str | None = None
    problem: str | None = None
    foreign: Foreign | None = None
    """Set when the function is not the release's own (another plugin wrapped it first)."""

    @property
    def ok(self) -> bool:
        return self.problem is None


def _params(fn: Callable[..., Any]) -> tuple[str, ...]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append(f"*{p.name}" if p.kind is inspect.Parameter.KEYWORD_ONLY else p.name)
    return tuple(out)


def _code_names(fn: Any) -> set[str]:
    """Every global and attribute name ``fn``'s code (nested code included) uses."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    names: set[str] = set()
    stack = [code] if code is not None else []
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if inspect.iscode(c))
    return names


def unwrap(value: Any) -> Any:
    """The original behind kvplan's wrappers (a kvplan wrapper keeps it in ``__wrapped__``)."""
    while getattr(value, "__kvplan_wrapper__", False):
        value = value.__wrapped__
    return value


def resolve(target: Target) -> Resolved:
    """Find ``target`` (importing its module), compare its signature and calls; never patches."""
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
    missing = [name for name in target.calls if name not in _code_names(value)]
    if missing:
        found.problem = (
            f"{target.name} no longer calls {', '.join(missing)}, which kvplan's wrapper relies on"
        )
        return found
    found.foreign = foreign_layer(value, attr)
    if found.foreign is not None:
        found.problem = (
            f"{target.name} is not vLLM's own function: {found.foreign.name} from "
            f"{found.foreign.module} wraps it (another plugin?), and kvplan's wrapper would "
            "replace it without calling it"
        )
    return found
