"""The plugin's pipeline: capture → plan → reviewed-plan check → bind → verify.

The handlers the version adapters name (``_handlers``, and a mode's own) read vLLM's arguments
and call :class:`Runtime`: ``allocate`` for an ``allocate_kv_cache`` call, ``runner_entry``
and ``run_checked`` for the runner-level calls around it. Runner-level calls open a
:class:`CallContext` (runner, owner, ``is_profiling``, sharing map) that ``allocate`` reads.
Each step below does one thing; refusals are worded in ``refusals``. How a plan is bound is
the mode's (``_modes``), decided once. Bound caches live as long as their runner
(``_lifetime``).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.pipeline import _watch, features, refusals
from kvplan.integrations.vllm.pipeline._lifetime import discard, keep, release_owner
from kvplan.integrations.vllm.pipeline.announce import announce
from kvplan.integrations.vllm.pipeline.settings import Settings
from kvplan.schemas.errors import Findings, KVPlanError

if TYPE_CHECKING:
    from kvplan.executor import BoundKVCache
    from kvplan.integrations.vllm.pipeline._modes import Mode
    from kvplan.integrations.vllm.versions import Target, VersionAdapter
    from kvplan.schemas.input import InputDocument
    from kvplan.schemas.plan import BindingPlan

logger = logging.getLogger("vllm.kvplan")
"""A child of vLLM's logger, so messages use vLLM's log format and level."""


class Call:
    """One call of a wrapped vLLM function, as its wrapper received it.

    A plain class with slots, not a dataclass: a step makes five of them (one per wrapped
    call), and a frozen dataclass's ``__init__`` costs about a microsecond more each."""

    __slots__ = ("_arguments", "args", "kwargs", "original", "positions", "signature", "target")

    def __init__(
        self,
        original: Callable[..., Any],
        signature: inspect.Signature,
        target: Target,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        positions: Mapping[str, int] | None = None,
    ) -> None:
        self.original = original
        self.signature = signature
        self.target = target
        self.args = args
        self.kwargs = kwargs
        self.positions: Mapping[str, int] = {} if positions is None else positions
        """Where each positional parameter of ``signature`` sits in ``args``
        (:func:`positions_of`, computed once per wrapped function): :meth:`argument` reads
        one without binding them all."""
        self._arguments: dict[str, Any] | None = None

    @property
    def site(self) -> str:
        """The wrapped name, e.g. ``vllm.v1.worker.gpu_model_runner.allocate_kv_cache``."""
        return self.target.name

    def run(self) -> Any:
        """Call vLLM's original."""
        return self.original(*self.args, **self.kwargs)

    @property
    def arguments(self) -> dict[str, Any]:
        """Every parameter by name, defaults applied (bound once, at the first read)."""
        if self._arguments is None:
            bound = self.signature.bind(*self.args, **self.kwargs)
            bound.apply_defaults()
            self._arguments = dict(bound.arguments)
        return self._arguments

    def argument(self, name: str) -> Any:
        """One parameter by name, as :attr:`arguments` has it: read where the caller passed it
        when it did (binding every parameter costs microseconds, and a step calls several
        wrapped functions), else bound (a default)."""
        at = self.positions.get(name)
        if at is not None and at < len(self.args):
            return self.args[at]
        if name in self.kwargs:
            return self.kwargs[name]
        return self.arguments[name]


def positions_of(signature: inspect.Signature) -> dict[str, int]:
    """The positional parameters of ``signature`` by name, with their places in a call's
    positional arguments (the ones before a ``*args``)."""
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    places: dict[str, int] = {}
    for at, parameter in enumerate(signature.parameters.values()):
        if parameter.kind not in positional:
            break
        places[parameter.name] = at
    return places


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


def current_context() -> CallContext | None:
    """The innermost runner-level call in progress (``None`` outside every runner)."""
    return _CURRENT.get()


# -- steps --------------------------------------------------------------------------------


def rank_label() -> str:
    """``rank<N>``: this worker's global rank (``rank0`` outside torch.distributed).

    Raises ``KVP502`` when torch.distributed is initialised but the rank cannot be read:
    guessing would make ranks overwrite each other's dumps and use the wrong reviewed plan.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return "rank0"
    try:
        return f"rank{int(dist.get_rank())}"
    except Exception as exc:  # a half-initialised process group
        raise refusals.rank_unknown(exc) from None


def with_aliases(tensors: Mapping[str, Any], shared: Mapping[str, str]) -> dict[str, Any]:
    """``tensors`` plus each sharer bound to its target, as vLLM's alias loop does."""
    out = dict(tensors)
    for layer, target in shared.items():
        if target in out:
            out[layer] = out[target]
    return out


def layer_order(config: Any) -> list[str]:
    return [name for tensor in config.kv_cache_tensors for name in tensor.layers]


def capture_step(
    adapter: VersionAdapter,
    config: Any,
    shared: Mapping[str, str],
    layout: Any,
    kernel_block_sizes: Any,
    label: str,
    phase: str,
) -> InputDocument:
    """The worker's input document, captured with the release's adapter."""
    from kvplan.integrations.vllm.convert import capture

    return capture(
        config,
        adapter=adapter,
        shared_kv_cache_layers=shared,
        kernel_block_sizes=None if kernel_block_sizes is None else list(kernel_block_sizes),
        layout=layout,
        metadata={"source": "kvplan vLLM plugin", "rank": label, "phase": phase},
    )


def plan_step(document: InputDocument, settings: Settings) -> tuple[BindingPlan | None, Findings]:
    """The plan and its findings; ``strict`` makes every warning an error."""
    from kvplan.executor.backends import backend_info
    from kvplan.planner import build_plan

    # Pools are checked against the granules the backend maps in (torch: 1 byte, no check).
    granularity = backend_info(settings.backend).granularity_default
    result, findings = build_plan(document, granularity=granularity)
    return result, findings.as_errors() if settings.strict else findings


def dump_step(
    settings: Settings, label: str, phase: str, doc: InputDocument, plan: BindingPlan | None
) -> None:
    """``KVPLAN_DUMP_DIR/<rank>[.<phase>].{input,plan}.json``."""
    directory = settings.dump_dir
    if directory is None:
        return
    from kvplan.schemas.loading import dump

    stem = label if phase == "serving" else f"{label}.{phase}"
    items: list[tuple[Any, Any]] = [(doc, directory / f"{stem}.input.json")]
    if plan is not None:
        items.append((plan, directory / f"{stem}.plan.json"))
    for obj, path in items:
        try:
            dump(obj, path, within=directory, make_dirs=True, own=True)
        except OSError as exc:
            raise refusals.dump_unwritable(path, exc) from None


def verify_step(plan: BindingPlan, tensors: Mapping[str, Any], what: str, **kw: Any) -> None:
    from kvplan.executor import verify

    problems = verify(plan, tensors, **kw)
    if problems:
        raise refusals.mismatch(what, problems)


def placement_step(settings: Settings, ctx: CallContext | None, device: Any) -> None:
    """Refuse a memory pool or device the configured backend cannot bind in."""
    from kvplan.executor.backends import backend_info, backend_names

    backend = settings.backend
    info = backend_info(backend)
    pool = ctx.allocation_context if ctx else None
    pooled = pool is not None and not isinstance(pool, nullcontext)
    if pooled and not info.pooled_allocation_ok:
        able = [n for n in backend_names(plugin=True) if backend_info(n).pooled_allocation_ok]
        raise refusals.pooled_allocation(backend, able)
    if not info.accepts_device(device):
        able = [n for n in backend_names(plugin=True) if backend_info(n).accepts_device(device)]
        raise refusals.device_not_supported(backend, device, info.devices, able)


def bind_step(
    settings: Settings,
    mode: Mode,
    plan: BindingPlan,
    device: Any,
    ctx: CallContext | None,
    label: str,
) -> BoundKVCache:
    """Bind ``plan`` the mode's way with the configured backend, verify it, let the mode take
    the verified cache live, and tie it to the runner."""
    owner = ctx.owner if ctx else None
    release_owner(owner)  # the runner is replacing its cache
    cache = mode.bind(plan, backend=settings.backend, device=str(device))
    try:
        verify_step(plan, cache.tensors, "kvplan's binding", pools=cache.pools)
        on_close = mode.attach(cache, owner, label)
    except BaseException:
        cache.close()
        raise
    keep(owner, cache, on_close)
    return cache


# -- the runtime --------------------------------------------------------------------------


class Runtime:
    """The active plugin: settings, adapter, counters; runs the pipeline for the handlers."""

    def __init__(
        self,
        settings: Settings,
        mode: Mode,
        adapter: VersionAdapter,
        vllm_version: str,
        *,
        readers: Mapping[str, Callable[..., Any]],
        unpatched: Callable[[], list[str]],
    ) -> None:
        self.settings = settings
        self.mode = mode
        """How plans are bound (``KVPLAN_MODE``), decided once by the plugin."""
        self.adapter = adapter
        self.vllm_version = vllm_version
        self.active = True
        self.stats: Counter[str] = Counter()
        self._watches: dict[int, _watch.Watch] = {}
        """Per runner (``id``): what vLLM held once it had bound kvplan's caches."""
        self._readers = dict(readers)
        self._unpatched = unpatched

    def read(self, name: str) -> Callable[..., Any]:
        """The vLLM function behind one of the adapter's ``READ`` targets (its full name)."""
        return self._readers[name]

    def refuse(self, error: KVPlanError) -> KVPlanError:
        """Count a refusal; return it for raising, led by ``KVP501`` (``refusals.led``) and
        logged once as a block of its own, before vLLM's traceback (``announce``)."""
        self.stats["refused"] += 1
        return announce(refusals.led(error, self.vllm_version))

    # -- allocate_kv_cache ----------------------------------------------------------------

    def allocate(
        self,
        call: Call,
        *,
        config: Any,
        device: Any,
        layout: Any,
        kernel_block_sizes: Any,
        derive_sharing: Callable[[Any, CallContext | None], dict[str, str]],
    ) -> Any:
        """Plan, validate and bind one ``allocate_kv_cache`` call (profiling: check vLLM's)."""
        ctx = current_context()
        if not config.kv_cache_tensors:
            result = call.run()
            self._record(ctx, Record(call.site, "empty", self._label_or_unknown()))
            self.stats["empty"] += 1
            return result
        if ctx is not None and ctx.profiling is not None:
            profiling = ctx.profiling
        else:  # the engine core stamps the layout on every real config; profiling's has none
            profiling = config.kv_cache_layout is None
        where = refusals.Where(
            "rank?", (ctx.runner if ctx else None) or "unknown",
            "profiling" if profiling else "serving", call.site,
        )  # fmt: skip
        cache = None
        try:
            where = dataclasses.replace(where, label=rank_label())
            shared = derive_sharing(config, ctx)
            document = capture_step(
                self.adapter, config, shared, layout, kernel_block_sizes, where.label, where.phase
            )
            plan = self._plan(document, where)
            if not profiling:
                self._check_reviewed(plan, ctx, where)
                placement_step(self.settings, ctx, device)
                cache = bind_step(self.settings, self.mode, plan, device, ctx, where.label)
        except Exception as exc:
            cause = None if isinstance(exc, KVPlanError) else exc
            raise self.refuse(refusals.unexpected(exc, where, self.vllm_version)) from cause
        if cache is None:  # profiling: vLLM allocates (its own errors stay its own)
            result = call.run()
            try:
                verify_step(plan, with_aliases(result, shared), "vLLM's profiling allocation")
            except KVPlanError as exc:
                raise self.refuse(
                    refusals.bind_refused(exc.diagnostics, where, self.vllm_version)
                ) from None
            self._record(ctx, Record(call.site, where.phase, where.label, plan))
            self.stats["profiling"] += 1
            logger.info(
                "kvplan: %s %s runner: profiling config planned and checked (%d layers); "
                "vLLM allocates it",
                where.label, where.runner, len(plan.layers),
            )  # fmt: skip
            return result
        self._record(ctx, Record(call.site, where.phase, where.label, plan, cache))
        self.stats["bound"] += 1
        logger.info(
            "kvplan: %s %s runner bound %d layers + %d KV-sharing aliases from plan %s with "
            "%s (%s): %d bytes in %.1f ms",
            where.label, where.runner, len(plan.views), len(plan.aliases), plan.fingerprint[:19],
            cache.backend.name, cache.mode, plan.summary.pool_bytes,
            cache.timings_ms.get("total", 0.0),
        )  # fmt: skip
        return {name: cache.tensors[name] for name in layer_order(config)}

    def _label_or_unknown(self) -> str:
        try:
            return rank_label()
        except KVPlanError:
            return "rank?"

    def _plan(self, document: InputDocument, where: refusals.Where) -> BindingPlan:
        plan, findings = plan_step(document, self.settings)
        dump_step(self.settings, where.label, where.phase, document, plan)
        self.stats["plans"] += 1
        findings.raise_for_errors(strict=plan is None)
        assert plan is not None  # the planner gives no plan only with an error
        for problem in findings.warnings:
            logger.warning("kvplan: %s", problem.render())
        return plan

    def _check_reviewed(
        self, plan: BindingPlan, ctx: CallContext | None, where: refusals.Where
    ) -> None:
        if self.settings.plan_dir is None:
            return
        from kvplan.integrations.vllm.pipeline._reviewed import check_reviewed, model_of

        vllm_config = ctx.vllm_config if ctx and ctx.vllm_config is not None else None
        model = model_of(vllm_config if vllm_config is not None else current_vllm_config())
        path = check_reviewed(plan, self.settings.plan_dir, model, where.label)
        logger.info("kvplan: %s plan matches the reviewed plan %s", where.label, path)

    @staticmethod
    def _record(ctx: CallContext | None, record: Record) -> None:
        if ctx is not None:
            ctx.records.append(record)

    # -- runner-level calls ---------------------------------------------------------------

    def runner_entry(self, call: Call, **context: Any) -> Any:
        """Run a runner's entry in a context (owner, ``is_profiling``); no bypass allowed.
        Once vLLM's runner is done binding, note what it and its layers hold (``_watch``)."""
        runner = call.target.runner or "unknown"
        self._refuse_features(call.site, context.get("vllm_config"))
        with _enter(call.site, runner=runner, **context) as ctx:
            result = call.run()
        if not ctx.records:
            raise self.bypassed(call.site, runner)
        bound = [r for r in ctx.records if r.bound is not None]
        if bound and ctx.owner is not None:
            record = bound[-1]
            assert record.bound is not None
            watch = _watch.start(record.label, runner, ctx.owner, ctx.vllm_config, record.bound)
            self._watches[id(ctx.owner)] = watch
            misplaced = watch.misplaced()
            if misplaced:
                self._rebound(watch, misplaced, "when vLLM's runner finished binding")
        return result

    def check_step(self, owner: Any) -> None:
        """A step of runner ``owner`` is about to run: are its caches still kvplan's? (At the
        first step, then at most once every ``_watch.WATCH_PERIOD_SECONDS``.)"""
        watch = self._watches.get(id(owner))
        if watch is None or watch.runner is not owner:
            return
        now = _watch.due(watch)
        if now is None:
            return
        changed = _watch.check(watch, now)
        if changed:
            self._rebound(watch, changed, "at a step")

    def _rebound(self, watch: _watch.Watch, layers: list[str], when: str) -> None:
        problem = _watch.rebound(watch, layers, when)
        if self.settings.strict:
            raise self.refuse(problem)
        if not watch.warned:
            watch.warned = True
            logger.warning("kvplan: %s", problem.diagnostics[0].render())

    def run_checked(self, call: Call, **context: Any) -> Any:
        """Run ``call`` in a context; then demand a kvplan allocation and check vLLM's dict
        (its alias loop included) against the plan."""
        runner = call.target.runner or "unknown"
        self._refuse_features(call.site, context.get("vllm_config"))
        with _enter(call.site, runner=runner, **context) as ctx:
            before = len(ctx.records)
            result = call.run()
            new = ctx.records[before:]
        if not new:
            raise self.bypassed(call.site, runner)
        record = new[-1]
        if record.plan is not None:
            pools = record.bound.pools if record.bound is not None else None
            try:
                verify_step(record.plan, result, "the KV caches vLLM bound", pools=pools)
            except KVPlanError as exc:
                if record.bound is not None:  # refused: its memory goes back now
                    discard(record.bound)
                where = refusals.Where(record.label, runner, record.phase, call.site)
                raise self.refuse(
                    refusals.bind_refused(exc.diagnostics, where, self.vllm_version)
                ) from None
        return result

    def _refuse_features(self, site: str, vllm_config: Any) -> None:
        """``KVP509`` before anything is bound: a feature of the engine's config that kvplan
        cannot bind beside yet (``features``: sleep mode)."""
        if vllm_config is None:
            return
        problems = features.refusals(vllm_config, site)
        if problems:
            raise self.refuse(KVPlanError(problems))

    def bypassed(self, site: str, runner: str) -> KVPlanError:
        self.stats["bypassed"] += 1
        return refusals.bypassed(site, runner, self._unpatched())


def current_vllm_config() -> Any:
    """vLLM's current config (``set_current_vllm_config``), ``None`` outside one."""
    try:
        from vllm.config import vllm as config_module
    except ImportError:
        return None
    return getattr(config_module, "_current_vllm_config", None)
