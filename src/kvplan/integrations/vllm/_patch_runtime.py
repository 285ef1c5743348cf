"""What the plugin's wrappers do when vLLM calls them.

The runner-level wrappers open a :class:`CallContext` (the runner, ``is_profiling``, the
sharing map); ``allocate_kv_cache``'s wrapper reads it, then captures the config, plans,
validates and binds. Each runner-level wrapper also checks afterwards that an allocation
went through kvplan (else the call bypassed it) and that the dict vLLM built, with its own
alias loop, matches the plan. Bound caches live as long as their runner.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm._patch_lifetime import keep, release_owner
from kvplan.integrations.vllm._patch_settings import ENV_BACKEND, ENV_ENABLE, Settings
from kvplan.schemas.errors import Code, Diagnostic, KVPlanError, Severity, error

if TYPE_CHECKING:
    from kvplan.executor import BoundKVCache
    from kvplan.schemas.input import InputDocument
    from kvplan.schemas.plan import BindingPlan

logger = logging.getLogger("vllm.kvplan")
"""A child of vLLM's logger, so messages use vLLM's log format and level."""


@dataclass(frozen=True)
class Call:
    """One call of a patched vLLM function, as its wrapper received it."""

    original: Callable[..., Any]
    signature: inspect.Signature
    site: str
    """The patched name, e.g. ``vllm.v1.worker.gpu_model_runner.allocate_kv_cache``."""
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self) -> Any:
        """Call vLLM's original."""
        return self.original(*self.args, **self.kwargs)

    @functools.cached_property
    def arguments(self) -> dict[str, Any]:
        """Every parameter by name, defaults applied."""
        bound = self.signature.bind(*self.args, **self.kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)


Handler = Callable[[Call], Any]

_DISABLE_HINT = f"unset {ENV_ENABLE} to start vLLM without kvplan"


@dataclass
class Record:
    """One ``allocate_kv_cache`` call kvplan handled."""

    site: str
    phase: str
    """``serving``, ``profiling`` (vLLM's own allocation, checked) or ``empty`` (no tensors)."""
    label: str
    plan: BindingPlan | None = None
    bound: BoundKVCache | None = None


@dataclass
class CallContext:
    """What the runner-level wrappers know about the allocation in progress."""

    site: str
    runner: str | None = None
    owner: Any = None
    profiling: bool | None = None
    shared: dict[str, str] | None = None
    vllm_config: Any = None
    allocation_context: Any = None
    records: list[Record] = field(default_factory=list)
    """Shared with enclosing contexts, so an outer wrapper sees inner allocations."""


_CURRENT: ContextVar[CallContext | None] = ContextVar("kvplan_vllm_call", default=None)


@contextmanager
def _enter(site: str, **updates: Any) -> Iterator[CallContext]:
    parent = _CURRENT.get()
    known = {key: value for key, value in updates.items() if value is not None}
    ctx = dataclasses.replace(parent, site=site, **known) if parent else CallContext(site, **known)
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


# -- helpers ------------------------------------------------------------------------------


def rank_label() -> str:
    """``rank<N>``: this worker's global rank (``rank0`` outside torch.distributed)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return f"rank{dist.get_rank()}"
    except Exception:  # a half-initialised process group: fall back to 0
        pass
    return "rank0"


def _as_errors(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return [
        d if d.is_error else d.model_copy(update={"severity": Severity.ERROR}) for d in diagnostics
    ]


def _with_aliases(tensors: Mapping[str, Any], shared: Mapping[str, str]) -> dict[str, Any]:
    """``tensors`` plus each sharer bound to its target, as vLLM's alias loop does."""
    out = dict(tensors)
    for layer, target in shared.items():
        if target in out:
            out[layer] = out[target]
    return out


def _layer_order(config: Any) -> list[str]:
    return [name for tensor in config.kv_cache_tensors for name in tensor.layers]


def _current_vllm_config() -> Any:
    try:
        from vllm.config import vllm as config_module
    except ImportError:
        return None
    return getattr(config_module, "_current_vllm_config", None)


class Runtime:
    """The active plugin: settings, counters and the handlers its wrappers call."""

    def __init__(
        self,
        settings: Settings,
        vllm_version: str,
        *,
        shared_v2: Callable[[Any], Mapping[str, str]],
        unpatched: Callable[[], list[str]],
    ) -> None:
        self.settings = settings
        self.vllm_version = vllm_version
        self.active = True
        self.stats: Counter[str] = Counter()
        self._shared_v2 = shared_v2
        self._unpatched = unpatched

    def handler(self, role: str) -> Handler:
        """The handler of a target role (see ``_patch_targets``)."""
        from kvplan.integrations.vllm import _patch_targets as t

        return {
            t.ALLOCATE: self.allocate,
            t.HISPARSE: self.refuse_hisparse,
            t.RUNNER: self.runner_entry,
            t.V1_TENSORS: self.v1_tensors,
            t.V2_INIT: self.v2_init,
        }[role]

    # -- allocate_kv_cache ----------------------------------------------------------------

    def allocate(self, call: Call) -> Any:
        """Plan, validate and bind one ``allocate_kv_cache`` call (profiling: check vLLM's)."""
        if not self.active:
            return call.run()
        site = call.site
        config = call.arguments["kv_cache_config"]
        device = call.arguments["device"]
        ctx = _CURRENT.get()
        label = rank_label()
        if not config.kv_cache_tensors:
            result = call.run()
            self._record(ctx, Record(site, "empty", label))
            self.stats["empty"] += 1
            return result
        if ctx is not None and ctx.profiling is not None:
            profiling = ctx.profiling
        else:  # the engine core stamps the layout on every real config; profiling's has none
            profiling = config.kv_cache_layout is None
        phase = "profiling" if profiling else "serving"
        runner = (ctx.runner if ctx else None) or "unknown"
        refuse = functools.partial(
            self._refuse_from, label=label, runner=runner, phase=phase, site=site
        )
        cache = None
        try:
            shared = self._sharing_map(config, ctx, site)
            document = self._capture(config, shared, call.arguments, label, phase)
            plan = self._plan(document, label, phase)
            if not profiling:
                self._check_allocation_context(ctx, device)
                cache = self._bind(plan, device, ctx)
        except Exception as exc:
            raise refuse(exc) from (None if isinstance(exc, KVPlanError) else exc)
        if cache is None:  # profiling: vLLM allocates (its own errors stay its own)
            result = call.run()
            try:
                self._verify(plan, _with_aliases(result, shared), "vLLM's profiling allocation")
            except KVPlanError as exc:
                raise refuse(exc) from None
            self._record(ctx, Record(site, phase, label, plan))
            self.stats["profiling"] += 1
            logger.info(
                "kvplan: %s %s runner: profiling config planned and checked (%d layers); "
                "vLLM allocates it",
                label, runner, len(plan.layers),
            )  # fmt: skip
            return result
        self._record(ctx, Record(site, phase, label, plan, cache))
        self.stats["bound"] += 1
        logger.info(
            "kvplan: %s %s runner bound %d layers + %d KV-sharing aliases from plan %s with "
            "%s (%s): %d bytes in %.1f ms",
            label, runner, len(plan.views), len(plan.aliases), plan.fingerprint[:19],
            cache.backend.name, cache.mode, plan.summary.pool_bytes,
            cache.timings_ms.get("total", 0.0),
        )  # fmt: skip
        return {name: cache.tensors[name] for name in _layer_order(config)}

    def _record(self, ctx: CallContext | None, record: Record) -> None:
        if ctx is not None:
            ctx.records.append(record)

    def _sharing_map(self, config: Any, ctx: CallContext | None, site: str) -> dict[str, str]:
        """The runner's sharing map; else derived from the config and the forward context."""
        if ctx is not None and ctx.shared is not None:
            return dict(ctx.shared)
        backed = {name for tensor in config.kv_cache_tensors for name in tensor.layers}
        unbacked = [
            name
            for group in config.kv_cache_groups
            if type(group.kv_cache_spec).__name__ != "EncoderOnlyAttentionSpec"
            and group.kv_cache_spec.has_layer_views
            for name in group.layer_names
            if name not in backed
        ]
        if not unbacked:
            return {}
        vllm_config = (ctx.vllm_config if ctx else None) or _current_vllm_config()
        forward = getattr(
            getattr(vllm_config, "compilation_config", None), "static_forward_context", None
        )
        shared = {
            name: target
            for name, layer in (forward or {}).items()
            if (target := getattr(layer, "kv_sharing_target_layer_name", None))
        }
        missing = [name for name in unbacked if name not in shared]
        if missing:
            raise KVPlanError(
                error(
                    Code.INTEGRATION,
                    site,
                    f"{len(missing)} layer(s) sit in a KV cache group but own no tensor, and "
                    f"kvplan cannot tell whose cache they read: {', '.join(missing[:4])}.",
                    "call allocate_kv_cache through a vLLM runner (which knows its sharing "
                    "map), or inside set_current_vllm_config",
                )
            )
        return shared

    def _capture(
        self,
        config: Any,
        shared: Mapping[str, str],
        arguments: Mapping[str, Any],
        label: str,
        phase: str,
    ) -> InputDocument:
        from kvplan.integrations.vllm.capture import capture

        kernel_block_sizes = arguments["kernel_block_sizes"]
        return capture(
            config,
            shared_kv_cache_layers=shared,
            kernel_block_sizes=None if kernel_block_sizes is None else list(kernel_block_sizes),
            layout=arguments["layout"],
            metadata={"source": "kvplan vLLM plugin", "rank": label, "phase": phase},
        )

    def _plan(self, document: InputDocument, label: str, phase: str) -> BindingPlan:
        from kvplan.planner import VMM_GRANULARITY, build_plan

        # Only VMM backends allocate in granules; the torch backend allocates exact sizes.
        granularity = 0 if self.settings.backend == "torch" else VMM_GRANULARITY
        result, problems = build_plan(document, granularity=granularity)
        self._dump(label, phase, document, result)
        self.stats["plans"] += 1
        errors = (
            _as_errors(problems) if self.settings.strict else [p for p in problems if p.is_error]
        )
        if errors or result is None:
            raise KVPlanError(errors or _as_errors(problems))
        for problem in problems:
            logger.warning("kvplan: %s", problem.render())
        return result

    def _dump(self, label: str, phase: str, doc: InputDocument, plan: BindingPlan | None) -> None:
        directory = self.settings.dump_dir
        if directory is None:
            return
        from kvplan.schemas.loading import dump

        stem = label if phase == "serving" else f"{label}.{phase}"
        paths: list[tuple[Any, Path]] = [(doc, directory / f"{stem}.input.json")]
        if plan is not None:
            paths.append((plan, directory / f"{stem}.plan.json"))
        for obj, path in paths:
            try:
                directory.mkdir(parents=True, exist_ok=True)
                dump(obj, path)
            except OSError as exc:
                raise KVPlanError(
                    error(
                        Code.INTEGRATION,
                        "KVPLAN_DUMP_DIR",
                        f"cannot write {path}: {exc.strerror or exc}.",
                        "point KVPLAN_DUMP_DIR at a writable directory, or unset it",
                    )
                ) from None

    def _verify(self, plan: BindingPlan, tensors: Mapping[str, Any], what: str, **kw: Any) -> None:
        from kvplan.executor import verify

        problems = verify(plan, tensors, **kw)
        if problems:
            raise KVPlanError(
                [
                    error(
                        Code.INTEGRATION,
                        "verify",
                        f"{what} does not match the plan ({len(problems)} difference(s)).",
                        "kvplan's model of this vLLM is wrong for this config; please report it",
                    ),
                    *_as_errors(problems),
                ]
            )

    def _check_allocation_context(self, ctx: CallContext | None, device: Any) -> None:
        backend = self.settings.backend
        pool = ctx.allocation_context if ctx else None
        if backend != "torch" and pool is not None and not isinstance(pool, nullcontext):
            raise KVPlanError(
                error(
                    Code.INTEGRATION,
                    "kv_cache_allocation_context",
                    "vLLM asked to place the KV cache in a memory pool (sleep mode's CuMem "
                    f"allocator or a KV connector's pool); the {backend} backend maps its own "
                    "memory outside any pool.",
                    f"set {ENV_BACKEND}=torch (allocates inside the pool), or turn off sleep "
                    "mode / the connector's memory pool",
                )
            )
        if backend == "host-vmm" and str(device).split(":")[0] != "cpu":
            raise KVPlanError(
                error(
                    Code.INTEGRATION,
                    ENV_BACKEND,
                    f"the host-vmm backend maps CPU memory, but this worker's device is {device}.",
                    f"set {ENV_BACKEND}=cuda-vmm or torch",
                )
            )

    def _bind(self, plan: BindingPlan, device: Any, ctx: CallContext | None) -> BoundKVCache:
        from kvplan.executor import apply

        owner = ctx.owner if ctx else None
        release_owner(owner)  # the runner is replacing its cache
        settings = self.settings
        elastic = settings.mode == "elastic"
        cache = apply(
            plan,
            backend=settings.backend,
            device=str(device),
            mode="elastic" if elastic else "eager",
        )
        try:
            if elastic:
                # vLLM's block pool does not report which blocks are in use: map them all.
                cache.ensure_mapped(range(plan.source.num_blocks))
            self._verify(plan, cache.tensors, "kvplan's binding", pools=cache.pools)
        except BaseException:
            cache.close()
            raise
        keep(owner, cache)
        return cache

    def _refusal(
        self, diagnostics: list[Diagnostic], label: str, runner: str, phase: str, site: str
    ) -> KVPlanError:
        errors = [d for d in diagnostics if d.is_error] or diagnostics
        first = errors[0] if errors else None
        where = f" at {first.location}" if first and first.location else ""
        cause = f"{first.code.value}{where}: {first.message}" if first else "no reason given"
        lead = error(
            Code.INTEGRATION,
            site,
            f"kvplan refused to bind the KV cache of {label} ({runner} runner, {phase}, "
            f"vLLM {self.vllm_version}): {cause}",
            _DISABLE_HINT,
        )
        return KVPlanError([lead, *diagnostics])

    def _refuse_from(
        self, exc: Exception, *, label: str, runner: str, phase: str, site: str
    ) -> KVPlanError:
        """The start-up refusal for ``exc`` (a kvplan error, or anything kvplan or torch
        raised while planning or binding)."""
        self.stats["refused"] += 1
        if isinstance(exc, KVPlanError):
            return self._refusal(exc.diagnostics, label, runner, phase, site)
        unexpected = error(
            Code.INTEGRATION,
            site,
            f"{type(exc).__name__} while planning or binding: {exc}",
            "please report this with the files KVPLAN_DUMP_DIR writes",
        )
        return self._refusal([unexpected], label, runner, phase, site)

    # -- runner-level wrappers ------------------------------------------------------------

    def refuse_hisparse(self, call: Call) -> Any:
        """HiSparse allocates a host pool kvplan does not plan: refuse."""
        if not self.active:
            return call.run()
        raise self._hisparse(call.site)

    def _hisparse(self, site: str) -> KVPlanError:
        self.stats["refused"] += 1
        return KVPlanError(
            error(
                Code.INTEGRATION,
                site,
                f"kvplan's vLLM plugin does not support HiSparse KV caches "
                f"(attention_config.hisparse_config is set; vLLM {self.vllm_version}).",
                _DISABLE_HINT,
            )
        )

    def runner_entry(self, call: Call) -> Any:
        """A runner's ``initialize_kv_cache``: owner + ``is_profiling``; no bypass allowed."""
        if not self.active:
            return call.run()
        runner = call.arguments["self"]
        kind = "V2" if ".gpu." in call.site else "V1"
        with _enter(
            call.site,
            runner=kind,
            owner=runner,
            profiling=bool(call.arguments["is_profiling"]),
            vllm_config=getattr(runner, "vllm_config", None),
        ) as ctx:
            result = call.run()
        if not ctx.records:
            raise self._bypass(call.site, kind)
        return result

    def v1_tensors(self, call: Call) -> Any:
        """V1 ``initialize_kv_cache_tensors``: the runner's sharing map; check vLLM's dict."""
        if not self.active:
            return call.run()
        runner = call.arguments["self"]
        shared = getattr(runner, "shared_kv_cache_layers", None)
        if not isinstance(shared, Mapping):
            raise KVPlanError(
                error(
                    Code.INTEGRATION,
                    call.site,
                    f"the V1 runner has no shared_kv_cache_layers map (vLLM {self.vllm_version}).",
                    _DISABLE_HINT,
                )
            )
        return self._run_checked(
            call,
            "V1",
            owner=runner,
            shared=dict(shared),
            vllm_config=getattr(runner, "vllm_config", None),
            allocation_context=call.arguments["kv_cache_allocation_context"],
        )

    def v2_init(self, call: Call) -> Any:
        """V2 ``init_kv_cache``: ``get_shared_kv_cache_layers(vllm_config)``; check the dict."""
        if not self.active:
            return call.run()
        vllm_config = call.arguments["vllm_config"]
        attention = getattr(vllm_config, "attention_config", None)
        if getattr(attention, "hisparse_config", None) is not None:
            raise self._hisparse(call.site)
        return self._run_checked(
            call,
            "V2",
            shared=dict(self._shared_v2(vllm_config)),
            vllm_config=vllm_config,
            allocation_context=call.arguments["kv_cache_allocation_context"],
        )

    def _run_checked(self, call: Call, runner: str, **updates: Any) -> Any:
        """Run ``call`` in a context; then demand a kvplan allocation and check vLLM's dict
        (its alias loop included) against the plan."""
        with _enter(call.site, runner=runner, **updates) as ctx:
            before = len(ctx.records)
            result = call.run()
            new = ctx.records[before:]
        if not new:
            raise self._bypass(call.site, runner)
        record = new[-1]
        if record.plan is not None:
            pools = record.bound.pools if record.bound is not None else None
            try:
                self._verify(record.plan, result, "the KV caches vLLM bound", pools=pools)
            except KVPlanError as exc:
                self.stats["refused"] += 1
                raise self._refusal(
                    exc.diagnostics, record.label, runner, record.phase, call.site
                ) from None
        return result

    def _bypass(self, site: str, runner: str) -> KVPlanError:
        self.stats["bypassed"] += 1
        unpatched = self._unpatched()
        detail = f" Call sites no longer wrapped: {', '.join(unpatched)}." if unpatched else ""
        return KVPlanError(
            error(
                Code.INTEGRATION,
                site,
                f"vLLM's {runner} runner finished {site} without allocating through kvplan: "
                f"the KV cache came from a path kvplan does not wrap.{detail}",
                "run `kvplan doctor`; " + _DISABLE_HINT,
            )
        )
