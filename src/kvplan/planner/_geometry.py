"""Byte geometry of one KVCacheTensor's per-layer views (vLLM 0.33 ``create_kv_cache_views``).

Everything here is integer arithmetic in bytes over the logical ``[L, B, H, N, C]`` axes.
Problems are returned as a :class:`~kvplan.schemas.errors.Diagnostic` at the caller's
location, never raised from an assert.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.planner._text import num, nums
from kvplan.schemas.errors import Code, Diagnostic, error
from kvplan.schemas.layout import DIM_B, DIM_L, KVCacheLayout
from kvplan.schemas.specs import KVCacheSpec

_SPLIT_HINT = (
    "use a layer-compact layout (e.g. LBNHC) with dense pages, or a kernel block size equal "
    "to the block size"
)


@dataclass(frozen=True)
class TensorGeometry:
    """Logical 5-D shape ``(L, B*ratio, H, N, C_bytes)`` and its byte strides."""

    shape: tuple[int, int, int, int, int]
    strides: tuple[int, int, int, int, int]
    ratio: int


def layer_shape_bytes(
    spec: KVCacheSpec, num_blocks: int, kernel_block_size: int | None
) -> tuple[int, ...]:
    """``(B * blocks_per_page, H, N, C_bytes)`` as ``compute_layer_kv_cache_shape_bytes``."""
    block = kernel_block_size if kernel_block_size is not None else spec.block_size
    return (
        num_blocks * (spec.block_size // block),
        spec.num_heads,
        spec.num_kernel_states(block),
        spec.state_content_size_bytes,
    )


def layout_strides(
    shape: tuple[int, ...],
    layout: KVCacheLayout,
    padded_page: int | None,
    fixed: tuple[int | None, ...],
    where: str = "",
) -> tuple[int, ...] | Diagnostic:
    """Byte strides in logical ``[L, B, H, N, C]`` order (``compute_layout_strides``).

    The innermost physical axis is dense; with a padded page, the page-grid axis (the inner
    of L and B) is rounded up to the padded page. ``fixed`` pins the L and B strides.
    """
    order = layout.stride_order
    grid_end = max(order.index(DIM_L), order.index(DIM_B)) + 1
    if padded_page is not None:
        grid = math.prod(shape[dim] for dim in order[:grid_end])
        if grid != shape[DIM_L] * shape[DIM_B]:
            return error(
                Code.PAGE_GRID_INVALID,
                where,
                f"padded pages need only L, B or singleton axes outside the page; layout "
                f"{layout.name} with shape {nums(shape)} puts another axis there",
                "use a layout whose L and B axes are outermost (LBNHC, LBHNC, BLNHC or BLHNC), "
                "or drop page_size_padded",
            )
    strides = [0] * 5
    current = 1
    for physical, dim in reversed(tuple(enumerate(order))):
        if padded_page is not None and physical == grid_end - 1:
            current = max(current, padded_page)
            if current % padded_page:
                return error(
                    Code.PAGE_GRID_INVALID,
                    where,
                    f"the page content ({num(current)} bytes) is larger than the padded page "
                    f"{num(padded_page)} and not a multiple of it",
                    f"raise page_size_padded to a multiple of {num(current)} or drop it",
                )
        strides[dim] = fixed[dim] or current
        current = strides[dim] * shape[dim]
    return tuple(strides)


def tensor_geometry(
    spec: KVCacheSpec,
    num_blocks: int,
    num_layers: int,
    layout: KVCacheLayout,
    layer_stride: int,
    block_stride: int,
    kernel_block_size: int | None,
    where: str = "",
) -> TensorGeometry | Diagnostic:
    """The 5-D geometry of a KVCacheTensor's views, or why vLLM would refuse it (at ``where``)."""
    if num_blocks <= 0:
        return error(
            Code.BAD_NUM_BLOCKS,
            where,
            f"the tensor's pool has {num(num_blocks)} blocks",
            "give num_blocks (and hisparse_host_num_blocks for host pools) a positive value",
        )
    if kernel_block_size is not None and kernel_block_size <= 0:
        return error(
            Code.KERNEL_BLOCK_MISMATCH,
            where,
            f"kernel block size {num(kernel_block_size)} is not positive",
            "give every group the positive kernel block size its attention backend uses "
            "(a divisor of its block_size)",
        )
    if kernel_block_size is not None and spec.block_size % kernel_block_size:
        return error(
            Code.KERNEL_BLOCK_MISMATCH,
            where,
            f"kernel block size {num(kernel_block_size)} does not divide the block size "
            f"{num(spec.block_size)}",
            f"use a divisor of {num(spec.block_size)}, e.g. {num(spec.block_size)}",
        )
    if kernel_block_size is not None and spec.num_kernel_states(kernel_block_size) <= 0:
        return error(
            Code.KERNEL_BLOCK_MISMATCH,
            where,
            f"a kernel block of {num(kernel_block_size)} tokens holds no state of "
            f"{spec.tokens_per_state_value} tokens",
            "use a kernel block size that is a multiple of tokens_per_state",
        )
    shape_bytes = layer_shape_bytes(spec, num_blocks, kernel_block_size)
    ratio = shape_bytes[0] // num_blocks
    padded = spec.padded_page_size_bytes
    if ratio > 1:
        dense_page = math.prod(layer_shape_bytes(spec, 1, None)[1:])
        if block_stride != dense_page:
            return error(
                Code.KERNEL_SPLIT_NOT_DENSE,
                where,
                f"layout {layout.name} does not store blocks as dense unpadded pages "
                f"(block stride {num(block_stride)} != page {num(dense_page)}), so a block "
                f"cannot be split into {num(ratio)} kernel blocks of {num(kernel_block_size or 0)} "
                "tokens",
                _SPLIT_HINT,
            )
        if block_stride % ratio:
            return error(
                Code.KERNEL_SPLIT_NOT_DENSE,
                where,
                f"block stride {num(block_stride)} does not divide into {num(ratio)} kernel blocks",
                _SPLIT_HINT,
            )
        block_stride //= ratio
    if (
        padded is not None
        and kernel_block_size is not None
        and kernel_block_size != spec.block_size
    ):
        return error(
            Code.KERNEL_SPLIT_NOT_DENSE,
            where,
            "padded KV pages do not support kernel block splitting",
            "drop page_size_padded, or use a kernel block size equal to the block size",
        )
    shape = (num_layers, *shape_bytes)
    fixed = (layer_stride, block_stride, None, None, None)
    strides = layout_strides(shape, layout, padded, fixed, where)
    if isinstance(strides, Diagnostic):
        return strides
    return TensorGeometry(shape=shape, strides=strides, ratio=ratio)  # type: ignore[arg-type]
