"""Are the KV caches vLLM holds still the ones kvplan bound and verified?

kvplan verifies its binding and vLLM's dict when a runner allocates (``_runtime``). Something
may still rebind a layer afterwards — another plugin, a connector — and the model would then
read and write other memory than the plan says. So once vLLM's runner has finished
``initialize_kv_cache``, kvplan notes what every attention layer of the forward context and
the runner's ``kv_caches`` list hold (data pointer, shape, stride of each tensor) and checks
that each layer of the plan starts at the very address kvplan bound for it (an alias: its
target's). At the runner's first step, and then at most once every
:data:`WATCH_PERIOD_SECONDS`, it compares again: any change is ``KVP507``, a refusal under
``KVPLAN_STRICT=1`` (the step does not run), else one warning. The check reads a few attributes
per layer; between checks a step pays one clock read.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvplan.schemas.errors import Code, KVPlanError, error

if TYPE_CHECKING:
    from kvplan.executor import BoundKVCache

logger = logging.getLogger("vllm.kvplan")

WATCH_PERIOD_SECONDS = 1.0
"""After the first step, the caches are compared again at most this often."""
RUNNER_LIST = "<runner.kv_caches>"

Held = tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]
"""What one holder holds: ``(data_ptr, shape, stride)`` of each tensor, in order."""


def _tensors(obj: Any) -> Held:
    if hasattr(obj, "data_ptr") and hasattr(obj, "stride"):
        return ((int(obj.data_ptr()), tuple(obj.shape), tuple(obj.stride())),)
    if isinstance(obj, list | tuple):
        return tuple(entry for item in obj for entry in _tensors(item))
    return ()


def held_by(forward_context: Mapping[str, Any] | None, runner: Any) -> dict[str, Held]:
    """What the forward context's layers (``layer.kv_cache``) and the runner's ``kv_caches``
    list hold now."""
    out: dict[str, Held] = {}
    for name, layer in (forward_context or {}).items():
        found = _tensors(getattr(layer, "kv_cache", None))
        if found:
            out[name] = found
    caches = getattr(runner, "kv_caches", None)
    if isinstance(caches, list):
        out[RUNNER_LIST] = _tensors(caches)
    return out


def expected_addresses(cache: BoundKVCache) -> dict[str, int]:
    """Where each layer of ``cache``'s plan starts: its view, or its alias target's."""
    tensors = cache.tensors
    out = {name: int(t.data_ptr()) for name, t in tensors.items()}
    for alias in cache.plan.aliases:
        if alias.target in tensors:
            out[alias.layer] = int(tensors[alias.target].data_ptr())
    return out


def _ref(obj: Any) -> Any:
    """A weak reference to ``obj`` where it takes one (kvplan must not keep a runner alive:
    its caches close when it goes), else a function returning ``obj``."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


@dataclass
class Watch:
    """One runner's KV caches as kvplan last saw them (the runner and its config weakly)."""

    label: str
    runner_kind: str
    runner_ref: Any
    config_ref: Any
    """The runner's ``compilation_config`` (its ``static_forward_context`` is the layers)."""
    expected: dict[str, int]
    held: dict[str, Held] = field(default_factory=dict)
    next_check: float = 0.0
    """Monotonic time of the next comparison (0: the next step)."""
    warned: bool = False

    @property
    def runner(self) -> Any:
        return self.runner_ref()

    def now_held(self) -> dict[str, Held]:
        config = self.config_ref()
        forward = getattr(config, "static_forward_context", None)
        return held_by(forward, self.runner)

    def misplaced(self) -> list[str]:
        """Layers of the plan whose first held tensor does not start where kvplan bound it."""
        return [
            name
            for name, address in self.expected.items()
            if name in self.held and self.held[name][0][0] != address
        ]

    def changed(self, now_held: dict[str, Held]) -> list[str]:
        names = set(self.held) | set(now_held)
        return sorted(name for name in names if self.held.get(name) != now_held.get(name))


def start(
    label: str, runner_kind: str, runner: Any, vllm_config: Any, cache: BoundKVCache
) -> Watch:
    """Note what vLLM holds right after its runner finished binding."""
    config = getattr(vllm_config, "compilation_config", None)
    watch = Watch(label, runner_kind, _ref(runner), _ref(config), expected_addresses(cache))
    watch.held = watch.now_held()
    seen = sum(1 for name in watch.expected if name in watch.held)
    if not seen:
        logger.warning(
            "kvplan: %s %s runner: no layer of the plan is visible in vLLM's forward context, "
            "so the step check sees only the runner's kv_caches list",
            label, runner_kind,
        )  # fmt: skip
    return watch


def vllm_rebinds(runner: Any) -> bool:
    """Whether vLLM itself rebinds this runner's caches: 0.34's extensible KV cache
    (``runner.extensible_kv_cache``) rebuilds every layer's views after warm-up
    (``extend_kv_cache``). kvplan turns it off at start-up; set, something turned it on."""
    return getattr(runner, "extensible_kv_cache", None) is not None


def rebound(watch: Watch, layers: list[str], when: str) -> KVPlanError:
    shown = ", ".join(layers[:4]) + (f" (+{len(layers) - 4} more)" if len(layers) > 4 else "")
    held = (
        f"{when}, the KV caches vLLM's {watch.runner_kind} runner of {watch.label} holds "
        f"are not the ones kvplan bound and verified: {shown}."
    )
    if vllm_rebinds(watch.runner):
        why = (
            " vLLM's own extensible KV cache rebound them (extend_kv_cache after warm-up "
            "rebuilds every layer's views over memory it maps itself): it is on although "
            "kvplan turned it off at start-up."
        )
        fix = "start vLLM with --no-enable-extensible-kv-cache"
    else:
        why = (
            " Something other than vLLM rebound them after kvplan's check (another plugin "
            "or connector?); the model would read and write memory the plan does not give it."
        )
        fix = "find what rebinds vLLM's KV caches after allocation and run without it"
    return KVPlanError(
        error(
            Code.CACHE_REBOUND,
            f"{watch.label}.{layers[0] if layers else 'kv_caches'}",
            held + why,
            fix,
        )
    )


def check(watch: Watch, now: float) -> list[str]:
    """Compare what vLLM holds with what was noted; the layers that changed (empty: none).
    Schedules the next comparison."""
    watch.next_check = now + WATCH_PERIOD_SECONDS
    return watch.changed(watch.now_held())


def due(watch: Watch) -> float | None:
    """The time now if a comparison is due (one clock read), else ``None``."""
    now = time.monotonic()
    return now if now >= watch.next_check else None
