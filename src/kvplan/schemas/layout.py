"""vLLM 0.33's ``KVCacheLayout``: a permutation of the logical ``[L, B, H, N, C]`` axes."""

from __future__ import annotations

from enum import Enum

DIM_L, DIM_B, DIM_H, DIM_N, DIM_C = 0, 1, 2, 3, 4


class KVCacheLayout(Enum):
    """Physical axis order, outermost first, as indices into logical ``[L, B, H, N, C]``."""

    LBHNC = (0, 1, 2, 3, 4)
    LBNHC = (0, 1, 3, 2, 4)
    LHBNC = (0, 2, 1, 3, 4)
    BLHNC = (1, 0, 2, 3, 4)
    BLNHC = (1, 0, 3, 2, 4)
    BHLNC = (1, 2, 0, 3, 4)

    @property
    def stride_order(self) -> tuple[int, ...]:
        return self.value


LAYOUT_ALIASES: dict[str, str] = {"NHD": "LBNHC", "HND": "LBHNC"}


def parse_layout(value: object) -> KVCacheLayout:
    """A layout from its name (``LBNHC``…), an alias (``NHD``/``HND``) or a vLLM enum member."""
    if isinstance(value, KVCacheLayout):
        return value
    name = getattr(value, "name", value)
    if isinstance(name, str):
        key = name.strip().upper()
        key = LAYOUT_ALIASES.get(key, key)
        if key in KVCacheLayout.__members__:
            return KVCacheLayout[key]
    names = ", ".join([*KVCacheLayout.__members__, *LAYOUT_ALIASES])
    raise ValueError(f"unknown KV cache layout {value!r}; expected one of: {names}")
