"""Is the function kvplan is about to wrap the release's own?

Another vLLM general plugin may have wrapped the same function first (a KV connector, an
offloading layer, a second memory manager). kvplan's handler replaces what it wraps and never
calls it, so wrapping such a function would silently drop the other plugin's code. A function
is the release's own when every layer of it — following ``__wrapped__`` from the outside in —
is code from vLLM's package, or a decorator of torch's (``torch.inference_mode()`` wraps some
of vLLM's worker methods), down to a function of vLLM's whose code has the expected name.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

MAX_LAYERS = 16
"""``__wrapped__`` layers followed at the most."""


@dataclass(frozen=True)
class Foreign:
    """The first layer of a target that is not the release's own."""

    module: str
    """The module its code comes from (or its file, when no loaded module has that file)."""
    name: str
    """Its qualified name (``co_qualname``), or what kind of object it is."""


def _root(package: str) -> str | None:
    module = sys.modules.get(package)
    file = getattr(module, "__file__", None)
    return os.path.dirname(os.path.realpath(file)) + os.sep if file else None


def _module_of(filename: str) -> str:
    real = os.path.realpath(filename)
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and os.path.realpath(file) == real:
            return name
    return filename


def foreign_layer(value: Any, attr: str) -> Foreign | None:
    """The first layer of ``value`` (a target's function, kvplan's own wrappers already
    removed) that is not vLLM's or a torch decorator, or ``None`` when it is the release's."""
    vllm_root, torch_root = _root("vllm"), _root("torch")
    layer = value
    for _ in range(MAX_LAYERS):
        if isinstance(layer, staticmethod | classmethod):
            layer = layer.__func__
        code = getattr(layer, "__code__", None)
        if code is None and type(layer).__module__ == "functools" and hasattr(layer, "__wrapped__"):
            layer = layer.__wrapped__  # functools.cache and friends: C objects, no code
            continue
        if code is None:
            kind = type(layer).__name__
            return Foreign(getattr(type(layer), "__module__", "?"), f"a {kind} object")
        filename = os.path.realpath(code.co_filename)
        inner = getattr(layer, "__wrapped__", None)
        if vllm_root is not None and filename.startswith(vllm_root):
            if inner is None:
                if code.co_name == attr:
                    return None
                return Foreign(_module_of(filename), code.co_qualname)
        elif not (torch_root is not None and filename.startswith(torch_root) and inner):
            return Foreign(_module_of(filename), code.co_qualname)
        if inner is None:
            return Foreign(_module_of(filename), code.co_qualname)
        layer = inner
    return Foreign("?", f"more than {MAX_LAYERS} wrapper layers")
