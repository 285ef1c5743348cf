"""Loading the documents commands take: a plan, or an input document planned on the fly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast, get_args

from kvplan.cli._output import report
from kvplan.planner import build_plan
from kvplan.schemas.errors import Code, Findings, KVPlanError, error, show_value
from kvplan.schemas.input import InputDocument
from kvplan.schemas.legacy import LegacyInputDocument, PoolLayout, Strategy
from kvplan.schemas.loading import load_any
from kvplan.schemas.plan import BindingPlan
from kvplan.units import MAX_OPTION_BYTES, human_bytes


@dataclass(frozen=True)
class LegacyOptions:
    """``kvplan plan``'s overrides of a legacy document's ``binding`` section (None: the
    document's own). Checked before anything is read (:meth:`check`)."""

    strategy: str | None = None
    pool_layout: str | None = None
    virtual_capacity: int | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.strategy, self.pool_layout, self.virtual_capacity))

    def check(self) -> None:
        """``KVP008`` for an unknown strategy or layout, ``KVP004``/``KVP405`` for a capacity
        that is not positive or above 1 PiB."""
        for flag, value, allowed in (
            ("--strategy", self.strategy, get_args(Strategy)),
            ("--pool-layout", self.pool_layout, get_args(PoolLayout)),
        ):
            if value is not None and value not in allowed:
                raise KVPlanError(
                    error(
                        Code.UNKNOWN_ENUM,
                        flag,
                        f"unknown value {value!r}; expected one of: {', '.join(allowed)}",
                    )
                )
        capacity = self.virtual_capacity
        if capacity is not None and capacity <= 0:
            raise KVPlanError(
                error(Code.SCHEMA, "--virtual-capacity", "must be a positive byte count")
            )
        if capacity is not None and capacity > MAX_OPTION_BYTES:
            raise KVPlanError(
                error(
                    Code.OPTION_OUT_OF_RANGE,
                    "--virtual-capacity",
                    f"{show_value(capacity)} bytes is more than kvplan accepts "
                    f"({human_bytes(MAX_OPTION_BYTES)}).",
                    "give the address space each pool reserves, e.g. 1099511627776",
                )
            )


def as_plan(
    obj: InputDocument | LegacyInputDocument | BindingPlan,
    legacy: LegacyOptions | None = None,
    *,
    source: str = "",
) -> BindingPlan:
    """A plan as it is, or the plan of an input document: errors raise, warnings print.

    ``legacy`` overrides apply to ``kvplan.input-legacy/1`` documents only (``KVP003`` for
    any other document read from ``source``).
    """
    legacy = legacy or LegacyOptions()
    findings: Findings
    if isinstance(obj, LegacyInputDocument):
        from kvplan.planner.legacy import build_legacy_plan

        result, findings = build_legacy_plan(
            obj,
            strategy=cast(Strategy | None, legacy.strategy),
            pool_layout=cast(PoolLayout | None, legacy.pool_layout),
            virtual_capacity_bytes=legacy.virtual_capacity,
        )
    elif legacy.given:
        raise KVPlanError(
            error(
                Code.WRONG_FORMAT,
                source,
                "--strategy, --pool-layout and --virtual-capacity apply to "
                "kvplan.input-legacy/1 documents only",
                "drop the options for a kvplan.input/1 document",
            )
        )
    elif isinstance(obj, BindingPlan):
        return obj
    else:
        result, findings = build_plan(obj)
    findings.raise_for_errors()
    report(findings)
    assert result is not None  # no errors: built
    return result


def load_document_as_plan(path: Path) -> BindingPlan:
    return as_plan(load_any(path))
