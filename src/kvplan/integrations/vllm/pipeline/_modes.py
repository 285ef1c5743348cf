"""How a binding mode plugs into the pipeline: decided once, when the plugin starts.

A mode is one object the pipeline asks, never a string it compares: which of the adapter's
targets to wrap, whether the release can run it, the handlers it adds, how a plan is bound
and what happens once the binding is verified. The pipeline's own mode is :class:`EagerMode`
(all memory mapped at bind); elastic serving brings its mode from its own room
(``kvplan.integrations.vllm.elastic.ElasticMode``), and the plugin hands the chosen one to the
:class:`~kvplan.integrations.vllm.pipeline.Runtime`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kvplan.executor import BoundKVCache
    from kvplan.integrations.vllm.pipeline._runtime import Call, Runtime
    from kvplan.integrations.vllm.versions import Target, VersionAdapter
    from kvplan.schemas.errors import Diagnostic
    from kvplan.schemas.plan import BindingPlan

Handler = Callable[["Runtime", "Call"], Any]
"""What runs when vLLM calls a wrapped target: ``handler(runtime, call)``."""


class Mode(Protocol):
    """A binding mode (``KVPLAN_MODE``)."""

    name: str

    def wraps(self, target: Target) -> bool:
        """Whether the plugin wraps ``target`` in this mode."""
        ...

    def check(self, adapter: VersionAdapter, version: str) -> list[Diagnostic]:
        """Why this mode cannot run on ``version`` (empty: it can)."""
        ...

    def handlers(self) -> Mapping[str, Handler]:
        """The handlers this mode defines, by the names the adapters give them."""
        ...

    def bind(self, plan: BindingPlan, *, backend: str, device: str) -> BoundKVCache:
        """Bind ``plan``: the cache the pipeline verifies next."""
        ...

    def attach(self, cache: BoundKVCache, owner: Any, label: str) -> Callable[[], None] | None:
        """The verified ``cache`` of runner ``owner`` goes live; returns what to run after it
        closes (or ``None``)."""
        ...

    def before_step(self, runtime: Runtime, call: Call) -> None:
        """A worker is about to run a step (``Worker.execute_model``, after kvplan checked the
        caches vLLM holds)."""
        ...

    def after_step(self, runtime: Runtime, call: Call, result: Any) -> Any:
        """What the worker's ``Worker.execute_model`` returns, given vLLM's ``result``."""
        ...

    def describe(self) -> dict[str, Any]:
        """This mode's own settings, as ``kvplan doctor --json`` shows them."""
        ...


class EagerMode:
    """Every page mapped at bind, in the backend's large eager chunks."""

    name = "eager"

    def wraps(self, target: Target) -> bool:
        return not target.elastic_only

    def check(self, adapter: VersionAdapter, version: str) -> list[Diagnostic]:
        return []

    def handlers(self) -> Mapping[str, Handler]:
        return {}

    def bind(self, plan: BindingPlan, *, backend: str, device: str) -> BoundKVCache:
        from kvplan.executor import apply

        return apply(plan, backend=backend, device=device, mode="eager")

    def attach(self, cache: BoundKVCache, owner: Any, label: str) -> Callable[[], None] | None:
        return None

    def before_step(self, runtime: Runtime, call: Call) -> None:
        return None

    def after_step(self, runtime: Runtime, call: Call, result: Any) -> Any:
        return result

    def describe(self) -> dict[str, Any]:
        return {}
