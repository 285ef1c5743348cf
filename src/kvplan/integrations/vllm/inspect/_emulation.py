"""Make vLLM's CPU platform choose what the CUDA platform would, while kvplan asks it to plan.

kvplan runs vLLM on the CPU (``VLLM_TARGET_DEVICE=cpu``) but plans for NVIDIA GPUs. Three
class methods of the CPU platform decide what ends up in the KV-cache specs, and each is
swapped for the CUDA behaviour inside :func:`cuda_platform`:

* ``get_attn_backend_cls``: a backend vLLM or the user (``--attention-backend``) selected is
  honoured; otherwise FlashAttention for unquantized KV, TritonAttention for quantized KV
  and attention sinks (FlashAttention's checks for those need CUDA kernels; the spec, kernel
  block sizes and layouts are the same), and TritonMLA for MLA (FlashMLA's kernels cannot
  be loaded without CUDA);
* ``check_and_update_config``: the CPU one forces MLA ``block_size=16``, a float32 SSM
  state and the ``SD`` conv-state layout; the CUDA one changes none of these;
* ``update_block_size_for_backend``: the CUDA platform uses the base ``Platform`` rule.

Layers that hold no KV cache are built too (the model is vLLM's, whole), and some of them ask
the platform which kernels exist. Those questions are answered as CUDA would, only where the
CPU platform refuses, and only for kernels that never touch the KV cache:

* MoE layers (``FusedMoEConfig``): a non-gated activation (``relu2``, Nemotron-3) is refused
  off CUDA/ROCm/XPU; the check runs with ``is_cuda_alike()`` true;
* the unquantized MoE kernel: when no CPU backend supports the layer, the Triton experts
  (a backend CUDA offers for every unquantized MoE) are chosen. Expert weights have the
  same shapes whichever backend runs them.

One engine setting is decided by the platform too: vLLM 0.34's extensible KV cache (on by
default on CUDA and ROCm, off elsewhere). ``VllmConfig._resolve_extensible_kv_cache`` runs with
``is_cuda_alike()`` true, so ``kvplan inspect`` shows the binding vLLM makes on a GPU.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

FLASH_ATTN = "FLASH_ATTN"
TRITON_ATTN = "TRITON_ATTN"
TRITON_MLA = "TRITON_MLA"
UNQUANTIZED = ("auto", "float16", "bfloat16")


def default_backend_name(
    kv_cache_dtype: str | None, use_mla: bool, head_size: int, has_sink: bool = False
) -> str:
    """The ``AttentionBackendEnum`` name kvplan plans with when nothing else selects one."""
    if use_mla:
        return TRITON_MLA
    if has_sink or (kv_cache_dtype or "auto") not in UNQUANTIZED or head_size % 8:
        # FlashAttention's sink and quantized-KV paths check the installed kernels while the
        # layer is built, which fails without CUDA; TritonAttention gives the same spec,
        # kernel block sizes and layouts (and is what vLLM uses for per-token-head modes).
        return TRITON_ATTN
    return FLASH_ATTN


def _cuda_check_and_update_config(vllm_config: Any) -> None:
    """The KV-relevant part of ``CudaPlatform.check_and_update_config`` (none of it is)."""
    model_config = vllm_config.model_config
    scheduler_config = vllm_config.scheduler_config
    if (
        model_config is not None
        and model_config.is_mm_prefix_lm
        and scheduler_config.is_multimodal_model
        and not scheduler_config.disable_chunked_mm_input
    ):
        scheduler_config.disable_chunked_mm_input = True


def _as_cuda_alike(platform_cls: type, method: Any) -> Any:
    """``method`` run with the platform's ``is_cuda_alike()`` answering true. Marked as one of
    kvplan's own wrappers, so that the vLLM plugin, should it register inside the emulation
    (``KVPLAN_ENABLE=1`` beside ``kvplan inspect``: vLLM loads its plugins while it builds the
    config), wraps vLLM's function, not this one, and does not take it for another plugin's."""

    @functools.wraps(method)
    def as_cuda(self: Any) -> None:
        saved = platform_cls.__dict__.get("is_cuda_alike")
        platform_cls.is_cuda_alike = lambda _self: True  # type: ignore[attr-defined]
        try:
            method(self)
        finally:
            if saved is None:
                delattr(platform_cls, "is_cuda_alike")
            else:
                platform_cls.is_cuda_alike = saved  # type: ignore[attr-defined]

    setattr(as_cuda, "__kvplan_wrapper__", True)  # noqa: B010
    return as_cuda


def _moe_patches(platform_cls: type) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for the MoE layers' kernel questions, and for vLLM
    0.34's extensible KV cache."""
    from vllm.config import VllmConfig
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
    from vllm.model_executor.layers.fused_moe.oracle import unquantized as oracle

    # Only the kernel-support checks ask the platform there.
    post_init_as_cuda = _as_cuda_alike(platform_cls, FusedMoEConfig.__dict__["__post_init__"])
    select = method.select_unquantized_moe_backend

    def select_as_cuda(moe_config: Any) -> tuple[Any, Any]:
        try:
            return select(moe_config)
        except NotImplementedError:  # no CPU kernel for this layer
            backend = oracle.UnquantizedMoeBackend.TRITON
            return backend, oracle.backend_to_kernel_cls(backend)[0]

    patches = [
        (FusedMoEConfig, "__post_init__", post_init_as_cuda),
        (method, "select_unquantized_moe_backend", select_as_cuda),
    ]
    resolve = VllmConfig.__dict__.get("_resolve_extensible_kv_cache")  # vLLM 0.34 and later
    if resolve is not None:
        patches.append(
            (VllmConfig, "_resolve_extensible_kv_cache", _as_cuda_alike(platform_cls, resolve))
        )
    return patches


@contextmanager
def cuda_platform() -> Iterator[None]:
    """Within this block the current (CPU) platform answers as CUDA would for KV planning."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if current_platform.is_cuda():  # a real GPU answers for itself
        yield
        return
    platform_cls = type(current_platform)

    def get_attn_backend_cls(
        cls: type, selected_backend: Any, attn_selector_config: Any, *args: Any, **kwargs: Any
    ) -> str:
        chosen = selected_backend
        if chosen is None:
            name = default_backend_name(
                attn_selector_config.kv_cache_dtype,
                attn_selector_config.use_mla,
                attn_selector_config.head_size,
                attn_selector_config.has_sink,
            )
            chosen = AttentionBackendEnum[name]
        return str(chosen.get_path())

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        _cuda_check_and_update_config(vllm_config)

    def update_block_size_for_backend(cls: type, vllm_config: Any) -> None:
        Platform.update_block_size_for_backend.__func__(cls, vllm_config)  # type: ignore[attr-defined]

    patches = {
        "get_attn_backend_cls": classmethod(get_attn_backend_cls),
        "check_and_update_config": classmethod(check_and_update_config),
        "update_block_size_for_backend": classmethod(update_block_size_for_backend),
    }
    saved = {name: platform_cls.__dict__.get(name) for name in patches}
    others = _moe_patches(platform_cls)
    saved_others = [(owner, name, owner.__dict__[name]) for owner, name, _ in others]
    conv_layout = os.environ.get("VLLM_SSM_CONV_STATE_LAYOUT")
    for name, value in patches.items():
        setattr(platform_cls, name, value)
    for owner, name, value in others:
        setattr(owner, name, value)
    os.environ.pop("VLLM_SSM_CONV_STATE_LAYOUT", None)
    selector._cached_get_attn_backend.cache_clear()  # selections are cached per process
    try:
        yield
    finally:
        for (owner, name, value), (_, _, ours) in zip(saved_others, others, strict=True):
            if owner.__dict__.get(name) is ours:  # else the plugin wrapped it: its to restore
                setattr(owner, name, value)
        selector._cached_get_attn_backend.cache_clear()
        for name, value in saved.items():
            if value is None:
                delattr(platform_cls, name)
            else:
                setattr(platform_cls, name, value)
        if conv_layout is None:
            os.environ.pop("VLLM_SSM_CONV_STATE_LAYOUT", None)
        else:
            os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = conv_layout
