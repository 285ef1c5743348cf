"""Bounded text for diagnostics: numbers and name lists that cannot grow a message unboundedly.

Python refuses ``str()`` of integers over 4300 digits (and is quadratic below that), so a
message must never format a product of user numbers as is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MAX_NAMES = 8


def num(value: int) -> str:
    """``value`` in decimal, or ``<a 1234-bit number>`` when it is wider than 128 bits."""
    if value.bit_length() <= 128:  # at most 39 digits
        return str(value)
    sign = "-" if value < 0 else ""
    return f"{sign}<a {value.bit_length()}-bit number>"


def nums(values: Sequence[int], limit: int = MAX_NAMES) -> str:
    """A list of numbers, at most ``limit`` shown: ``[1, 2, ... (9 entries)]``."""
    shown = ", ".join(num(v) for v in values[:limit])
    more = f", ... ({len(values)} entries)" if len(values) > limit else ""
    return f"[{shown}{more}]"


def names(items: Iterable[str], total: int | None = None, limit: int = MAX_NAMES) -> str:
    """Names joined by commas, at most ``limit`` (each cut to 80 characters)."""
    shown: list[str] = []
    count = 0
    for item in items:
        count += 1
        if len(shown) < limit:
            shown.append(item if len(item) <= 80 else item[:77] + "...")
    total = count if total is None else total
    text = ", ".join(shown)
    if total > len(shown):
        text += f", ... ({total} in all)"
    return text
