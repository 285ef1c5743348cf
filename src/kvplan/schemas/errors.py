"""Diagnostics with stable ``KVPnnn`` codes, and the exception that carries them."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


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
    OVERLAP_UNPROVEN = "KVP309"
    # execution (4xx)
    BACKEND_UNAVAILABLE = "KVP401"
    DRIVER_CALL_FAILED = "KVP402"
    VERIFY_MISMATCH = "KVP403"
    BLOCK_OUT_OF_RANGE = "KVP404"
    INTEGRATION = "KVP501"
    RANK_UNKNOWN = "KVP502"
    REVIEWED_PLAN_DIFFERS = "KVP503"
    REVIEWED_PLAN_MISSING = "KVP504"
    FIELD_NOT_IN_RELEASE = "KVP505"
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

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def render(self) -> str:
        """One paragraph: ``KVP201 error at model.layers.15: ... Fix: ...``."""
        where = f" at {self.location}" if self.location else ""
        text = f"{self.code.value} {self.severity.value}{where}: {self.message}"
        if self.hint:
            text += f" Fix: {self.hint}"
        return text


def error(code: Code, location: str, message: str, hint: str = "") -> Diagnostic:
    return Diagnostic(code=code, location=location, message=message, hint=hint)


def warning(code: Code, location: str, message: str, hint: str = "") -> Diagnostic:
    return Diagnostic(
        code=code, severity=Severity.WARNING, location=location, message=message, hint=hint
    )


class KVPlanError(Exception):
    """Raised for bad input or a failed plan/apply; carries every diagnostic found."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic) -> None:
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        super().__init__(self._summary())

    def _summary(self) -> str:
        errors = [d for d in self.diagnostics if d.is_error] or self.diagnostics
        if len(errors) == 1:
            return errors[0].render()
        head = f"{len(errors)} errors; first: {errors[0].render()}"
        return head

    @property
    def code(self) -> Code:
        errors = [d for d in self.diagnostics if d.is_error] or self.diagnostics
        return errors[0].code
