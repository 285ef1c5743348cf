"""The handlers of the adapters' pipeline targets: what each wrapper reads from vLLM's
arguments before it drives the :class:`~kvplan.integrations.vllm.pipeline.Runtime`.

The version adapters name these handlers (``Target.handler``); :data:`HANDLERS` maps the names
to the functions. A mode adds its own (elastic serving's live in its room).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kvplan.integrations.vllm.pipeline import refusals
from kvplan.integrations.vllm.pipeline._runtime import current_vllm_config
from kvplan.integrations.vllm.versions import V1
from kvplan.schemas.specs import KVCacheSpecKind

if TYPE_CHECKING:
    from kvplan.integrations.vllm.pipeline._modes import Handler
    from kvplan.integrations.vllm.pipeline._runtime import Call, CallContext, Runtime

EXTENSIBLE_LOG = logging.getLogger("vllm.kvplan")
"""Where the start-up line about vLLM's extensible KV cache goes (vLLM's own logger tree)."""


def _sharing_map(
    config: Any, ctx: CallContext | None, site: str, has_views: Callable[[Any], bool]
) -> dict[str, str]:
    """The runner's sharing map; else derived from the config and the forward context
    (``allocate_kv_cache`` called without a runner)."""
    if ctx is not None and ctx.shared is not None:
        return dict(ctx.shared)
    backed = {name for tensor in config.kv_cache_tensors for name in tensor.layers}
    unbacked = [
        name
        for group in config.kv_cache_groups
        if KVCacheSpecKind.of(type(group.kv_cache_spec).__name__)
        is not KVCacheSpecKind.ENCODER_ONLY_ATTENTION
        and has_views(group.kv_cache_spec)
        for name in group.layer_names
        if name not in backed
    ]
    if not unbacked:
        return {}
    vllm_config = (ctx.vllm_config if ctx else None) or current_vllm_config()
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
        raise refusals.unknown_sharers(site, missing)
    return shared


def allocate_with(has_views: Callable[[Any], bool]) -> Handler:
    """The ``allocate_kv_cache`` handler of a release where ``has_views(spec)`` tells whether
    vLLM views a spec's layers (layers without views need no sharing map entry)."""

    def allocate(runtime: Runtime, call: Call) -> Any:
        """``allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes)``."""
        args = call.arguments
        return runtime.allocate(
            call,
            config=args["kv_cache_config"],
            device=args["device"],
            layout=args["layout"],
            kernel_block_sizes=args["kernel_block_sizes"],
            derive_sharing=lambda config, ctx: _sharing_map(config, ctx, call.site, has_views),
        )

    return allocate


allocate = allocate_with(lambda spec: bool(spec.has_layer_views))
allocate_all_views = allocate_with(lambda spec: True)
"""A release whose specs have no ``has_layer_views`` (0.29): every layer is viewed."""


def refuse_hisparse(runtime: Runtime, call: Call) -> Any:
    """HiSparse allocates a host pool kvplan does not plan: refuse."""
    raise runtime.refuse(refusals.hisparse(call.site, runtime.vllm_version))


def runner_entry(runtime: Runtime, call: Call) -> Any:
    """``GPUModelRunner.initialize_kv_cache``: the owner and ``is_profiling``."""
    runner = call.arguments["self"]
    return runtime.runner_entry(
        call,
        owner=runner,
        profiling=bool(call.arguments["is_profiling"]),
        vllm_config=getattr(runner, "vllm_config", None),
    )


def v1_tensors(runtime: Runtime, call: Call) -> Any:
    """V1 ``initialize_kv_cache_tensors``: the sharing map is ``runner.shared_kv_cache_layers``."""
    runner = call.arguments["self"]
    shared = getattr(runner, "shared_kv_cache_layers", None)
    if not isinstance(shared, Mapping):
        raise refusals.no_sharing_map(call.site, V1, runtime.vllm_version)
    return runtime.run_checked(
        call,
        owner=runner,
        shared=dict(shared),
        vllm_config=getattr(runner, "vllm_config", None),
        allocation_context=call.arguments["kv_cache_allocation_context"],
    )


def v2_init_reading(sharing_map: str) -> Handler:
    """The handler of a V2 ``init_kv_cache`` whose sharing map is the ``READ`` target named
    ``sharing_map`` (its full name: 0.34 defines one in the GPU and one in the CPU build)."""

    def v2_init(runtime: Runtime, call: Call) -> Any:
        """V2 ``init_kv_cache``: the sharing map is ``get_shared_kv_cache_layers(vllm_config)``."""
        vllm_config = call.arguments["vllm_config"]
        attention = getattr(vllm_config, "attention_config", None)
        if getattr(attention, "hisparse_config", None) is not None:
            raise runtime.refuse(refusals.hisparse(call.site, runtime.vllm_version))
        if call.arguments.get("allocate") is not None:
            raise runtime.refuse(
                refusals.extensible_in_use(
                    call.site, "init_kv_cache was given an allocator", runtime.vllm_version
                )
            )
        shared = runtime.read(sharing_map)(vllm_config)
        return runtime.run_checked(
            call,
            shared=dict(shared),
            vllm_config=vllm_config,
            allocation_context=call.arguments["kv_cache_allocation_context"],
        )

    return v2_init


v2_init = v2_init_reading("vllm.v1.worker.gpu.attn_utils.get_shared_kv_cache_layers")


def allocate_without_allocator(runtime: Runtime, call: Call) -> Any:
    """0.34's ``allocate_kv_cache(..., allocate)``: kvplan binds the backing, so a call that
    brings its own allocator (vLLM's extensible KV cache) is refused, never served."""
    if call.arguments.get("allocate") is not None:
        raise runtime.refuse(
            refusals.extensible_in_use(
                call.site, "allocate_kv_cache was given an allocator", runtime.vllm_version
            )
        )
    return allocate(runtime, call)


def runner_entry_not_extensible(runtime: Runtime, call: Call) -> Any:
    """0.34's ``GPUModelRunner.initialize_kv_cache(..., extensible)``: refused when vLLM's
    extensible KV cache would own the memory; else as :func:`runner_entry`."""
    if call.arguments.get("extensible"):
        raise runtime.refuse(
            refusals.extensible_in_use(
                call.site, "initialize_kv_cache(extensible=True)", runtime.vllm_version
            )
        )
    return runner_entry(runtime, call)


def extensible_kv_cache(runtime: Runtime, call: Call) -> Any:
    """0.34's ``VllmConfig._resolve_extensible_kv_cache``: where the setting is left at its
    default, kvplan turns vLLM's extensible KV cache off and says so; asked for, ``KVP508``."""
    config = call.argument("self")
    cache_config = getattr(config, "cache_config", None)
    if cache_config is not None and not getattr(
        cache_config, "_extensible_kv_cache_resolved", False
    ):
        requested = getattr(cache_config, "enable_extensible_kv_cache", None)
        if requested:
            raise runtime.refuse(
                refusals.extensible_requested(runtime.mode.name, runtime.vllm_version)
            )
        if requested is None:
            cache_config.enable_extensible_kv_cache = False
            EXTENSIBLE_LOG.info(
                "kvplan: vLLM %s's extensible KV cache is off: kvplan binds the KV cache's "
                "memory (KVPLAN_MODE=%s); --no-enable-extensible-kv-cache says the same "
                "without this line",
                runtime.vllm_version,
                runtime.mode.name,
            )
    return call.run()


def step(runtime: Runtime, call: Call) -> Any:
    """``Worker.execute_model``: the caches vLLM holds are still kvplan's; the mode acts
    (elastic: unmap, then map, the step's blocks); then vLLM runs the step."""
    runtime.check_step(getattr(call.argument("self"), "model_runner", None))
    runtime.mode.before_step(runtime, call)
    return runtime.mode.after_step(runtime, call, call.run())


HANDLERS: Mapping[str, Handler] = {
    "allocate": allocate,
    "allocate/all-views": allocate_all_views,
    "refuse-hisparse": refuse_hisparse,
    "runner-entry": runner_entry,
    "v1-tensors": v1_tensors,
    "v2-init": v2_init,
    "v2-init/cpu": v2_init_reading("vllm.v1.worker.cpu.attn_utils.get_shared_kv_cache_layers"),
    "allocate/no-allocator": allocate_without_allocator,
    "runner-entry/not-extensible": runner_entry_not_extensible,
    "extensible-kv-cache": extensible_kv_cache,
    "step": step,
}
"""The pipeline's handlers by the names the version adapters give them."""
