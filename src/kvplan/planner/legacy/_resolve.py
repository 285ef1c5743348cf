"""Who owns what in a legacy document: groups, tensors, runner-only layers, backend facts."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvplan.schemas.legacy import (
    AttentionGroupInfo,
    LegacyEncoderOnlyAttentionSpec,
    LegacyInputDocument,
    LegacyMambaSpec,
    LegacySpec,
    LegacyUniformTypeKVCacheSpecs,
    layer_spec,
)


@dataclass
class ResolvedDocument:
    """Indexes over one legacy document (built once, read by checks and strategies)."""

    doc: LegacyInputDocument
    group_of: dict[str, int] = field(default_factory=dict)
    tensor_of: dict[str, int] = field(default_factory=dict)
    runner_only: frozenset[str] = frozenset()
    sharers: dict[str, str] = field(default_factory=dict)
    attn_of: dict[str, AttentionGroupInfo] = field(default_factory=dict)
    backed: list[list[str]] = field(default_factory=list)
    """Per group: its tensor-backed layers in ``layer_names`` order (kvcached's pool order)."""

    @property
    def num_blocks(self) -> int:
        return self.doc.kv_cache_config.num_blocks

    def spec_of(self, layer: str) -> LegacySpec | None:
        """``layer``'s own spec; a sharer's is its target's (vLLM 0.24 would KeyError)."""
        g = self.group_of.get(layer)
        if g is None:
            return None
        group_spec = self.doc.kv_cache_config.kv_cache_groups[g].kv_cache_spec
        own = layer_spec(group_spec, layer)
        if own is None and layer in self.sharers:
            return layer_spec(group_spec, self.sharers[layer])
        return own

    def kernel_block_size(self, group: int) -> int:
        kbs = self.doc.kernel_block_sizes
        spec = self.doc.kv_cache_config.kv_cache_groups[group].kv_cache_spec
        if kbs is not None and group < len(kbs):
            return kbs[group]
        return spec.block_size

    def group_spec(self, group: int) -> LegacySpec:
        return self.doc.kv_cache_config.kv_cache_groups[group].kv_cache_spec

    @property
    def backed_layers(self) -> list[str]:
        return [name for layers in self.backed for name in layers]

    @property
    def has_mamba(self) -> bool:
        return any(isinstance(self.spec_of(n), LegacyMambaSpec) for n in self.backed_layers)

    @property
    def group_size(self) -> int:
        """Tensor-backed layers of the largest group: the scheduler's pool count."""
        return max((len(layers) for layers in self.backed), default=0)

    def num_pools(self, per_layer: bool) -> int:
        """kvcached's pool count: one per tensor-backed layer (per-layer), else the group size."""
        return len(self.backed_layers) if per_layer else self.group_size


def resolve(doc: LegacyInputDocument) -> ResolvedDocument:
    cfg = doc.kv_cache_config
    r = ResolvedDocument(doc=doc, sharers=dict(doc.shared_kv_cache_layers))
    r.runner_only = frozenset(doc.runner_only_attn_layers) | frozenset(doc.shared_kv_cache_layers)
    for g, group in enumerate(cfg.kv_cache_groups):
        for name in group.layer_names:
            r.group_of.setdefault(name, g)
    for t, tensor in enumerate(cfg.kv_cache_tensors):
        for name in tensor.shared_by:
            r.tensor_of.setdefault(name, t)
    for info in doc.attn_groups:
        for name in info.layer_names:
            r.attn_of.setdefault(name, info)
    for group in cfg.kv_cache_groups:
        r.backed.append(
            [n for n in group.layer_names if n not in r.runner_only and n in r.tensor_of]
        )
    return r


def is_encoder_only(spec: LegacySpec) -> bool:
    if isinstance(spec, LegacyUniformTypeKVCacheSpecs):
        return any(
            isinstance(s, LegacyEncoderOnlyAttentionSpec) for s in spec.kv_cache_specs.values()
        )
    return isinstance(spec, LegacyEncoderOnlyAttentionSpec)
