"""Diagnostics with stable ``KVPnnn`` codes, and the exception that carries them."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

MAX_LOCATION_CHARS = 160
"""Longest location a diagnostic keeps (longer ones are cut in the middle)."""
MAX_MESSAGE_CHARS = 480
"""Longest message or hint a diagnostic keeps: a diagnostic is a few lines at most."""
MAX_REPR_CHARS = 60
"""Longest rendering of one user-supplied value inside a message (:func:`show_value`)."""

# C0/C1 control characters, DEL, the bidirectional overrides that reorder what a terminal
# shows, and lone surrogates (the bytes of a file name that is not UTF-8, as Python decodes
# it): never written raw to a terminal, a log or a page from a document or a file name.
UNSAFE_CHARS = "\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
"""The one set (a regular-expression class body) escaped wherever kvplan prints text it did
not write -- terminal, log, JSON (:func:`kvplan.schemas.canonical.escape_json_text`), HTML
(``kvplan.render``) -- besides the C0 controls each of them escapes its own way."""
_UNPRINTABLE = re.compile(f"[\x00-\x1f{UNSAFE_CHARS}]")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, limit: int | None = None) -> str:
    """``text`` safe for a terminal: control characters escaped (``\\x1b``), and, with
    ``limit``, cut in the middle to at most ``limit`` characters. The result is always valid
    UTF-8 (a non-UTF-8 byte of a file name, a lone surrogate in Python, becomes ``\\udcXX``).

    The one filter every document-supplied text goes through before it reaches a terminal or
    a log: diagnostics (all fields), ``show`` tables, ``diff`` text, what the ``/metrics``
    collector logs of a file. Rich markup is never applied
    to such text (it is printed as :class:`rich.text.Text` or with ``markup=False``).
    """
    text = _UNPRINTABLE.sub(_escape_char, text)
    if limit is not None and len(text) > limit:
        keep = max(limit - 5, 2)
        text = f"{text[: keep - keep // 3]} ... {text[len(text) - keep // 3 :]}"
    return text


def owner_text(uid: int) -> str:
    """Who ``uid`` is, for a message: ``uid 65534 (nobody)``, or ``uid 1234`` without a name."""
    try:
        import pwd

        return f"uid {uid} ({printable(pwd.getpwuid(uid).pw_name, 64)})"
    except (KeyError, ImportError, OverflowError):
        return f"uid {uid}"


def show_value(value: Any, limit: int = MAX_REPR_CHARS) -> str:
    """A bounded ``repr`` of a user-supplied value for a message: never a huge integer's digits,
    a whole nested document, or a raw control character."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 64:
            return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
        return repr(value)
    if isinstance(value, dict):
        return f"a mapping of {len(value)} key(s)"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, str):
        return printable(repr(value[: limit * 2]), limit)
    return printable(f"a {type(value).__name__}", limit)


def _sentence(text: str) -> str:
    """``text`` ending as a sentence (a full stop added unless it ends in ``.``, ``!``, ``?``)."""
    text = text.rstrip()
    return text if not text or text.endswith((".", "!", "?", "…")) else text + "."


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


class Code(StrEnum):
    """Stable diagnostic codes. Never renumber: users grep logs and CI output for them."""

    # documents: reading and schema (0xx)
    MALFORMED = "KVP001"
    UNREADABLE = "KVP002"
    WRONG_FORMAT = "KVP003"
    SCHEMA = "KVP004"
    UNKNOWN_SPEC_KIND = "KVP005"
    UNKNOWN_DTYPE = "KVP006"
    UNKNOWN_LAYOUT = "KVP007"
    UNKNOWN_ENUM = "KVP008"
    # documents: reading limits, files and output (009-019)
    TOO_DEEP = "KVP009"
    NUMBER_OUT_OF_RANGE = "KVP010"
    DUPLICATE_KEY = "KVP011"
    ALIAS_EXPANSION = "KVP012"
    BAD_ENCODING = "KVP013"
    TOO_LARGE = "KVP014"
    EMPTY_DOCUMENT = "KVP015"
    OUTPUT_FAILED = "KVP016"
    OUTPUT_IS_INPUT = "KVP017"
    STDOUT_FAILED = "KVP018"
    INTERNAL = "KVP019"
    # options and values (020-021)
    BAD_SIZE = "KVP020"
    UNKNOWN_SCHEMA = "KVP021"
    # files, outputs and bounds (022-029)
    NOT_REGULAR_FILE = "KVP022"
    UNSAFE_OUTPUT = "KVP023"
    NOTHING_TO_CHECK = "KVP024"
    NAME_TOO_LONG = "KVP025"
    TOO_MANY_ITEMS = "KVP026"
    BUNDLE_MISMATCH = "KVP027"
    # config semantics (1xx)
    BAD_NUM_BLOCKS = "KVP101"
    EMPTY_TENSOR = "KVP102"
    TENSOR_SIZE_MISMATCH = "KVP103"
    LAYER_NOT_IN_GROUP = "KVP104"
    LAYER_UNBOUND = "KVP105"
    LAYER_BOUND_TWICE = "KVP106"
    SIZE_NOT_PAGE_MULTIPLE = "KVP107"
    PADDED_PAGE_TOO_SMALL = "KVP108"
    MISSING_LAYER_SPEC = "KVP109"
    KERNEL_BLOCK_MISMATCH = "KVP110"
    KERNEL_SPLIT_NOT_DENSE = "KVP111"
    KERNEL_BLOCK_SIZES_LENGTH = "KVP112"
    DUPLICATE_GROUP_LAYER = "KVP113"
    LAYOUT_MISSING = "KVP114"
    PAGE_GRID_INVALID = "KVP115"
    # aliases (2xx)
    ALIAS_TARGET_MISSING = "KVP201"
    ALIAS_TARGET_NOT_BACKED = "KVP202"
    ALIAS_CHAIN = "KVP203"
    ALIAS_CYCLE = "KVP204"
    ALIAS_SELF = "KVP205"
    ALIAS_KIND_MISMATCH = "KVP206"
    ALIAS_ALSO_BOUND = "KVP207"
    # plan geometry (3xx)
    VIEW_OUT_OF_BOUNDS = "KVP301"
    VIEW_OVERLAP = "KVP302"
    MISALIGNED = "KVP303"
    OVERFLOW = "KVP304"
    UNKNOWN_POOL = "KVP305"
    DUPLICATE_VIEW = "KVP306"
    BAD_VIEW_SHAPE = "KVP307"
    POOL_NOT_GRANULAR = "KVP308"
    OVERLAP_UNPROVEN = "KVP309"  # reserved: overlap is decided exactly since KVP310-KVP311
    VIEW_SELF_OVERLAP = "KVP310"
    OVERLAP_UNDECIDED = "KVP311"
    DUPLICATE_POOL = "KVP312"
    # execution (4xx)
    BACKEND_UNAVAILABLE = "KVP401"
    DRIVER_CALL_FAILED = "KVP402"
    VERIFY_MISMATCH = "KVP403"
    BLOCK_OUT_OF_RANGE = "KVP404"
    # CLI execution inputs (405-409)
    OPTION_OUT_OF_RANGE = "KVP405"
    USAGE = "KVP406"
    CLOSE_INCOMPLETE = "KVP410"
    # execution bounds (420-425)
    TOO_MANY_CHUNKS = "KVP420"
    # elastic serving files and commands (416-419)
    STATS_UNREADABLE = "KVP416"
    LIMIT_UNREADABLE = "KVP417"
    BAD_LIMIT = "KVP418"
    DIRECTORY_MISSING = "KVP419"
    STATS_PLAN_MISMATCH = "KVP426"
    LIMIT_BELOW_FLOOR = "KVP427"
    UNTRUSTED = "KVP428"
    LIMIT_NO_ENGINES = "KVP429"
    INTEGRATION = "KVP501"
    RANK_UNKNOWN = "KVP502"
    REVIEWED_PLAN_DIFFERS = "KVP503"
    REVIEWED_PLAN_MISSING = "KVP504"
    FIELD_NOT_IN_RELEASE = "KVP505"
    FOREIGN_WRAPPER = "KVP506"
    CACHE_REBOUND = "KVP507"
    EXTENSIBLE_KV_CACHE = "KVP508"
    FEATURE_REFUSED = "KVP509"
    REMOTE_CODE_REQUIRED = "KVP520"
    REMOTE_CODE_UNAVAILABLE = "KVP521"
    ELASTIC_UNSUPPORTED = "KVP530"
    ELASTIC_GEOMETRY = "KVP531"
    ELASTIC_MAP_FAILED = "KVP532"
    ELASTIC_LIMIT_TOO_SMALL = "KVP533"
    ELASTIC_REQUEST_UNSERVABLE = "KVP534"
    GROUP_UNREACHABLE = "KVP540"
    GROUP_LEDGER_INVALID = "KVP541"
    GROUP_GUARANTEES_EXCEED_BUDGET = "KVP542"
    GROUP_MEMBER_REFUSED = "KVP543"
    GROUP_BUDGET_MISSING = "KVP544"
    GROUP_LEASE_LOST = "KVP545"
    GROUP_NOT_GRANTED = "KVP546"
    GROUP_BAD_REQUEST = "KVP547"
    GROUP_SPANS_NODES = "KVP548"
    # legacy / kvcached (6xx)
    LEGACY_LAYER_UNBACKED = "KVP601"
    POOL_COUNT_MISMATCH = "KVP602"
    CONTIGUOUS_KERNEL_SPLIT = "KVP603"
    LEGACY_SPEC_UNSUPPORTED = "KVP604"
    KVCACHED_UNSUPPORTED = "KVP605"
    BACKEND_SHAPE_MISMATCH = "KVP606"
    VIRTUAL_CAPACITY_TOO_SMALL = "KVP607"
    LEGACY_RELEASE_UNSUPPORTED = "KVP608"
    LEGACY_RELEASE_MISMATCH = "KVP609"
    LEGACY_RELEASE_UNMODELLED = "KVP610"


class Diagnostic(BaseModel):
    """One finding of validation or verification.

    ``location`` names the offending layer, pool or document field (a dotted path).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: Code
    severity: Severity = Severity.ERROR
    location: str = ""
    message: str
    hint: str = ""

    @field_validator("location")
    @classmethod
    def _bound_location(cls, value: str) -> str:
        return printable(value, MAX_LOCATION_CHARS)

    @field_validator("message", "hint")
    @classmethod
    def _bound_text(cls, value: str) -> str:
        return printable(value, MAX_MESSAGE_CHARS)

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def render(self) -> str:
        """One paragraph in the one message style of kvplan:
        ``KVP201 error at model.layers.15: <what is wrong>. Fix: <what to do>.``"""
        where = f" at {self.location}" if self.location else ""
        text = f"{self.code.value} {self.severity.value}{where}: {_sentence(self.message)}"
        if self.hint:
            text += f" Fix: {_sentence(self.hint)}"
        return text


def error(code: Code, location: str, message: str, hint: str = "") -> Diagnostic:
    return Diagnostic(code=code, location=location, message=message, hint=hint)


def warning(code: Code, location: str, message: str, hint: str = "") -> Diagnostic:
    return Diagnostic(
        code=code, severity=Severity.WARNING, location=location, message=message, hint=hint
    )


class Findings(list[Diagnostic]):
    """Every problem one step found: the one way problems travel in kvplan.

    A ``list`` of :class:`Diagnostic` (errors and warnings together, in the order found) with
    what every caller used to write by hand: :attr:`errors`, :attr:`warnings`,
    :meth:`raise_for_errors` (as httpx's ``raise_for_status``: raise only when something is
    wrong) and :meth:`render` (one paragraph per finding, "... Fix: ...").
    """

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self if d.is_error]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self if not d.is_error]

    @property
    def ok(self) -> bool:
        """No errors (warnings allowed)."""
        return not any(d.is_error for d in self)

    def raise_for_errors(self, *, strict: bool = False) -> None:
        """Raise :class:`KVPlanError` with every error; ``strict``: warnings count as errors
        (raised as errors, so the message and exit status say what failed)."""
        bad = self.as_errors() if strict else self.errors
        if bad:
            raise KVPlanError(bad)

    def as_errors(self) -> Findings:
        """Every finding, warnings promoted to errors (``--strict``, the plugin's strict mode)."""
        return Findings(
            d if d.is_error else d.model_copy(update={"severity": Severity.ERROR}) for d in self
        )

    def render(self) -> str:
        """Errors first, then warnings: one rendered paragraph a line."""
        return "\n".join(d.render() for d in sorted(self, key=lambda d: not d.is_error))


class KVPlanError(Exception):
    """Raised for bad input or a failed plan/apply; carries every diagnostic found."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic, *, led: bool = False) -> None:
        """``led``: the first diagnostic is a lead that already names the others (the
        plugin's refusals), so the message is that lead alone, not "N errors; first: ..."."""
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: Findings = Findings(diagnostics)
        self.led = led and bool(self.diagnostics)
        super().__init__(self._summary())

    def _summary(self) -> str:
        errors = self.diagnostics.errors or self.diagnostics
        if self.led or len(errors) == 1:
            return errors[0].render()
        head = f"{len(errors)} errors; first: {errors[0].render()}"
        return head

    @property
    def code(self) -> Code:
        return (self.diagnostics.errors or self.diagnostics)[0].code
