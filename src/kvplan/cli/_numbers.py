"""Numbers typed on the command line, read as ASCII (the one reader of counts and fractions).

click's ``INT`` and ``FLOAT`` types call ``int()`` and ``float()``, which also read
Arabic-Indic, full-width or mathematical digits (``int("٣") == 3``), ``1_000`` and
non-ASCII spaces. Options that take a number are declared as text and read here, inside the
command's error boundary: anything but ASCII digits (with a sign, a point or an exponent for
a fraction) is ``KVP406``, naming the option. Sizes are read by ``kvplan.units.parse_size``.
"""

from __future__ import annotations

from kvplan.schemas.errors import Code, KVPlanError, error, show_value


def _ascii(text: str) -> bool:
    return text.isascii() and "_" not in text


def _refuse(option: str, text: str, what: str) -> KVPlanError:
    return KVPlanError(
        error(
            Code.USAGE,
            option,
            f"{show_value(text)} is not {what} written in ASCII digits.",
            f"e.g. {option} {'16' if 'integer' in what else '0.9'}",
        )
    )


def ascii_int(text: str | None, option: str, *, minimum: int | None = None) -> int | None:
    """``text`` as an integer (None stays None); ``KVP406`` unless ASCII digits, or below
    ``minimum``."""
    if text is None:
        return None
    try:
        value = int(text) if _ascii(text) and len(text) <= 40 else None
    except ValueError:
        value = None
    if value is None:
        raise _refuse(option, text, "an integer")
    if minimum is not None and value < minimum:
        raise KVPlanError(
            error(Code.USAGE, option, f"{value} is below {minimum}.", f"give at least {minimum}")
        )
    return value


def ascii_float(text: str, option: str) -> float:
    """``text`` as a number (``nan``/``inf`` included: the caller checks its range);
    ``KVP406`` unless ASCII."""
    try:
        return float(text) if _ascii(text) and len(text) <= 60 else float("invalid")
    except ValueError:
        raise _refuse(option, text, "a number") from None
