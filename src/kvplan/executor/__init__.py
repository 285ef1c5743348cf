"""The executor: apply a :class:`~kvplan.schemas.plan.BindingPlan` to memory, verify tensors.

``apply(plan, backend=..., mode=...)`` returns a :class:`BoundKVCache`; ``verify(plan,
tensors)`` proves a binding. Backends (``meta``, ``torch``, ``host-vmm``, ``cuda-vmm``)
live in :mod:`kvplan.executor.backends`, whose registry also says what each can do
(``backend_info``) and which are registered (``backend_names``). Importing this package
imports neither torch nor cuda-python; they load when a backend is created.
"""

from kvplan.executor._apply import EAGER_CHUNK_BYTES, apply
from kvplan.executor._bound import BoundKVCache
from kvplan.executor._verify import verify
from kvplan.executor.backends import (
    BACKENDS,
    Backend,
    BackendCallError,
    BackendInfo,
    backend_class,
    backend_info,
    backend_names,
    create_backend,
    register_backend,
)

__all__ = [
    "BACKENDS",
    "EAGER_CHUNK_BYTES",
    "Backend",
    "BackendCallError",
    "BackendInfo",
    "BoundKVCache",
    "apply",
    "backend_class",
    "backend_info",
    "backend_names",
    "create_backend",
    "register_backend",
    "verify",
]
