"""An independent model of kvcached's view construction, with torch ops on the meta device.

Written from the algorithm of kvcached's ``alloc_kv_cache`` / ``build_kv_views`` /
``_reshape_mamba_{non_,}contiguous`` (snapshot e8e6406, as described in
``kvcached-binding-and-vmm.md``): raw pools are real (meta) tensors; views come from torch's
own ``view``/``permute``/``as_strided``/indexing, not from kvplan's stride formulas. Used to
check kvplan's ``kvcached`` strategy and the reference values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PAGE = 2 << 20


@dataclass(frozen=True)
class Geometry:
    """One view: element shape, element stride, byte offset from its raw pool's start."""

    shape: list[int]
    stride: list[int]
    offset_bytes: int


def _geom(t: torch.Tensor, base_offset_elems: int = 0) -> Geometry:
    return Geometry(
        list(t.shape),
        list(t.stride()),
        int(t.storage_offset() - base_offset_elems) * t.element_size(),
    )


@dataclass
class Alloc:
    views: list[Geometry]
    raw: list[torch.Tensor]
    num_blocks: int
    kv_bytes: int
    page_size_bytes: int


def alloc(
    shape: tuple[int, ...],
    block_size: int,
    dtype: torch.dtype,
    num_layers: int,
    attention_type: str,
    gpu_mem: int,
    contiguous: bool,
    kernel_block_size: int | None = None,
) -> Alloc:
    """kvcached's ``alloc_kv_cache`` on a pretend device of ``gpu_mem`` bytes."""
    mla = attention_type == "MLA"
    unified = attention_type == "HYBRID_LINEAR"
    nkv = 1 if mla else 2
    kbs = kernel_block_size or block_size
    ratio = block_size // kbs
    if mla:
        bdim = 0
        order = list(range(len(shape)))
        bm = math.prod(shape[1:]) * dtype.itemsize
    else:
        bdim = 1 if shape[0] == nkv else 0
        order = [1, 0, 2, 3, 4] if bdim == 1 else [0, 1, 2, 3, 4]
        bm = math.prod(shape[2:]) * dtype.itemsize
    per = gpu_mem // num_layers // nkv
    align = 2 * PAGE if mla else PAGE
    kv_bytes = per // align * align
    blocks = kv_bytes // bm
    ftensor = kv_bytes * nkv
    if contiguous:
        raw = [torch.empty(ftensor * num_layers, dtype=torch.uint8, device="meta")]
    else:
        raw = [torch.empty(ftensor, dtype=torch.uint8, device="meta") for _ in range(num_layers)]
    actual = list(shape)
    actual[bdim] = blocks
    page = math.prod(actual[:bdim] + actual[bdim + 1 :]) * dtype.itemsize
    kernel = list(actual)
    if ratio > 1:
        kernel[bdim] = blocks * ratio
        kernel[1 if mla else 2] = kbs
    views: list[Geometry] = []
    if not contiguous:
        if mla:
            n = math.prod(kernel)
            views = [_geom(t.view(dtype)[:n].view(kernel)) for t in raw]
        else:
            hidden = kernel[2] * kernel[3] * kernel[4]
            inner = [kernel[3] * kernel[4], kernel[4], 1]
            if unified:
                kv_step, block_step = hidden, 2 * hidden
            else:
                kv_step, block_step = kv_bytes // dtype.itemsize, hidden
            stride = [kv_step, block_step] if bdim == 1 else [block_step, kv_step]
            views = [_geom(torch.as_strided(t.view(dtype), kernel, stride + inner)) for t in raw]
    elif unified:
        hidden = kernel[2] * kernel[3] * kernel[4]
        inner = [kernel[3] * kernel[4], kernel[4], 1]
        step = num_layers * 2 * hidden
        stride = [hidden, step] if bdim == 1 else [step, hidden]
        flat = raw[0].view(dtype)
        views = [
            _geom(torch.as_strided(flat, kernel, stride + inner, storage_offset=i * 2 * hidden))
            for i in range(num_layers)
        ]
    else:
        per_layer = actual[:bdim] + actual[bdim + 1 :]
        full = [blocks, num_layers, *per_layer]
        whole = raw[0].view(dtype)[: math.prod(full)].view(full)
        views = [_geom(whole[:, i].permute(*order)) for i in range(num_layers)]
    return Alloc(views, raw, blocks, kv_bytes, page)


def hetero_views(
    a: Alloc,
    shape: tuple[int, ...],
    block_size: int,
    dtype: torch.dtype,
    num_layers: int,
    contiguous: bool,
    kernel_block_size: int | None = None,
) -> list[Geometry]:
    """kvcached's ``build_kv_views`` for one more (MHA) group over ``a``'s pools."""
    kbs = kernel_block_size or block_size
    ratio = block_size // kbs
    bdim = 1 if shape[0] == 2 else 0
    actual = list(shape)
    actual[bdim] = a.num_blocks
    kernel = list(actual)
    if ratio > 1:
        kernel[bdim] = a.num_blocks * ratio
        kernel[2] = kbs
    if not contiguous:
        hidden = kernel[2] * kernel[3] * kernel[4]
        inner = [kernel[3] * kernel[4], kernel[4], 1]
        stride = [a.kv_bytes // dtype.itemsize, hidden]
        stride = stride if bdim == 1 else stride[::-1]
        return [_geom(torch.as_strided(t.view(dtype), kernel, stride + inner)) for t in a.raw]
    if ratio > 1:
        raise NotImplementedError("kvcached: heterogeneous contiguous with kernel splits")
    order = [1, 0, 2, 3, 4] if bdim == 1 else [0, 1, 2, 3, 4]
    full = [a.num_blocks, num_layers, *(actual[:bdim] + actual[bdim + 1 :])]
    whole = a.raw[0].view(dtype)[: math.prod(full)].view(full)
    return [_geom(whole[:, i].permute(*order)) for i in range(num_layers)]


def mamba_views(
    a: Alloc,
    shapes: list[list[int]],
    dtypes: list[torch.dtype],
    spec_page: int,
    num_layers: int,
    contiguous: bool,
) -> list[list[Geometry]]:
    """kvcached's Mamba state views per pool (HYBRID_LINEAR raw info)."""
    out: list[list[Geometry]] = []
    for i in range(num_layers):
        if contiguous:
            base = a.raw[0].view(torch.int8)
            blocks, step, start = (
                a.num_blocks,
                num_layers * a.page_size_bytes,
                i * a.page_size_bytes,
            )
        else:
            base = a.raw[i].view(torch.int8)[: a.num_blocks * a.page_size_bytes]
            blocks, step, start = base.numel() // spec_page, spec_page, 0
        states, inner = [], 0
        for shape, dtype in zip(shapes, dtypes, strict=True):
            isz = dtype.itemsize
            dense = torch.empty((blocks, *shape), device="meta").stride()
            t = torch.as_strided(
                base.view(dtype),
                (blocks, *shape),
                (step // isz, *dense[1:]),
                storage_offset=(start + inner) // isz,
            )
            states.append(_geom(t))
            inner += dense[0] * isz
        out.append(states)
    return out
