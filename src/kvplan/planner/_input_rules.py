"""Validation of an input document before planning: membership, sizes and aliases."""

from __future__ import annotations

from collections import Counter

from kvplan.planner._sharing import analyse
from kvplan.planner._text import names, num
from kvplan.schemas.errors import Code, Diagnostic, Findings, error
from kvplan.schemas.input import InputDocument
from kvplan.schemas.specs import (
    EncoderOnlyAttentionSpec,
    UniformTypeKVCacheSpecs,
    base_kind,
    layer_spec,
)


def _loc_tensor(i: int, field: str = "") -> str:
    return f"kv_cache_config.kv_cache_tensors[{i}]" + (f".{field}" if field else "")


_ONE_GROUP = (
    "group",
    Code.DUPLICATE_GROUP_LAYER,
    "a layer belongs to exactly one KV cache group, once",
    "remove the extra entry from layer_names",
)
_ONE_TENSOR = (
    "tensor",
    Code.LAYER_BOUND_TWICE,
    "a layer is placed by exactly one tensor, once",
    "remove the extra entry from the tensors' layers",
)


def _first_listing(
    lists: list[list[str]], rule: tuple[str, Code, str, str], out: Findings
) -> dict[str, int]:
    """Each name's first list in ``lists``; ``rule``'s code for every later listing of a name
    (``rule``: what a list is, the code, the rule broken, the fix)."""
    noun, code, broken, hint = rule
    first: dict[str, int] = {}
    for i, listed in enumerate(lists):
        for name in listed:
            if name not in first:
                first[name] = i
                continue
            where = (
                f"twice in {noun} {i}" if first[name] == i else f"in {noun}s {first[name]} and {i}"
            )
            out.append(error(code, name, f"layer is listed {where}; {broken}", hint))
    return first


def check_input(doc: InputDocument) -> Findings:
    """Every problem in ``doc`` that would make vLLM bind wrongly or refuse to start."""
    cfg = doc.kv_cache_config
    out = Findings()
    shared = doc.shared_kv_cache_layers

    group_of = _first_listing([g.layer_names for g in cfg.kv_cache_groups], _ONE_GROUP, out)
    for g, group in enumerate(cfg.kv_cache_groups):
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            for layer in group.layer_names:
                if layer not in spec.kv_cache_specs and layer not in shared:
                    out.append(
                        error(
                            Code.MISSING_LAYER_SPEC,
                            layer,
                            f"group {g} is UniformTypeKVCacheSpecs but has no spec for this layer",
                            "add the layer to kv_cache_spec.kv_cache_specs",
                        )
                    )
        for sub in (
            spec.kv_cache_specs.values() if isinstance(spec, UniformTypeKVCacheSpecs) else [spec]
        ):
            padded = getattr(sub, "page_size_padded", None)
            unpadded = sub.page_size_for(padded=False)
            if padded is not None and padded < unpadded:
                out.append(
                    error(
                        Code.PADDED_PAGE_TOO_SMALL,
                        f"kv_cache_config.kv_cache_groups[{g}].kv_cache_spec",
                        f"page_size_padded {num(padded)} is smaller than the unpadded page "
                        f"{num(unpadded)} bytes",
                        f"raise page_size_padded to at least {num(unpadded)} or drop it",
                    )
                )

    if cfg.kv_cache_tensors and cfg.kv_cache_layout is None:
        out.append(
            error(
                Code.LAYOUT_MISSING,
                "kv_cache_config.kv_cache_layout",
                "the document has KV cache tensors but no resolved layout",
                "set kv_cache_layout to the engine core's resolved layout, e.g. LBNHC",
            )
        )

    sizes = Counter(t.size for t in cfg.kv_cache_tensors)
    if len(sizes) > 1:
        common = sizes.most_common(1)[0][0]
        for i, t in enumerate(cfg.kv_cache_tensors):
            if t.size != common:
                out.append(
                    error(
                        Code.TENSOR_SIZE_MISMATCH,
                        _loc_tensor(i, "size"),
                        f"size {num(t.size)} differs from the other tensors' {num(common)}; "
                        "every tensor places its layers in the same backing allocation",
                        f"set size to {num(common)}",
                    )
                )

    tensor_of = _first_listing([t.layers for t in cfg.kv_cache_tensors], _ONE_TENSOR, out)
    for i, t in enumerate(cfg.kv_cache_tensors):
        if not t.layers:
            out.append(
                error(
                    Code.EMPTY_TENSOR,
                    _loc_tensor(i, "layers"),
                    "tensor has no layers",
                    "remove the tensor or list its layers",
                )
            )
            continue
        for layer in t.layers:
            if layer not in group_of:
                out.append(
                    error(
                        Code.LAYER_NOT_IN_GROUP,
                        layer,
                        f"tensor {i} places a layer that no KV cache group lists",
                        "add the layer to its group's layer_names",
                    )
                )

    for i, t in enumerate(cfg.kv_cache_tensors):
        if not t.layers or t.layers[0] not in group_of:
            continue
        group_spec = cfg.kv_cache_groups[group_of[t.layers[0]]].kv_cache_spec
        tensor_spec = layer_spec(group_spec, t.layers[0])
        if tensor_spec is None or not tensor_spec.has_layer_views:
            continue
        page = tensor_spec.page_size_bytes
        if page <= 0:
            out.append(
                error(
                    Code.SCHEMA,
                    _loc_tensor(i),
                    f"the spec of {t.layers[0]} has an empty page ({num(page)} bytes)",
                    "check num_kv_heads, head_size, block_size and tokens_per_state",
                )
            )
            continue
        # Whole blocks: vLLM sizes a tensor as blocks x block stride. The stride is the page
        # when a layer's blocks are contiguous; block-outermost layouts interleave the layers
        # of a tensor inside each block, so there it is the sum of their pages (which need
        # not be a multiple of any one page: gemma-4-26B-A4B in BLHNC).
        unit = t.block_stride if t.block_stride > page else page
        # vLLM 0.34's extensible KV cache pads every layer's segment to the memory granule
        # (``pad_kv_cache_segments``): a layer stride past its blocks, and a size that is a
        # sum of padded segments, not of blocks. The views stay inside (checked on the plan).
        padded = t.block_stride > 0 and t.layer_stride > cfg.num_blocks_of(t) * t.block_stride
        what = (
            f"the {num(unit)}-byte block stride"
            if unit != page
            else f"the {num(page)}-byte page of {t.layers[0]}"
        )
        if t.size % unit and not padded:
            below = t.size // unit * unit
            if below:
                fix = f"use a multiple of {num(unit)}, e.g. {num(below)} or {num(below + unit)}"
            else:
                fix = f"the tensor holds less than one block: use at least {num(unit)} bytes"
            out.append(
                error(
                    Code.SIZE_NOT_PAGE_MULTIPLE,
                    _loc_tensor(i, "size"),
                    f"size {num(t.size)} is not a multiple of {what}",
                    fix,
                )
            )
        align = tensor_spec.block_stride_alignment_bytes()
        if align <= 0:
            out.append(
                error(
                    Code.SCHEMA,
                    _loc_tensor(i, "block_stride"),
                    f"the spec of {t.layers[0]} asks block strides to be multiples of a kernel "
                    f"page of {num(align)} bytes",
                    "check block_stride_alignment, block_size and tokens_per_state",
                )
            )
        elif t.block_stride % align:
            out.append(
                error(
                    Code.MISALIGNED,
                    _loc_tensor(i, "block_stride"),
                    f"block_stride {num(t.block_stride)} is not a multiple of the spec's "
                    f"block_stride_alignment ({num(align)} bytes)",
                    f"use a multiple of {num(align)}",
                )
            )

    kbs = doc.kernel_block_sizes
    if kbs is not None:
        expected = sum(
            not isinstance(g.kv_cache_spec, EncoderOnlyAttentionSpec) for g in cfg.kv_cache_groups
        )
        if len(kbs) != expected:
            out.append(
                error(
                    Code.KERNEL_BLOCK_SIZES_LENGTH,
                    "kernel_block_sizes",
                    f"{len(kbs)} kernel block sizes for {expected} groups with tensors",
                    "give one kernel block size per non-encoder-only group",
                )
            )

    out.extend(_check_aliases(doc, group_of, tensor_of))

    for g, group in enumerate(cfg.kv_cache_groups):
        spec = group.kv_cache_spec
        if isinstance(spec, EncoderOnlyAttentionSpec) or not spec.has_layer_views:
            continue
        for layer in group.layer_names:
            if layer not in tensor_of and layer not in shared:
                out.append(
                    error(
                        Code.LAYER_UNBOUND,
                        layer,
                        f"group {g} lists this layer but no tensor places it and it shares no "
                        "other layer's cache",
                        "add it to a KV cache tensor, or to shared_kv_cache_layers",
                    )
                )
    return out


def _check_aliases(
    doc: InputDocument, group_of: dict[str, int], tensor_of: dict[str, int]
) -> list[Diagnostic]:
    cfg = doc.kv_cache_config
    shared = doc.shared_kv_cache_layers
    graph = analyse(shared)
    out: list[Diagnostic] = []
    for sharer, target in shared.items():
        loc = f"shared_kv_cache_layers.{sharer}"
        if sharer == target:
            out.append(
                error(Code.ALIAS_SELF, loc, "layer shares its own KV cache", "remove the entry")
            )
            continue
        if sharer in tensor_of:
            out.append(
                error(
                    Code.ALIAS_ALSO_BOUND,
                    loc,
                    f"layer shares {target}'s cache but tensor {tensor_of[sharer]} also places it",
                    "a KV-sharing layer owns no tensor: remove it from kv_cache_tensors",
                )
            )
        if sharer in graph.on_cycle:
            cycle = graph.cycles[graph.on_cycle[sharer]]
            if cycle[0] == sharer:  # one diagnostic per cycle, at its first member
                out.append(
                    error(
                        Code.ALIAS_CYCLE,
                        loc,
                        f"sharing map has a cycle of {len(cycle)} layers: "
                        + names(cycle, len(cycle)),
                        "point every sharer of the cycle at a layer that owns its KV cache",
                    )
                )
            continue
        if target in shared:
            root = graph.root.get(sharer)
            out.append(
                error(
                    Code.ALIAS_CHAIN,
                    loc,
                    f"target {target} itself shares {shared[target]}'s cache",
                    f"point the layer at {root} directly"
                    if root is not None
                    else "the chain ends in a sharing cycle: break the cycle first",
                )
            )
            continue
        if target not in group_of and target not in tensor_of:
            out.append(
                error(
                    Code.ALIAS_TARGET_MISSING,
                    loc,
                    f"target {target} is in no KV cache group or tensor",
                    "fix the target name (vLLM names look like model.layers.13.self_attn.attn)",
                )
            )
            continue
        if target not in tensor_of:
            out.append(
                error(
                    Code.ALIAS_TARGET_NOT_BACKED,
                    loc,
                    f"target {target} owns no KV cache tensor",
                    "point the layer at a layer placed by a kv_cache_tensor",
                )
            )
            continue
        if sharer in group_of and target in group_of:
            g_s, g_t = group_of[sharer], group_of[target]
            spec_s = cfg.kv_cache_groups[g_s].kv_cache_spec
            spec_t = cfg.kv_cache_groups[g_t].kv_cache_spec
            s_spec = layer_spec(spec_s, sharer) or spec_s
            t_spec = layer_spec(spec_t, target) or spec_t
            if base_kind(s_spec) != base_kind(t_spec):
                out.append(
                    error(
                        Code.ALIAS_KIND_MISMATCH,
                        loc,
                        f"layer is in a {base_kind(s_spec)} group but its target {target} is "
                        f"{base_kind(t_spec)}; vLLM requires the same attention type",
                        "share with a layer of the same attention type",
                    )
                )
    return out
