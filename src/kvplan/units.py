"""Byte sizes as people write them: ``80GiB``, ``2M``, ``4096``; and back, ``1.50 GiB``."""

from __future__ import annotations

import re

_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_UNITS: dict[str, int] = {"": 1, "B": 1}
_UNITS.update(_BINARY)
_UNITS.update({f"{u}IB": v for u, v in _BINARY.items()})
_UNITS.update({f"{u}B": 1000 ** (i + 1) for i, u in enumerate("KMGT")})


def parse_size(text: str) -> int:
    """Bytes in ``text``: ``KiB``…``TiB`` and bare ``K``…``T`` are binary, ``KB``…``TB`` decimal.

    Raises ``ValueError`` for anything else, or for a size that is not positive.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"cannot read size {text!r}; write e.g. 80GiB, 2MiB or 4096")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"size {text!r} is not positive")
    return value


def human_bytes(n: float) -> str:
    """``1610612736`` → ``1.50 GiB``; whole bytes below 1 KiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns
