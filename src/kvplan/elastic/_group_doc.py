"""The group ledger as a document (its fields and bounds) and the group's constants; the
files that hold it are :mod:`kvplan.elastic._group_files`. No torch, no vLLM."""

from __future__ import annotations

import re
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvplan.elastic.grants import GroupState, MemberState
from kvplan.schemas.errors import Code, KVPlanError, error, printable, show_value

LEDGER_KIND: Final = "kvplan-group-ledger"
SNAPSHOT_KIND: Final = "kvplan-group-snapshot"
LEDGER_FILE = "ledger.json"
LOCK_FILE = "group.lock"
MEMBERS_DIR = "members"
LEASE_SUFFIX = ".lease"

MAX_LEDGER_BYTES = 1 << 20
"""Largest ledger read (1 MiB; a full one of 64 members is about 40 KiB)."""
MAX_MEMBERS = 64
MAX_KEPT = 256
"""Most guarantees kept by member name (members come and go; a cleared one is removed)."""
MAX_BYTES = 1 << 60
"""Largest byte count a ledger holds (1 EiB)."""
MAX_FACTOR = 4096
MAX_REVISION = 1 << 62
"""Largest ``revision`` (and ``claim_seq``) a ledger holds; the next one after it is 0."""
MAX_SCAN = 4096
"""Most entries looked at when cleaning ``members/`` and the group directory."""
LOCK_TIMEOUT = 5.0
"""Seconds a member waits for the group's lock before ``KVP540``."""
TICK_SECONDS = 0.25
"""How often :meth:`GroupMember.tick` looks at the ledger (the engine calls it every step)."""
HOLD_SECONDS = 1.0
"""A grant that just grew is not shrunk voluntarily for this long (hysteresis in time)."""

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$"
_LEASE = r"^[0-9a-f]{32}$"
_TEMP_PREFIX = f".{LEDGER_FILE}."


def fail(code: Code, where: object, message: str, hint: str = "") -> KVPlanError:
    return KVPlanError(error(code, printable(str(where)), message, hint))


def check_range(
    where: object, what: str, value: int, high: int, *, low: int = 0, unit: str = "", hint: str
) -> None:
    """``KVP547`` (a bad request) unless ``value`` is an ``int`` with ``low <= value <= high``."""
    if type(value) is not int or not low <= value <= high:
        raise fail(
            Code.GROUP_BAD_REQUEST,
            where,
            f"the {what} must be {low} to {high}{unit} (got {show_value(value)}).",
            hint,
        )


def check_bytes(where: object, what: str, value: int) -> None:
    """``KVP547`` unless ``value`` is a byte count the ledger can hold (0 to ``MAX_BYTES``)."""
    check_range(where, what, value, MAX_BYTES, unit=" bytes", hint="pass a byte count")


# -- documents --------------------------------------------------------------------------------


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)


class MemberRecord(_Document):
    """One member as the ledger keeps it (its bytes; the group charges ``× factor``)."""

    name: str = Field(pattern=_NAME)
    lease: str = Field(pattern=_LEASE, description="members/<lease>.lease")
    lease_inode: int = Field(ge=0, le=(1 << 63) - 1, description="the lease file's inode")
    pid: int = Field(ge=0, le=1 << 32, description="the process that joined (informational)")
    factor: int = Field(ge=1, le=MAX_FACTOR)
    floor_bytes: int = Field(ge=0, le=MAX_BYTES)
    guarantee_bytes: int = Field(ge=0, le=MAX_BYTES)
    ceiling_bytes: int = Field(ge=0, le=MAX_BYTES)
    granted_bytes: int = Field(ge=0, le=MAX_BYTES)
    claim_bytes: int = Field(ge=0, le=MAX_BYTES)
    claim_seq: int = Field(ge=0, le=MAX_REVISION)
    joined_at: float = Field(ge=0)


class GroupLedger(_Document):
    """``ledger.json``: the group's budget and members."""

    kind: Literal["kvplan-group-ledger"] = LEDGER_KIND
    version: Literal[1] = 1
    budget_bytes: int = Field(ge=0, le=MAX_BYTES)
    revision: int = Field(ge=0, le=MAX_REVISION)
    members: list[MemberRecord] = Field(max_length=MAX_MEMBERS)
    kept_guarantees: dict[str, int] = Field(default_factory=dict, max_length=MAX_KEPT)
    """Guarantees set by an operator, by member name, kept across the member's restarts
    (absent in ledgers written before they were kept: none)."""

    @field_validator("kept_guarantees")
    @classmethod
    def _kept_bounds(cls, value: dict[str, int]) -> dict[str, int]:
        for name, size in value.items():
            if not re.fullmatch(_NAME, name):
                raise ValueError(f"a kept guarantee names no valid member ({name[:40]!r})")
            if not 0 <= size <= MAX_BYTES:
                raise ValueError(f"a kept guarantee must be 0 to {MAX_BYTES} bytes")
        return value


def to_state(ledger: GroupLedger) -> GroupState:
    state = GroupState(
        budget=ledger.budget_bytes,
        revision=ledger.revision,
        kept=dict(ledger.kept_guarantees),
    )
    for r in ledger.members:
        state.members[r.name] = MemberState(
            name=r.name,
            factor=r.factor,
            floor=r.floor_bytes,
            guarantee=r.guarantee_bytes,
            ceiling=r.ceiling_bytes,
            granted=r.granted_bytes,
            claim=r.claim_bytes,
            claim_seq=r.claim_seq,
            lease=r.lease,
            lease_inode=r.lease_inode,
            pid=r.pid,
            joined_at=r.joined_at,
        )
    return state


def _wrap(n: int) -> int:
    """A revision or claim sequence past :data:`MAX_REVISION` starts again at 0 (every value
    the reader accepts can be written back one higher)."""
    return n % (MAX_REVISION + 1) if type(n) is int and n >= 0 else n


def to_ledger(state: GroupState) -> GroupLedger:
    """The ledger of ``state``; ``KVP547`` (never a raw validation error) for a value a
    ledger cannot hold."""
    try:
        return _to_ledger(state)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "?"
        raise fail(
            Code.GROUP_BAD_REQUEST,
            "group",
            f"the group cannot record {where}: {first.get('msg', 'a bad value')}.",
            "pass integers within the documented bounds",
        ) from None


def _to_ledger(state: GroupState) -> GroupLedger:
    return GroupLedger(
        budget_bytes=state.budget,
        revision=_wrap(state.revision),
        members=[
            MemberRecord(
                name=m.name,
                lease=m.lease,
                lease_inode=m.lease_inode,
                pid=m.pid,
                factor=m.factor,
                floor_bytes=m.floor,
                guarantee_bytes=m.guarantee,
                ceiling_bytes=m.ceiling,
                granted_bytes=m.granted,
                claim_bytes=m.claim,
                claim_seq=_wrap(m.claim_seq),
                joined_at=m.joined_at,
            )
            for m in sorted(state.members.values(), key=lambda m: m.name)
        ],
        kept_guarantees=dict(sorted(state.kept.items())),
    )
