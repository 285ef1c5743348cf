"""Sizes and numbers as people write them: ``80GiB``, ``2M``, ``4096``, ``0.9``; and back,
``1.50 GiB``. ASCII only: the one reader of what people type (options, ``KVPLAN_*``)."""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {u: 1 << (10 * (i + 1)) for i, u in enumerate("KMGTPE")}
_UNITS: dict[str, int] = {"": 1, "B": 1}
_UNITS.update(_BINARY)
_UNITS.update({f"{u}IB": v for u, v in _BINARY.items()})
_UNITS.update({f"{u}B": 1000 ** (i + 1) for i, u in enumerate("KMGTPE")})
_SIZE = re.compile(
    r"\s*([0-9]{1,40}(?:\.[0-9]{1,40})?|\.[0-9]{1,40})\s*([A-Za-z]{0,3})\s*", re.ASCII
)
"""ASCII only (``re.ASCII``: ``\\s`` is ASCII white space): ``int()`` and a Unicode ``\\d``
also read Arabic-Indic, full-width or bold digits, and Unicode ``\\s`` takes NO-BREAK or EM
SPACE; a size is written in ASCII."""

VMM_GRANULARITY = 2 << 20
"""2 MiB: the allocation granularity of CUDA's virtual memory API on current GPUs
(``cuMemGetAllocationGranularity`` with ``CU_MEM_ALLOC_GRANULARITY_MINIMUM``), which is why
kvcached's physical page defaults to it (``KVCACHED_PAGE_SIZE_MB=2``). Pools are checked
against it (``KVP308``) and the elastic executor maps chunks of it by default."""
POOL_ALIGNMENT = 256
"""Base alignment kvplan asks of a pool (bytes): cudaMalloc's guarantee, which kernels assume."""

MAX_SIZE = (1 << 63) - 1
"""Largest size :func:`parse_size` returns (the signed 64-bit range)."""
MAX_OPTION_BYTES = 1 << 50
"""Largest byte count a command-line option takes (1 PiB: above any device's memory)."""


def parse_size(text: str, where: str = "size", *, limit: int = MAX_SIZE) -> int:
    """Bytes in ``text``: ``KiB``…``EiB`` and bare ``K``…``E`` are binary, ``KB``…``EB`` decimal.

    The one reader of sizes people write (``--gpu-memory``, ``--chunk-size``, ``kvplan limit``,
    the plugin's ``KVPLAN_*`` sizes). ASCII digits, letters and white space only. Anything
    else, or a size that is not positive, raises :class:`~kvplan.schemas.errors.KVPlanError`
    ``KVP020`` at ``where`` (the option's name); a size above ``limit`` is ``KVP405``.
    """
    from kvplan.schemas.errors import Code, KVPlanError, error, show_value

    shown = show_value(text, 44)
    match = _SIZE.fullmatch(text)
    unit = match.group(2).upper() if match else ""
    value = int(Fraction(match.group(1)) * _UNITS[unit]) if match and unit in _UNITS else 0
    code, hint = Code.BAD_SIZE, "write e.g. 80GiB, 2MiB or 4096 (bytes)"
    if not match and not text.isascii():
        problem = f"cannot read size {shown}: sizes are written in ASCII digits and letters"
    elif not match or unit not in _UNITS:
        problem = f"cannot read size {shown}"
    elif value <= 0:
        problem = f"size {shown} is not positive"
    elif value > limit:  # however large (8 EiB and more too): a size, above what is accepted
        code, hint = Code.OPTION_OUT_OF_RANGE, f"give at most {human_bytes(limit)}"
        problem = f"{human_bytes(value)} is larger than kvplan accepts ({human_bytes(limit)})"
    else:
        return value
    raise KVPlanError(error(code, where, problem, hint))


def _ascii_number(text: str, limit: int) -> bool:
    return text.isascii() and "_" not in text and len(text) <= limit


def parse_int(
    text: str, where: str = "number", *, minimum: int | None = None, code: str = "KVP406"
) -> int:
    """An integer people typed (``--tp 2``, ``KVPLAN_DEBUG_SKIP_MAP=3``): ASCII digits with
    an optional sign and white space, else ``KVPlanError`` with ``code`` (``KVP406`` by
    default, the code of a command-line value of the wrong type) at ``where``; below
    ``minimum`` too. ``int()`` alone would read ``٣`` or ``３`` as 3 and ``1_0`` as 10, and
    ``str.isdigit()`` accepts ``²``, which ``int()`` then refuses."""
    from kvplan.schemas.errors import Code, KVPlanError, error

    value: int | None = None
    if _ascii_number(text, 40):
        try:
            value = int(text)
        except ValueError:
            value = None
    if value is None:
        raise _not_ascii(text, where, code, "an integer", "16")
    if minimum is not None and value < minimum:
        raise KVPlanError(
            error(Code(code), where, f"{value} is below {minimum}.", f"give at least {minimum}")
        )
    return value


def parse_number(text: str, where: str = "number", *, code: str = "KVP406") -> float:
    """A number people typed (``--gpu-memory-utilization 0.9``, ``--interval 0.5``): ASCII
    only (``nan`` and ``inf`` are returned: the caller checks its range), else
    ``KVPlanError`` with ``code`` at ``where``."""
    try:
        if _ascii_number(text, 60):
            return float(text)
    except ValueError:
        pass
    raise _not_ascii(text, where, code, "a number", "0.9")


def _not_ascii(text: str, where: str, code: str, kind: str, example: str) -> Exception:
    """The refusal of a value that is not ``kind`` written in ASCII digits (with an example
    after the flag when ``where`` is one)."""
    from kvplan.schemas.errors import Code, KVPlanError, error, show_value

    hint = f"e.g. {where} {example}" if where.startswith("-") else f"write e.g. {example}"
    return KVPlanError(
        error(Code(code), where, f"{show_value(text)} is not {kind} written in ASCII digits.", hint)
    )


def human_bytes(n: float) -> str:
    """``1610612736`` → ``1.50 GiB``; whole bytes below 1 KiB."""
    if isinstance(n, int) and abs(n) >= 1 << 60:  # exact: a float would overflow or round
        return f"{n / (1 << 40):.4g} TiB" if abs(n) < 1 << 1000 else "more than 10^290 TiB"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns
