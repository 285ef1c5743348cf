"""Sizes and numbers people type are ASCII: every non-ASCII decimal digit (Arabic-Indic,
Devanagari, full-width, mathematical bold, ...) and every non-ASCII space, in every size and
number a command reads, is refused with a code, never read as the digit it looks like."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest

from kvplan.schemas.errors import KVPlanError
from kvplan.units import parse_size
from tests.hostile._attacks import UNICODE_SPACES, Area, foreign_digits
from tests.hostile._harness import assert_refused, invoke

DIGITS = foreign_digits(3)
ENV = {"NO_COLOR": "1", "COLUMNS": "200"}


def test_there_are_many_foreign_digits() -> None:
    assert len(DIGITS) > 50 and "\u0663" in DIGITS and "\uff13" in DIGITS  # ٣ and ３


def _spellings(digit: str) -> list[str]:
    return [f"{digit}GiB", f"1{digit}", f"{digit}", f"2.{digit}MiB", f"{digit}{digit}KB"]


@pytest.mark.parametrize("digit", DIGITS, ids=[f"U+{ord(d):04X}" for d in DIGITS])
def test_parse_size_reads_ascii_digits_only(digit: str) -> None:
    for text in _spellings(digit):
        with pytest.raises(KVPlanError) as refused:
            parse_size(text, "--size")
        assert refused.value.code.value == "KVP020", text


@pytest.mark.parametrize("space", UNICODE_SPACES, ids=[f"U+{ord(s):04X}" for s in UNICODE_SPACES])
def test_parse_size_allows_ascii_spaces_only(space: str) -> None:
    assert parse_size(" 3GiB\t") == 3 << 30
    for text in (f"3{space}GiB", f"{space}3GiB", f"3GiB{space}"):
        with pytest.raises(KVPlanError) as refused:
            parse_size(text)
        assert refused.value.code.value == "KVP020"


def test_parse_size_refuses_full_width_units() -> None:
    for text in ("3\uff27iB", "3G\uff49B", "3\u212aB"):  # Ｇ, ｉ, the Kelvin sign
        with pytest.raises(KVPlanError):
            parse_size(text)


ENTRY_POINTS: dict[str, Callable[[Area, str], list[str]]] = {
    "limit-size": lambda a, n: ["limit", str(a.dump), f"{n}GiB"],
    "limit-cache": lambda a, n: ["limit", str(a.dump), "8GiB", "--cache", f"{n}GiB"],
    "apply-chunk-size": lambda a, n: [
        *("apply", str(a.plan), "--backend", "meta"),
        *("--chunk-size", f"{n}MiB"),
    ],
    "apply-blocks": lambda a, n: [
        *("apply", str(a.plan), "--backend", "meta", "--mode", "elastic"),
        *("--blocks", f"0-{n}"),
    ],
    "inspect-gpu-memory": lambda a, n: ["inspect", "no/model", "--gpu-memory", f"{n}GiB"],
    "inspect-num-blocks": lambda a, n: ["inspect", "no/model", "--num-blocks", n],
    "inspect-max-model-len": lambda a, n: ["inspect", "no/model", "--max-model-len", n],
    "inspect-block-size": lambda a, n: ["inspect", "no/model", "--block-size", n],
    "inspect-tp": lambda a, n: ["inspect", "no/model", "--tp", n],
    "inspect-utilization": lambda a, n: [
        *("inspect", "no/model", "--gpu-memory-utilization", f"0.{n}"),
    ],
    "golden-add-gpu-memory": lambda a, n: [
        *("golden", "add", str(a.golden), "no/model", "--gpu-memory", f"{n}GiB"),
    ],
    "plan-virtual-capacity": lambda a, n: [
        *("plan", str(a.input), "--virtual-capacity", f"{n}000000"),
    ],
    "top-interval": lambda a, n: ["top", str(a.dump), "--once", "--interval", n],
}
"""Every option and argument that takes a size or a number."""

SAMPLE = ["\u0663", "\u0969", "\uff13", "\U0001d7d1", "\u09e9", "\u1813"]
"""Arabic-Indic, Devanagari, full-width, mathematical bold, Bengali, Mongolian three."""
CASES = [(entry, digit) for entry in sorted(ENTRY_POINTS) for digit in SAMPLE]


@pytest.mark.parametrize(("entry", "digit"), CASES, ids=[f"{e}-U+{ord(d):04X}" for e, d in CASES])
def test_every_number_option_reads_ascii_digits_only(
    tmp_path: Path, entry: str, digit: str
) -> None:
    area = Area(tmp_path)
    before = (area.dump / "limit.json").exists()
    outcome = invoke(ENTRY_POINTS[entry](area, digit), env=ENV)
    assert_refused(outcome, what=f"{entry} {digit!r}")
    # a size is KVP020, a number KVP406, a block range KVP004 (apply --blocks' own code)
    assert outcome.stderr[:6] in ("KVP004", "KVP020", "KVP406"), outcome.stderr[:300]
    assert (area.dump / "limit.json").exists() == before


@pytest.mark.parametrize("digit", SAMPLE, ids=[f"U+{ord(d):04X}" for d in SAMPLE])
def test_a_fraction_in_a_document_is_ascii(digit: str) -> None:
    """``tokens_per_state: "1/1"`` is vLLM's ``Fraction``; ``Fraction("٣/٤")`` would read the
    Arabic-Indic digits, so the schema reads ASCII fractions only (``KVP004``)."""
    from harness import _builders as b
    from kvplan.schemas.loading import parse_input

    data = b.llama(2)
    spec = data["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]
    spec["tokens_per_state"] = "1/1"
    parse_input(data)
    one = chr(ord(digit) - 2)  # the same script's digit one (decimal digits are contiguous)
    assert unicodedata.decimal(one) == 1
    spec["tokens_per_state"] = f"{one}/{one}"
    with pytest.raises(KVPlanError) as refused:
        parse_input(data)
    assert refused.value.code.value == "KVP004"
