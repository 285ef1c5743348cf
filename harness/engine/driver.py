"""Run real vLLM engines in one process and write their greedy tokens (run by the engine venv).

``python driver.py JOB.json RESULT.json``. The job names a model folder, engine options, token-id
prompts and a list of *variants*; each variant is one engine: its environment (``KVPLAN_*``),
and optionally a ``break`` (a binding broken on purpose, test-only). Engines run in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) one after the other; kvplan's plugin is switched per
engine with ``register``/``unregister``, except for the first kvplan engine of the process,
which vLLM's own plugin loader (the ``vllm.general_plugins`` entry point) activates.

With ``"multiprocessing": true`` in the job, vLLM's default executor runs instead: the engine
core and every worker in processes vLLM spawns (each loads the plugin through the entry
point, from the variant's environment). What the driver patches in its own process does not
reach them, so there: the weights are a real checkpoint (``_weights``), a ``break`` or
``reported_map_failure`` is installed in each worker by ``_worker_hooks`` (vLLM's
``worker_cls``), preemptions are vLLM's own ``vllm:num_preemptions`` metric, ``idle_step`` is
refused, and the engine is shut down before the next one starts. Each batch reaches the
engine core whole before it schedules any of it (``generate_pinned``), so the steps are the
in-process engine's, not a race between requests arriving and the engine core stepping.

After loading, every weight is re-drawn at a realistic scale from a fixed seed (vLLM's dummy
weights are too weak to make tokens depend on the KV cache). The result holds, per variant:
tokens per prompt, the plugin's stats, who activated it, seconds to start and to generate.

This file imports only vLLM, torch and kvplan: it runs outside the test suite's environment.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

_PREEMPTIONS: list[int] = [0]


def count_preemptions() -> None:
    """Count the scheduler's preemptions (test instrumentation: vLLM's own method, wrapped)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    preempt = Scheduler._preempt_request

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        _PREEMPTIONS[0] += 1
        return preempt(self, *args, **kwargs)

    Scheduler._preempt_request = counted  # type: ignore[method-assign]


CPU_RUNNER = "vllm.v1.worker.cpu_model_runner|vllm.v1.worker.cpu.model_runner"
"""The CPU model runner's module: the V1 runner's up to vLLM 0.33, the V2-based one from 0.34."""
STEP_TIMERS = (
    ("schedule", "vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    ("update_from_output", "vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output"),
    ("worker.execute_model", "vllm.v1.worker.gpu_worker", "Worker", "execute_model"),
    ("runner.execute_model", CPU_RUNNER, "CPUModelRunner", "execute_model"),
    ("worker.sample_tokens", "vllm.v1.worker.gpu_worker", "Worker", "sample_tokens"),
    ("runner.sample_tokens", CPU_RUNNER, "CPUModelRunner", "sample_tokens"),
)
"""``"step_timers": true`` in the job: where a step's time goes, per variant. Each function is
timed as vLLM calls it, after kvplan's plugin wrapped it (so a ``Scheduler`` or ``Worker``
timer holds kvplan's handler too; the model runner's are vLLM's alone): installed for the
variant's ``generate`` only, on top of whatever sits there."""


@contextmanager
def step_timers(into: dict[str, dict[str, float]]) -> Iterator[None]:
    """Time :data:`STEP_TIMERS` (seconds and calls, into ``into``) while the block runs."""
    patched: list[tuple[Any, str, Any]] = []
    for key, module, cls_name, name in STEP_TIMERS:
        cls = timer_class(module, cls_name)
        own = cls.__dict__.get(name)  # None: inherited (put back by removing the timer)
        inner = own or getattr(cls, name)
        setattr(cls, name, _timed(inner, into.setdefault(key, {"seconds": 0.0, "calls": 0})))
        patched.append((cls, name, own))
    try:
        yield
    finally:
        _put_back(patched)


def timer_class(modules: str, cls_name: str) -> Any:
    """The class ``cls_name`` of the first of ``modules`` (``a|b``) the installed vLLM has."""
    import importlib

    *earlier, last = modules.split("|")
    for module in earlier:
        try:
            return getattr(importlib.import_module(module), cls_name)
        except ModuleNotFoundError:
            continue
    return getattr(importlib.import_module(last), cls_name)


def _timed(
    inner: Any, figures: dict[str, float], inside: list[float] | None = None
) -> Callable[..., Any]:
    """``inner``, counting its calls and seconds into ``figures``; ``inside``: seconds spent
    in nested calls that are not to be counted (a running total kept by whoever times them)."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        before, started = (inside[0] if inside else 0.0), time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            nested = inside[0] - before if inside else 0.0
            figures["seconds"] += time.perf_counter() - started - nested
            figures["calls"] += 1

    return timed


def _put_back(patched: list[tuple[Any, str, Any]]) -> None:
    """Undo the timers: each class gets back what it had (``None``: it inherited it)."""
    for cls, name, own in reversed(patched):
        if own is None:
            delattr(cls, name)
        else:
            setattr(cls, name, own)


HANDLER_TIMERS = (
    ("schedule", "kvplan.integrations.vllm.elastic._mode", "ElasticMode", "schedule"),
    ("update_from_output", "kvplan.integrations.vllm.elastic._mode", "ElasticMode",
     "update_from_output"),
    ("before_step", "kvplan.integrations.vllm.elastic._mode", "ElasticMode", "before_step"),
    ("after_step", "kvplan.integrations.vllm.elastic._mode", "ElasticMode", "after_step"),
    ("sample_tokens", "kvplan.integrations.vllm.elastic._mode", "ElasticMode", "sample_tokens"),
    ("pool.get_num_free_blocks", "kvplan.integrations.vllm.elastic._pool", "_ElasticPool",
     "get_num_free_blocks"),
    ("pool.get_new_blocks", "kvplan.integrations.vllm.elastic._pool", "_ElasticPool",
     "get_new_blocks"),
    ("pool.free_blocks", "kvplan.integrations.vllm.elastic._pool", "_ElasticPool", "free_blocks"),
)  # fmt: skip
"""With ``"step_timers"``: kvplan's own time in each elastic handler -- its time less the time
in the vLLM function it wraps (``Call.run``), so vLLM's own work is not counted -- and in each
method of the elastic block pool (these include vLLM's own pool method, which they call).
Installed before the plugin registers (the mode's handlers are bound then), counted for the
variant's ``generate`` only."""


@contextmanager
def handler_timers(into: dict[str, dict[str, float]]) -> Iterator[None]:
    """Time :data:`HANDLER_TIMERS` (seconds and calls, into ``into``) while the block runs."""
    import importlib

    from kvplan.integrations.vllm.pipeline import Call

    inside = [0.0]  # seconds in vLLM's originals, run through Call.run
    run = Call.run

    def timed_run(self: Any) -> Any:
        started = time.perf_counter()
        try:
            return run(self)
        finally:
            inside[0] += time.perf_counter() - started

    patched: list[tuple[Any, str, Any]] = [(Call, "run", run)]
    Call.run = timed_run  # type: ignore[method-assign]
    for key, module, cls_name, name in HANDLER_TIMERS:
        cls = getattr(importlib.import_module(module), cls_name)
        inner = cls.__dict__[name]
        figures = into.setdefault(key, {"seconds": 0.0, "calls": 0})
        setattr(cls, name, _timed(inner, figures, inside))
        patched.append((cls, name, inner))
    try:
        yield
    finally:
        _put_back(patched)


def idle_step(llm: Any) -> None:
    """One more engine-core step after every request finished, as a server's busy loop makes
    (vLLM steps while it has finished requests to report); the offline LLM does not."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    if core is None:
        raise SystemExit("driver: idle_step needs the in-process engine core")
    core.step_fn()


def dumped_stats(env: dict[str, str]) -> dict[str, Any]:
    """``rank<N>.stats.json`` files of the variant's dump directory, by file name."""
    folder = env.get("KVPLAN_DUMP_DIR")
    if not folder or not os.path.isdir(folder):
        return {}
    found = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".stats.json"):
            with open(os.path.join(folder, name)) as handle:
                found[name] = json.load(handle)
    return found


def redraw_weights(model: Any, seed: int, gain: float) -> int:
    """Re-draw every parameter from ``seed``: matrices N(0, gain²/fan_in), vectors
    1 + N(0, 0.1²); in name order, so every engine of a model gets the same weights."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    count = 0
    with torch.no_grad():
        for _, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            shape = tuple(param.shape)
            if param.ndim >= 2:
                values = gain * torch.randn(shape, generator=gen) / max(shape[-1], 1) ** 0.5
            else:
                values = 1.0 + 0.1 * torch.randn(shape, generator=gen)
            param.copy_(values.to(param.dtype))
            count += 1
    return count


_REDRAWN: list[int] = []


def install_redraw(seed: int, gain: float) -> None:
    """Re-draw the dummy loader's weights before vLLM post-processes them (CPU GEMMs pack
    their weights then: changing parameters after the load would change nothing)."""
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    load = DummyModelLoader.load_weights

    def load_weights(self: Any, model: Any, model_config: Any) -> None:
        load(self, model, model_config)
        _REDRAWN.append(redraw_weights(model, seed, gain))

    DummyModelLoader.load_weights = load_weights  # type: ignore[method-assign]


def _break_binding(
    kind: str, caches: dict[str, Any], forward_context: dict[str, Any], target_layers: int
) -> None:
    """Change which tensor layers are given (in place); vLLM's returned dict stays intact.

    ``target_layers``: the target model's layer count; a drafter's layers (a draft model's,
    named ``draft_model.*``, or an EAGLE head's, numbered after the target's) are left alone
    by ``swap`` and ``private-sharers`` and are the only ones ``swap-draft`` breaks."""
    import torch

    drafts = kind == "swap-draft"
    names = sorted((n for n in caches if _is_drafter(n, target_layers) == drafts), key=_layer_index)
    sharers = [
        name
        for name in names
        if getattr(forward_context.get(name), "kv_sharing_target_layer_name", None)
    ]
    if kind in ("swap", "swap-draft"):  # the last KV-owning layer is given an earlier one's
        owners = [name for name in names if name not in sharers]
        if not owners:
            raise SystemExit(f"driver: break={kind} but the engine has no such layers")
        last = owners[-1]
        donors = [
            name
            for name in owners[:-1]
            if caches[name].shape == caches[last].shape
            and caches[name].data_ptr() != caches[last].data_ptr()
        ]
        if not donors:
            raise SystemExit(f"driver: break={kind} but no two KV-owning layers share a shape")
        caches[last] = caches[donors[-1]]
    elif kind == "private-sharers":  # KV-sharing layers get private, empty caches
        if not sharers:
            raise SystemExit("driver: break=private-sharers but the model shares no KV cache")
        for name in sharers:
            caches[name] = torch.zeros_like(caches[name])
    else:
        raise SystemExit(f"driver: unknown break {kind!r}")


def _is_drafter(name: str, target_layers: int) -> bool:
    """Whether layer ``name`` is a speculative drafter's (see :func:`_break_binding`)."""
    return name.startswith("draft_model.") or _layer_index(name) >= target_layers


def _layer_index(name: str) -> int:
    digits = [int(part) for part in name.split(".") if part.isdigit()]
    return digits[0] if digits else -1


def install_break(kind: str | None, target_layers: int = 1 << 30) -> None:
    """Wrap the V1 runner's ``bind_kv_cache`` so layers get broken tensors (``None``: undo).

    vLLM 0.32+ binds the layers to ``layer_kv_caches`` (kernel-block views) when given; 0.29
    to 0.31 have no such parameter and bind the layers to ``kv_caches`` itself. Either way
    the layers get a broken copy and the runner keeps (and kvplan checks) vLLM's own dict.
    """
    import inspect

    from vllm.v1.worker import gpu_model_runner

    original = getattr(gpu_model_runner.bind_kv_cache, "__driver_original__", None)
    if original is not None:
        gpu_model_runner.bind_kv_cache = original
    if kind is None:
        return
    bind = gpu_model_runner.bind_kv_cache
    layer_views = "layer_kv_caches" in inspect.signature(bind).parameters

    def broken(kv_caches: Any, forward_context: Any, runner_kv_caches: Any, *a: Any, **kw: Any):
        layer_caches = kw.get("layer_kv_caches")
        caches = dict(layer_caches if layer_caches is not None else kv_caches)
        _break_binding(kind, caches, forward_context, target_layers)
        if not layer_views:
            return bind(caches, forward_context, runner_kv_caches, *a, **kw)
        kw["layer_kv_caches"] = caches
        return bind(kv_caches, forward_context, runner_kv_caches, *a, **kw)

    broken.__driver_original__ = bind  # type: ignore[attr-defined]
    gpu_model_runner.bind_kv_cache = broken


def scramble_store(source: str, engine: dict[str, Any]) -> None:
    """Copy an ExampleConnector store into the folder ``engine``'s connector reads, every
    saved tensor negated (what a consumer loads from it is then wrong)."""
    import shutil

    from safetensors.torch import load_file, save_file

    extra = engine["kv_transfer_config"]["kv_connector_extra_config"]
    target = extra["shared_storage_path"]
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    for folder, _, files in os.walk(target):
        for name in files:
            if name.endswith(".safetensors"):
                path = os.path.join(folder, name)
                save_file({k: -v for k, v in load_file(path).items()}, path)


def target_layer_count(model: str) -> int:
    """The target model's layer count (``num_hidden_layers`` of its ``config.json``)."""
    with open(os.path.join(model, "config.json")) as handle:
        return int(json.load(handle)["num_hidden_layers"])


def install_reported_map_failure(on: bool) -> None:
    """Reference for a failed map (test-only): the map ``KVPLAN_DEBUG_FAIL_MAP`` names is made
    -- the memory is there -- and then reported as failed, so the scheduler recovers exactly
    as it does from a real failure (same preemptions, evictions, batches) but no step ever
    ran over unbacked memory. ``False``: undo."""
    from kvplan.integrations.vllm import elastic as _elastic

    original = getattr(_elastic.WorkerSide._map, "__driver_original__", None)
    if original is not None:
        _elastic.WorkerSide._map = original  # type: ignore[method-assign]
    if not on:
        return
    real = _elastic.WorkerSide._map

    def mapped_then_reported(self: Any, blocks: tuple[int, ...], inject: bool) -> None:
        if not inject:
            return real(self, blocks, inject)
        from kvplan.schemas.errors import Code, KVPlanError, error

        self.cache.ensure_mapped(blocks)
        raise KVPlanError(
            error(Code.DRIVER_CALL_FAILED, "driver", "mapped, reported as failed", "none")
        )

    mapped_then_reported.__driver_original__ = real  # type: ignore[attr-defined]
    _elastic.WorkerSide._map = mapped_then_reported  # type: ignore[method-assign]


def _set_env(env: dict[str, str]) -> None:
    """The variant's environment: every ``KVPLAN_*`` setting of the variant before it gone
    (a list of the names to clear went stale twice: a new setting leaked into every later
    engine of the driver), then ``env``."""
    for key in [k for k in os.environ if k.startswith("KVPLAN_")] + [HOOKS_ENV]:
        os.environ.pop(key, None)
    os.environ.update(env)


HOOKS_ENV = "ENGINE_TEST_HOOKS"
"""Read by ``_worker_hooks`` in each worker process (multiprocessing jobs)."""


def worker_hooks(variant: dict[str, Any]) -> str:
    """The ``_worker_hooks`` names of a variant's test-only patches (multiprocessing)."""
    hooks = [f"break={variant['break']}"] if variant.get("break") else []
    if variant.get("reported_map_failure"):
        hooks.append("reported-map-failure")
    return ",".join(hooks)


def metric(llm: Any, name: str) -> float | None:
    """A counter of vLLM's own metrics (``disable_log_stats=False``), summed over labels."""
    found = [m for m in llm.get_metrics() if m.name == name]
    if not found:
        return None
    return float(sum(getattr(m, "value", 0) for m in found))


def generate_pinned(llm: Any, prompts: list[Any], params: Any) -> list[Any]:
    """``llm.generate`` for a multiprocess engine, with every request queued before the
    engine core schedules any: vLLM's own level-0 sleep pauses the scheduler (requests are
    accepted, not run), the requests are added, and waking up -- a call on the same socket,
    after the adds -- lets the scheduler see them all at once, as an in-process engine does."""
    engine = llm.llm_engine
    llm.sleep(level=0, mode="keep")
    names = [f"pinned-{next(_PINNED)}" for _ in prompts]
    # vLLM returns its internal id (the name with a random suffix); outputs name the request
    # as it was added
    internal = [engine.add_request(n, p, params) for n, p in zip(names, prompts, strict=True)]
    llm.wake_up(tags=["scheduling"])
    finished: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    return [finished.get(n) or finished[i] for n, i in zip(names, internal, strict=True)]


_PINNED = itertools.count()


SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
"""vLLM's own speculative-decoding counters, read around a variant's ``generate`` when its
engine decodes speculatively (with ``disable_log_stats=False``)."""


def counters(llm: Any, engine: dict[str, Any]) -> dict[str, float]:
    """The engine's :data:`SPEC_COUNTERS` now (none for an engine without a draft or stats)."""
    if not engine.get("speculative_config") or engine.get("disable_log_stats", True):
        return {}
    return {name: metric(llm, name) or 0.0 for name in SPEC_COUNTERS}


def lora_request(folder: str | None) -> Any:
    """vLLM's request for the LoRA adapter in ``folder`` (``None``: no adapter)."""
    if not folder:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest("adapter", 1, folder)


def shut_down(llm: Any) -> None:
    """Stop a multiprocess engine's processes (the engine core and its workers)."""
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


def _collected_llm_shuts_down() -> bool:
    """Whether an offline ``LLM``, once collected, shuts its in-process engine core down:
    from vLLM 0.31 (its ``InprocClient`` has a finalizer); before, the engine core -- and the
    KV cache it binds -- lives until the process exits, unless shut down explicitly."""
    import vllm

    major, minor = (int(x) for x in vllm.__version__.split(".")[:2])
    return (major, minor) >= (0, 31)


TARGET = "@target"
"""A speculative config's ``model`` that names the job's own model (a draft equal to it)."""


def variant_setup(job: dict[str, Any], variant: dict[str, Any]) -> tuple[dict[str, str], Any]:
    """A variant's ``KVPLAN_*`` environment and its engine options (with the test hooks'
    worker class under multiprocessing)."""
    env = {str(k): str(v) for k, v in variant.get("env", {}).items()}
    engine = {**job["engine"], **variant.get("engine", {})}
    draft = engine.get("speculative_config")
    if isinstance(draft, dict) and draft.get("model") == TARGET:
        engine["speculative_config"] = {**draft, "model": job["model"]}
    if job.get("multiprocessing"):
        if variant.get("idle_step"):
            raise SystemExit("driver: idle_step needs the in-process engine core")
        hooks = ",".join(h for h in (env.get(HOOKS_ENV, ""), worker_hooks(variant)) if h)
        if hooks:
            env[HOOKS_ENV] = hooks
            engine["worker_cls"] = "_worker_hooks.HookedWorker"
        engine.setdefault("disable_log_stats", False)  # vllm:num_preemptions
    return env, engine


def run_on_nodes(job: dict[str, Any], variant: dict[str, Any], first: bool) -> dict[str, Any]:
    """``run_variant``; with ``"nodes": 2`` in the job, as node 0 of a two-node engine whose
    node 1 (``_nodes.RemoteNode``) runs in a process tree of its own for this variant."""
    if int(job.get("nodes", 1)) == 1:
        return run_variant(job, variant, first)
    import _nodes  # harness/engine/_nodes.py, a top-level module here

    port = _nodes.free_port()
    variant = {**variant, "engine": {**variant.get("engine", {}), **_nodes.node0_options(port)}}
    env, engine = variant_setup(job, variant)
    _set_env(env)  # node 1's environment is node 0's (``run_variant`` sets it again)
    log = Path(f"node1-{variant['name']}.log").resolve()
    node = _nodes.RemoteNode(job["model"], engine, dict(os.environ), log)
    node.start()
    pid_file = Path(_nodes.PID_FILE)  # the harness's way to node 1 if this driver hangs
    pid_file.write_text(str(node.pid))
    result: dict[str, Any] = {"name": variant["name"]}
    try:
        result = run_variant(job, variant, first)
    finally:
        own_exit = _nodes.REFUSAL_EXIT_S if variant.get("expect_refusal") else 0.0
        result["node1"] = node.stop(own_exit)
        pid_file.unlink()
    return result


def run_variant(job: dict[str, Any], variant: dict[str, Any], first: bool) -> dict[str, Any]:
    handlers: dict[str, dict[str, float]] = {}
    if not job.get("step_timers") or job.get("multiprocessing"):
        return _run_variant(job, variant, first, handlers)
    with handler_timers(handlers):  # before the plugin registers: it binds the handlers
        return _run_variant(job, variant, first, handlers)


def _run_variant(
    job: dict[str, Any], variant: dict[str, Any], first: bool, handlers: dict[str, Any]
) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from kvplan.integrations.vllm import plugin

    multiprocess = bool(job.get("multiprocessing"))
    env, engine = variant_setup(job, variant)
    _set_env(env)

    def activate() -> None:
        # the first engine: vLLM's entry-point loader activates (or not) the plugin
        if not first:
            plugin.unregister()
            plugin.register()

    if variant.get("scramble_from"):
        scramble_store(variant["scramble_from"], engine)
    if not multiprocess:
        install_break(variant.get("break"), target_layer_count(job["model"]))
        install_reported_map_failure(bool(variant.get("reported_map_failure")))
    if variant.get("expect_refusal"):  # the plugin may refuse as it registers, or vLLM later

        def start() -> Any:
            activate()
            return LLM(model=job["model"], **engine)

        return _refusal(variant, start)
    activate()
    started = time.perf_counter()
    llm = LLM(model=job["model"], **engine)
    startup_s = time.perf_counter() - started
    if variant.get("rebind_after_start"):
        return _rebound(variant, llm, job)
    redrawn = sum(_REDRAWN)  # the target's parameters, and a draft model's
    _REDRAWN.clear()
    max_tokens = int(variant.get("max_tokens") or job["max_tokens"])
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    lora = lora_request(variant.get("lora"))
    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in job["prompts"]]
    tokens, cached = [], []
    started = time.perf_counter()
    preempted = (metric(llm, "vllm:num_preemptions") or 0) if multiprocess else _PREEMPTIONS[0]
    counted = counters(llm, engine)
    rounds = []
    timers: dict[str, dict[str, float]] = {}
    timed = bool(job.get("step_timers")) and not multiprocess
    for figures in handlers.values():  # the generate's only, not the start-up's
        figures.update(seconds=0.0, calls=0)
    for group in job.get("batches", [list(range(len(prompts)))]):  # prefix-sharing order
        batch = [prompts[i] for i in group]
        if multiprocess:
            outputs = generate_pinned(llm, batch, params)
        else:
            with step_timers(timers) if timed else nullcontext():
                outputs = llm.generate(batch, params, use_tqdm=False, lora_request=lora)
        for i, out in zip(group, outputs, strict=True):
            tokens.append((i, list(out.outputs[0].token_ids)))
            cached.append((i, int(out.num_cached_tokens or 0)))
        rounds.append(
            {
                "tokens": [list(o.outputs[0].token_ids) for o in outputs],
                "cached": [int(o.num_cached_tokens or 0) for o in outputs],
            }
        )
    generate_s = time.perf_counter() - started
    handled = {key: dict(f) for key, f in handlers.items() if f["calls"]}
    if variant.get("idle_step"):
        idle_step(llm)
        time.sleep(1.5)  # the stats file follows within half a second
    stats_files = dumped_stats(env)
    result = {
        "name": variant["name"],
        "tokens": [t for _, t in sorted(tokens)],
        "active": plugin.is_active(),
        "stats": plugin.stats(),
        "activated_by": "vllm-entry-point" if first else "driver",
        "redrawn_parameters": redrawn,
        "cached_tokens": [c for _, c in sorted(cached)],
        "startup_s": startup_s,
        "generate_s": generate_s,
        "rounds": rounds,
        "preemptions": (metric(llm, "vllm:num_preemptions") or 0) - preempted
        if multiprocess
        else _PREEMPTIONS[0] - preempted,
        "stats_files": stats_files,
        "step_timers": timers,
        "handler_timers": handled,
        "multiprocessing": multiprocess,
        "driver_pid": os.getpid(),
        "counters": {k: v - counted.get(k, 0.0) for k, v in counters(llm, engine).items()},
    }
    if multiprocess or not _collected_llm_shuts_down():
        shut_down(llm)
    del llm
    gc.collect()
    install_break(None)
    install_reported_map_failure(False)
    result["closed_stats_files"] = dumped_stats(env)
    return result


def error_chain(exc: BaseException) -> str:
    """Every diagnostic (or message) of ``exc`` and its causes, one per line."""
    from kvplan.schemas.errors import KVPlanError

    texts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KVPlanError):
            texts.extend(d.render() for d in seen.diagnostics)
        else:
            texts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return "\n".join(texts)


def _rebound(variant: dict[str, Any], llm: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Swap two attention layers' caches after start-up, then try one step."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from kvplan.integrations.vllm import plugin

    context = llm.llm_engine.vllm_config.compilation_config.static_forward_context
    layers = [v for _, v in sorted(context.items()) if getattr(v, "kv_cache", None) is not None]
    first, last = layers[0], layers[-1]
    first.kv_cache, last.kv_cache = last.kv_cache, first.kv_cache
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    result: dict[str, Any] = {"name": variant["name"], "step_refused": False, "error": ""}
    try:
        llm.generate([TokensPrompt(prompt_token_ids=list(job["prompts"][0]))], params,
                     use_tqdm=False)  # fmt: skip
    except Exception as exc:  # the refusal under test
        result.update(step_refused=True, error=error_chain(exc))
    result.update(active=plugin.is_active(), stats=plugin.stats())
    del llm
    gc.collect()
    return result


def _refusal(variant: dict[str, Any], start: Any) -> dict[str, Any]:
    """Start an engine that should refuse; record every diagnostic of the error chain."""
    from kvplan.integrations.vllm import plugin

    result: dict[str, Any] = {"name": variant["name"], "refused": False, "error": ""}
    try:
        llm = start()
    except Exception as exc:  # the refusal under test
        result.update(refused=True, error=error_chain(exc))
    else:
        del llm
    result.update(active=plugin.is_active(), stats=plugin.stats())
    gc.collect()
    return result


def main(argv: list[str]) -> int:
    job_path, result_path = argv[1], argv[2]
    with open(job_path) as handle:
        job = json.load(handle)
    if not job.get("multiprocessing"):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    install_redraw(int(job.get("seed", 0)), float(job.get("gain", 1.0)))
    count_preemptions()
    results = []
    for index, variant in enumerate(job["variants"]):
        print(f"driver: variant {variant['name']}", file=sys.stderr, flush=True)
        results.append(run_on_nodes(job, variant, first=index == 0))
        with open(result_path, "w") as handle:  # partial results survive a later crash
            json.dump({"variants": results}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
