"""Layer names written short, for tables a person reads at 100 columns (``kvplan show``,
``kvplan inspect``, ``kvplan diff``): the prefix and suffix every name shares are said once
(``layer = language_model.model.layers.<layer>.self_attn.attn``), each name as the part that
differs (``13``); shapes and strides as one word (``786432×1×32×512``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def dims(values: Iterable[int]) -> str:
    """``786432×1×32×512``: a shape or a stride as one word."""
    return "×".join(str(v) for v in values)


def common_prefix(names: Sequence[str]) -> str:
    """The longest common prefix of ``names`` ending in a dot."""
    if not names:
        return ""
    common = names[0]
    for name in names[1:]:
        while not name.startswith(common):
            common = common[:-1]
    return common[: common.rfind(".") + 1]


def common_suffix(names: Sequence[str]) -> str:
    """The longest common suffix of ``names`` starting with a dot."""
    return common_prefix([name[::-1] for name in names])[::-1]


def short_kind(kind: str) -> str:
    """``SlidingWindow`` for ``SlidingWindowSpec``, ``FullAttention`` for ``FullAttentionSpec``."""
    return kind.removesuffix("Spec").removesuffix("KVCache")


class LayerNames:
    """The layer names of one or more plans, each written as the part that differs."""

    def __init__(self, names: Sequence[str]) -> None:
        names = list(names)
        prefix, suffix = common_prefix(names), common_suffix(names)
        if not names or len(prefix) + len(suffix) >= min(len(name) for name in names):
            prefix = suffix = ""
        self.prefix, self.suffix = prefix, suffix

    def short(self, name: str) -> str:
        return name.removeprefix(self.prefix).removesuffix(self.suffix)

    @property
    def pattern(self) -> str:
        """``PREFIX<layer>SUFFIX`` (empty when the names share no part)."""
        return f"{self.prefix}<layer>{self.suffix}" if self.prefix or self.suffix else ""

    @property
    def legend(self) -> str:
        """`` (layer = PREFIX<layer>SUFFIX)``, or nothing when the names share no part."""
        return f" (layer = {self.pattern})" if self.pattern else ""
