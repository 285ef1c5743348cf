"""Input rules for legacy documents, whatever the strategy: what vLLM 0.24 (and kvcached) assume."""

from __future__ import annotations

import math

from kvplan.planner._text import num, nums
from kvplan.planner.legacy._resolve import ResolvedDocument, is_encoder_only
from kvplan.schemas.dtypes import itemsize
from kvplan.schemas.errors import Code, Diagnostic, error
from kvplan.schemas.legacy import (
    LEGACY_VLLM_RELEASES,
    LegacyAttentionSpec,
    LegacyKVQuantMode,
    LegacyMambaSpec,
    LegacyMLAAttentionSpec,
    LegacyRelease,
    LegacySlidingWindowMLASpec,
    LegacySpec,
    LegacyTQFullAttentionSpec,
    LegacyUniformTypeKVCacheSpecs,
    _WithHeadSizeV,
    legacy_release,
)

_GROUPS = "kv_cache_config.kv_cache_groups"
_TENSORS = "kv_cache_config.kv_cache_tensors"


def check_legacy(r: ResolvedDocument, *, per_layer: bool = False) -> list[Diagnostic]:
    """Every input error; an empty list means the document can be planned.

    ``per_layer``: kvcached's per-layer pool layout, whose engine core counts one pool per
    tensor-backed layer (``scheduler_num_layers`` is checked against that count).
    """
    out = release_problems(r)
    if out:
        return out
    out = _unsupported_specs(r)
    if out:
        return out
    out += _membership(r)
    out += _sharing(r)
    if out:
        return out
    out += _tensor_sizes(r)
    out += _backend_facts(r)
    out += _scheduler(r, per_layer)
    return out


def _leaves(spec: LegacySpec) -> list[LegacySpec]:
    if isinstance(spec, LegacyUniformTypeKVCacheSpecs):
        return list(spec.kv_cache_specs.values())
    return [spec]


def unsupported_reason(spec: LegacySpec) -> str | None:
    """Why kvplan cannot plan ``spec`` (None: it can)."""
    if isinstance(spec, LegacyTQFullAttentionSpec):
        return "TQFullAttentionSpec (TurboQuant packs K|V into tq_slot_size bytes per token)"
    if isinstance(spec, LegacySlidingWindowMLASpec):
        return "SlidingWindowMLASpec (DeepSeek V4's packed, compressed layout)"
    if isinstance(spec, LegacyMLAAttentionSpec) and spec.compress_ratio != 1:
        return f"MLAAttentionSpec with compress_ratio {spec.compress_ratio} (DeepSeek V4)"
    if isinstance(spec, LegacyAttentionSpec) and spec.kv_quant_mode is LegacyKVQuantMode.NVFP4:
        return f"{spec.kind} with kv_quant_mode NVFP4 (packed fp4 data + fp8 block scales)"
    return None


def _unsupported_specs(r: ResolvedDocument) -> list[Diagnostic]:
    out = []
    for g, group in enumerate(r.doc.kv_cache_config.kv_cache_groups):
        for spec in _leaves(group.kv_cache_spec):
            reason = unsupported_reason(spec)
            if reason:
                out.append(
                    error(
                        Code.LEGACY_SPEC_UNSUPPORTED,
                        f"{_GROUPS}[{g}].kv_cache_spec",
                        f"kvplan cannot plan {reason} from a vLLM 0.24 document",
                        "plan this model with vLLM >= 0.33 (kvplan.input/1)",
                    )
                )
                break
    return out


def _membership(r: ResolvedDocument) -> list[Diagnostic]:
    cfg = r.doc.kv_cache_config
    out: list[Diagnostic] = []
    seen_group: dict[str, int] = {}
    for g, group in enumerate(cfg.kv_cache_groups):
        for name in group.layer_names:
            if name in seen_group and seen_group[name] != g:
                out.append(
                    error(
                        Code.DUPLICATE_GROUP_LAYER,
                        name,
                        f"layer is in groups {seen_group[name]} and {g}",
                        "list each layer in one group",
                    )
                )
            seen_group.setdefault(name, g)
    owner: dict[str, int] = {}
    for t, tensor in enumerate(cfg.kv_cache_tensors):
        for name in tensor.shared_by:
            if name not in r.group_of:
                out.append(
                    error(
                        Code.LAYER_NOT_IN_GROUP,
                        f"{_TENSORS}[{t}]",
                        f"{name} shares a tensor but is in no group",
                        "add the layer to its group or drop it from shared_by",
                    )
                )
            elif name in owner and not (
                tensor.block_stride and cfg.kv_cache_tensors[owner[name]].block_stride
            ):
                out.append(
                    error(
                        Code.LAYER_BOUND_TWICE,
                        name,
                        f"layer is in shared_by of tensors {owner[name]} and {t}",
                        "list each layer in one tensor",
                    )
                )
            owner.setdefault(name, t)
    for g, group in enumerate(cfg.kv_cache_groups):
        if is_encoder_only(group.kv_cache_spec):
            continue
        for name in group.layer_names:
            if name not in r.tensor_of and name not in r.runner_only:
                out.append(
                    error(
                        Code.LEGACY_LAYER_UNBACKED,
                        name,
                        f"layer of group {g} is in no tensor's shared_by and is not runner-only; "
                        "vLLM 0.24 fails 'Some layers are not correctly initialized' and kvcached "
                        "raises KeyError here",
                        "add it to runner_only_attn_layers / shared_kv_cache_layers if it "
                        "shares another layer's cache, else to a tensor's shared_by",
                    )
                )
    return out


def _sharing(r: ResolvedDocument) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for sharer, target in r.sharers.items():
        loc = f"shared_kv_cache_layers.{sharer}"
        if sharer == target:
            out.append(error(Code.ALIAS_SELF, loc, "layer shares its own cache", "remove it"))
        elif sharer in r.tensor_of:
            out.append(
                error(
                    Code.ALIAS_ALSO_BOUND,
                    loc,
                    f"layer owns a tensor and also reads {target}'s cache",
                    "drop it from shared_by or from shared_kv_cache_layers",
                )
            )
        elif target in r.sharers:
            out.append(
                error(
                    Code.ALIAS_CHAIN,
                    loc,
                    f"target {target} itself shares {r.sharers[target]}'s cache",
                    "point the sharer at the tensor-backed layer",
                )
            )
        elif target not in r.group_of:
            out.append(
                error(
                    Code.ALIAS_TARGET_MISSING,
                    loc,
                    f"target {target} is in no group",
                    "point the sharer at a layer of the model",
                )
            )
        elif target not in r.tensor_of:
            out.append(
                error(
                    Code.ALIAS_TARGET_NOT_BACKED,
                    loc,
                    f"target {target} owns no tensor",
                    "point the sharer at a tensor-backed layer",
                )
            )
    return out


def _tensor_sizes(r: ResolvedDocument) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    cfg = r.doc.kv_cache_config
    for name in r.backed_layers:
        spec, t = r.spec_of(name), r.tensor_of[name]
        tensor = cfg.kv_cache_tensors[t]
        if spec is None:
            out.append(
                error(
                    Code.MISSING_LAYER_SPEC,
                    name,
                    "its UniformTypeKVCacheSpecs group has no spec for it",
                    "add the layer to kv_cache_specs",
                )
            )
            continue
        stride = tensor.block_stride or spec.page_size_bytes
        if tensor.size % stride or tensor.size // stride < cfg.num_blocks:
            what = "block_stride" if tensor.block_stride else "page"
            out.append(
                error(
                    Code.SIZE_NOT_PAGE_MULTIPLE,
                    f"{_TENSORS}[{t}]",
                    f"size {tensor.size} is not a multiple of {name}'s {what} {stride} B "
                    f"holding num_blocks {cfg.num_blocks}",
                    "size = page_size_bytes * num_blocks",
                )
            )
    return out


def _backend_facts(r: ResolvedDocument) -> list[Diagnostic]:
    cfg = r.doc.kv_cache_config
    out: list[Diagnostic] = []
    kbs = r.doc.kernel_block_sizes
    needed = sum(1 for g in cfg.kv_cache_groups if not is_encoder_only(g.kv_cache_spec))
    if kbs is not None and len(kbs) < needed:
        return [
            error(
                Code.KERNEL_BLOCK_SIZES_LENGTH,
                "kernel_block_sizes",
                f"{len(kbs)} entries for {needed} groups with tensors",
                "one entry per group, as prepare_kernel_block_sizes returns them",
            )
        ]
    for name in r.backed_layers:
        spec = r.spec_of(name)
        if isinstance(spec, LegacyAttentionSpec):
            problem = _shape_problem(r, name, spec)
            if problem:
                out.append(error(Code.BACKEND_SHAPE_MISMATCH, name, problem, _SHAPE_HINT))
    return out


_SHAPE_HINT = "record what backend.get_kv_cache_shape/get_kv_cache_stride_order return for it"


def _shape_problem(r: ResolvedDocument, name: str, spec: LegacyAttentionSpec) -> str | None:
    info = r.attn_of.get(name)
    if info is None or info.kv_cache_shape is None or info.stride_order is None:
        return "no attention group records its backend's kv_cache_shape and stride_order"
    shape, order = info.kv_cache_shape, info.stride_order
    g = r.group_of[name]
    kernel = r.kernel_block_size(g)
    if kernel <= 0 or spec.block_size % kernel:
        return f"kernel block size {kernel} does not divide block_size {spec.block_size}"
    if sorted(order) != list(range(len(shape))):
        return (
            f"stride_order {nums(order)} is not a permutation of the {len(shape)} dims of "
            f"{nums(shape)}"
        )
    tensor = r.doc.kv_cache_config.kv_cache_tensors[r.tensor_of[name]]
    blocks = tensor.size // (tensor.block_stride or spec.page_size_bytes)
    ratio = spec.block_size // kernel
    dim = info.block_dim if info.block_dim is not None else 0
    if dim >= len(shape) or shape[dim] != blocks * ratio:
        return (
            f"kv_cache_shape {nums(shape)} has no {num(blocks * ratio)} blocks at block_dim {dim} "
            f"({blocks} blocks x {ratio} kernel blocks)"
        )
    page = math.prod(shape) // shape[dim] * itemsize(spec.dtype) * ratio
    if page != spec.unpadded_page_size_bytes:
        return (
            f"kv_cache_shape {nums(shape)} holds {num(page)} B per block but the spec's page is "
            f"{spec.unpadded_page_size_bytes} B"
        )
    if spec.page_size_padded is not None and not tensor.block_stride and dim != 0:
        return "padded pages need a num-blocks-first kv_cache_shape (vLLM asserts it)"
    if tensor.block_stride and order[0] != 0:
        return "packed tensors need a stride order that keeps num_blocks outermost"
    return None


def _scheduler(r: ResolvedDocument, per_layer: bool) -> list[Diagnostic]:
    """``scheduler_num_layers`` against the worker's pool count.

    The recorded count belongs to the engine core of the document's own ``binding.pool_layout``
    (per-layer, or the group-index layouts); binding with the other family (a CLI override)
    asks a different engine core, whose count the document does not hold.
    """
    if (r.doc.binding.pool_layout == "per-layer") != per_layer:
        return []
    expected, pools = r.doc.scheduler_num_layers, r.num_pools(per_layer)
    if expected is None or expected == pools:
        return []
    what = "every tensor-backed layer" if per_layer else "tensor-backed layers of the largest group"
    return [
        error(
            Code.POOL_COUNT_MISMATCH,
            "scheduler_num_layers",
            f"the scheduler side counts {expected} pools but the worker side binds {pools} "
            f"({what}; runner-only layers excluded){_inflation(r, expected, per_layer)}",
            "the engine core and every worker must derive the same pool count: count only "
            "tensor-backed layers (kvcached #472)",
        )
    ]


def _inflation(r: ResolvedDocument, count: int, per_layer: bool) -> str:
    """Why ``count`` is wrong: runner-only layers counted, or the other pool layout's count."""
    sizes = [len(g.layer_names) for g in r.doc.kv_cache_config.kv_cache_groups]
    inflated = sum(sizes) if per_layer else max(sizes, default=0)
    if count == inflated:
        extra = inflated - r.num_pools(per_layer)
        return f"; {count} also counts {extra} runner-only/KV-sharing layers the runner appended"
    if count == r.num_pools(not per_layer):
        other = "the noncontiguous/contiguous layouts'" if per_layer else "the per-layer layout's"
        return f"; {count} is {other} pool count"
    return ""


# ---------------------------------------------------------------- the release's own rules


def accepted_releases() -> str:
    minors = list(LEGACY_VLLM_RELEASES)
    return f"{minors[0]}–{minors[-1]}" if len(minors) > 1 else minors[0]


def release_problems(r: ResolvedDocument) -> list[Diagnostic]:
    """``KVP608`` for a release kvplan's legacy planner does not cover; ``KVP609`` for what
    the named release cannot have produced; ``KVP610`` for what it binds unlike 0.24."""
    version = r.doc.vllm_version
    release = legacy_release(version)
    if release is None:
        return [
            error(
                Code.LEGACY_RELEASE_UNSUPPORTED,
                "vllm_version",
                f"vLLM {version} is not a release kvplan.input-legacy/1 covers: the legacy "
                f"document describes the shared_by KVCacheTensor form of vLLM "
                f"{accepted_releases()} (0.29+ place layers with layers/layer_stride)",
                "capture vLLM 0.29+ as a kvplan.input/1 document (kvplan capture), or name "
                "the vLLM release the document was captured from",
            )
        ]
    return _mismatch(r, release) + _unmodelled(r, release)


def _mismatch(r: ResolvedDocument, release: LegacyRelease) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    fix = "name the vLLM release the document was captured from in vllm_version"
    if not release.packed_tensors:
        for t, tensor in enumerate(r.doc.kv_cache_config.kv_cache_tensors):
            if tensor.block_stride or tensor.offset:
                out.append(
                    error(
                        Code.LEGACY_RELEASE_MISMATCH,
                        f"{_TENSORS}[{t}]",
                        f"vLLM {release.minor}'s KVCacheTensor has no offset/block_stride "
                        "(packed tensors came with 0.24), but this tensor is packed",
                        fix,
                    )
                )
    for g, spec in _group_leaves(r):
        if isinstance(spec, LegacyAttentionSpec) and not release.state_content_pages:
            extra = [
                n for n in ("num_head_slots", "state_content_bytes") if getattr(spec, n) is not None
            ]
            if not isinstance(spec, _WithHeadSizeV) and spec.head_size_v is not None:
                extra.append("head_size_v")
            if extra:
                out.append(
                    error(
                        Code.LEGACY_RELEASE_MISMATCH,
                        f"{_GROUPS}[{g}].kv_cache_spec",
                        f"{spec.kind} sets {', '.join(extra)}, which vLLM {release.minor}'s "
                        f"{spec.kind} does not have (0.28 added them)",
                        fix,
                    )
                )
    return out


def _unmodelled(r: ResolvedDocument, release: LegacyRelease) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    fix = (
        "plan this model with a vLLM release whose binding kvplan reproduces (see docs/versions.md)"
    )

    def refuse(where: str, what: str) -> None:
        out.append(
            error(
                Code.LEGACY_RELEASE_UNMODELLED,
                where,
                f"vLLM {release.minor} {what}; kvplan's legacy planner reproduces 0.24's binding "
                "and does not model this",
                fix,
            )
        )

    for g, spec in _group_leaves(r):
        where = f"{_GROUPS}[{g}].kv_cache_spec"
        if isinstance(spec, LegacyMambaSpec) and not release.mamba_state_views:
            refuse(where, "binds a Mamba layer as one raw (blocks, 1, 1, page) view, not per state")
        if not isinstance(spec, LegacyAttentionSpec):
            continue
        if not release.state_content_pages:
            continue
        if spec.num_head_slots is not None or spec.state_content_bytes is not None:
            refuse(where, "sizes pages from the backend's num_head_slots/state_content_bytes")
        elif not isinstance(spec, _WithHeadSizeV) and spec.head_size_v not in (
            None,
            spec.head_size,
        ):
            refuse(where, f"sizes {spec.kind} pages with head_size_v {spec.head_size_v}")
        elif spec.kv_quant_mode.is_per_token_head:
            refuse(where, f"budgets {spec.kv_quant_mode.name} scales outside the 0.24 page")
        elif getattr(spec, "cache_dtype_str", None) == "fp8_ds_mla":
            refuse(where, "sizes fp8_ds_mla pages from state_content_bytes")
    if release.relayout_mixed_attention and not r.has_mamba:
        dims = {
            info.block_dim or 0
            for name in r.backed_layers
            if isinstance(r.spec_of(name), LegacyAttentionSpec)
            and (info := r.attn_of.get(name)) is not None
        }
        if len(dims) > 1:
            refuse(
                "attn_groups",
                "restrides attention caches whose groups disagree on block_dim "
                f"({sorted(dims)}) to blocks-first",
            )
    return out


def _group_leaves(r: ResolvedDocument) -> list[tuple[int, LegacySpec]]:
    return [
        (g, spec)
        for g, group in enumerate(r.doc.kv_cache_config.kv_cache_groups)
        for spec in _leaves(group.kv_cache_spec)
    ]
