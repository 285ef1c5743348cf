"""The policy of a group budget: who may map how many bytes, pure (no files, no processes).

Several engines (members) draw from one physical **budget**. This module decides; the file
layer (:mod:`kvplan.elastic.group`) runs every decision inside one exclusive lock and
persists the result. All figures are integers; a member's own figures (``floor``,
``guarantee``, ``ceiling``, ``granted``, ``claim``) are in *its* bytes — what one of its
ranks maps — and the group charges them ``× factor`` (the ranks whose memory the group's
memory holds: all of a TP engine's ranks on host memory, one per device on a GPU group).

* **Grants.** A member maps at most its grant. A grant grows only from the free bytes
  (``budget − Σ charged grants``), inside the lock, so ``Σ charged grants ≤ budget`` holds
  after every operation that grows one (after a budget lowered below the grants, no grant
  grows until the sum is back under it).
* **Guarantees.** ``Σ charged guarantees ≤ budget`` always (refused otherwise). A member may
  grow up to its guarantee whenever bytes are free and, past it, *borrow* what nobody else
  uses — including others' unused guarantees — while nobody claims.
* **Claims.** A member below its guarantee that needs bytes nobody has free takes what is
  free (up to its guarantee) and records a claim for the rest. Free bytes go to claims first
  (oldest claim first), before any member may borrow. Borrowers give back what the claims
  (and a budget lowered below the grants) need, the biggest borrowers first down to a common
  level (:func:`owed`); a borrower's :func:`effective_limit` (grant minus its share) is
  never below its guarantee.
* **No deadlock.** The need is at most what is borrowed (the guarantees fit the budget), the
  shares sum to at least the need, and one borrower giving back never raises another's
  share; so once every borrower has got under its effective limit once, every claim is
  served, and a member that asks for no more than its guarantee has it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

QUANTUM_SHARE = 64
"""A grant grows by at least ``budget / QUANTUM_SHARE`` (charged) at a time: coarse grants
keep most engine steps free of group I/O."""


@dataclass
class MemberState:
    """One member's figures, in the member's own bytes (charged ``× factor``)."""

    name: str
    factor: int = 1
    floor: int = 0
    """The least it can run with (null block plus one longest request); ``guarantee >= floor``."""
    guarantee: int = 0
    ceiling: int = 0
    """The most it could ever map (its whole reservation): no grant exceeds it."""
    granted: int = 0
    claim: int = 0
    """Bytes it waits for below its guarantee (0: none)."""
    claim_seq: int = 0
    """The group revision at which the claim was made (older claims are served first)."""
    # what the file layer keeps about the member (not used by the policy)
    lease: str = ""
    lease_inode: int = 0
    pid: int = 0
    joined_at: float = 0.0

    def charged(self) -> int:
        return self.granted * self.factor

    def charged_guarantee(self) -> int:
        return self.guarantee * self.factor

    def borrowed(self) -> int:
        """Charged bytes granted above its guarantee."""
        return max(0, self.granted - self.guarantee) * self.factor


@dataclass
class GroupState:
    budget: int
    revision: int = 0
    members: dict[str, MemberState] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    """Guarantees an operator set (``kvplan limit --group DIR --member NAME SIZE``), by
    member name: a member that joins under that name gets it (within its floor and ceiling)
    until it is changed or cleared, whether or not that member is live now."""

    # -- sums (charged bytes) ------------------------------------------------------------
    def granted(self) -> int:
        return sum(m.charged() for m in self.members.values())

    def guaranteed(self) -> int:
        return sum(m.charged_guarantee() for m in self.members.values())

    def claimed(self) -> int:
        return sum(m.claim * m.factor for m in self.members.values())

    def borrowed(self) -> int:
        return sum(m.borrowed() for m in self.members.values())

    def free(self) -> int:
        """Charged bytes no member holds (negative after a budget lowered below the grants)."""
        return self.budget - self.granted()

    def quantum(self, member: MemberState) -> int:
        """The smallest growth of ``member``'s grant, in its bytes."""
        return max(1, self.budget // QUANTUM_SHARE // member.factor)


class PolicyError(ValueError):
    """A change the policy refuses; ``kind`` names which rule (the file layer codes it)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# -- claims and what borrowers owe ---------------------------------------------------------


def serve_claims(state: GroupState) -> list[str]:
    """Give free bytes to claims, oldest first; the members whose grants grew."""
    grew = []
    for m in sorted(
        (m for m in state.members.values() if m.claim > 0), key=lambda m: (m.claim_seq, m.name)
    ):
        take = min(m.claim, max(0, state.free()) // m.factor)
        if take > 0:
            m.granted += take
            m.claim -= take
            grew.append(m.name)
        if m.claim == 0:
            m.claim_seq = 0
    return grew


def need(state: GroupState) -> int:
    """Charged bytes borrowers must give back: what claims wait for beyond the free bytes,
    plus what the grants exceed the budget by."""
    return max(0, state.granted() + state.claimed() - state.budget)


def owed(state: GroupState) -> dict[str, int]:
    """What each borrower must give back (charged bytes): the biggest borrowers first, down
    to one common level of borrowing, so that together they give back :func:`need`.

    The level is the highest ``λ`` with ``Σ max(0, borrowed − λ) >= need``; a member owes
    ``max(0, borrowed − λ)``, never more than it borrows. The level is stable: a borrower
    that gives its share back (or more) never raises another's share, so one pass of every
    borrower getting under its :func:`effective_limit` serves every claim. Empty when
    nothing is owed.
    """
    total = need(state)
    if total <= 0:
        return {}
    lent = sorted(
        ((m.borrowed(), name) for name, m in state.members.items() if m.borrowed() > 0),
        reverse=True,
    )
    if not lent:
        return {}
    level = 0
    running = 0
    for k, (b, _) in enumerate(lent, 1):
        running += b
        nxt = lent[k][0] if k < len(lent) else 0
        level = (running - total) // k
        if level >= nxt:
            break
    return {name: min(b, b - level) for b, name in lent if b > level}


def effective_limit(state: GroupState, name: str, shares: dict[str, int] | None = None) -> int:
    """What member ``name`` must get under (its bytes): its grant less its owed share, never
    below its guarantee (and never above its grant)."""
    m = state.members[name]
    share = (owed(state) if shares is None else shares).get(name, 0)
    if share <= 0:
        return m.granted
    return max(min(m.granted, m.guarantee), m.granted - -(-share // m.factor))


def effective_limits(state: GroupState) -> dict[str, int]:
    shares = owed(state)
    return {name: effective_limit(state, name, shares) for name in state.members}


# -- operations ----------------------------------------------------------------------------


def _bump(state: GroupState) -> None:
    state.revision += 1


def check_member(state: GroupState, m: MemberState) -> None:
    """The rules one member's figures obey on their own (``PolicyError`` ``value``)."""
    if m.factor < 1:
        raise PolicyError("value", f"the charge factor must be at least 1 (got {m.factor})")
    if min(m.floor, m.guarantee, m.ceiling, m.granted, m.claim) < 0:
        raise PolicyError("value", "byte counts must be >= 0")
    if m.guarantee < m.floor:
        raise PolicyError(
            "value",
            f"the guarantee of {m.name} ({m.guarantee} bytes) is below its floor "
            f"({m.floor} bytes: the null block plus one longest request)",
        )
    if m.guarantee > m.ceiling:
        raise PolicyError(
            "value",
            f"the guarantee of {m.name} ({m.guarantee} bytes) is above what it can ever map "
            f"({m.ceiling} bytes)",
        )


def join(state: GroupState, member: MemberState) -> None:
    """Add ``member`` (no grant yet). ``PolicyError`` ``guarantees`` when the guarantees
    would not fit the budget, ``name`` when the name is taken."""
    check_member(state, member)
    if member.name in state.members:
        raise PolicyError("name", f"a live member is already named {member.name}")
    total = state.guaranteed() + member.charged_guarantee()
    if total > state.budget:
        raise PolicyError(
            "guarantees",
            f"the guarantees would not fit the budget: Σ guarantees {total} bytes with this "
            f"member's {member.charged_guarantee()} bytes ({member.guarantee} x factor "
            f"{member.factor}), budget {state.budget} bytes",
        )
    member.granted = 0
    member.claim = 0
    member.claim_seq = 0
    state.members[member.name] = member
    _bump(state)


def leave(state: GroupState, name: str) -> None:
    """Remove member ``name`` (left or dead): its grant and claim return to the group."""
    if state.members.pop(name, None) is not None:
        serve_claims(state)
        _bump(state)


def request(state: GroupState, name: str, need_bytes: int, want: int | None = None) -> bool:
    """Grow ``name``'s grant to at least ``need_bytes`` (its bytes), by at least a quantum.

    Grows to ``want`` (default: ``need_bytes`` or a quantum above the grant, whichever is
    more), capped by the free bytes and the member's ceiling, when that reaches
    ``need_bytes``. Past its guarantee a member only grows while nobody claims. When
    ``need_bytes`` cannot be reached the member takes what it may now (the free bytes; past
    its guarantee only while nobody claims) and, below its guarantee, claims the rest up to
    ``min(need_bytes, guarantee)``: the claim is the need, whatever was free. True when the
    grant reaches ``need_bytes``.
    """
    m = state.members[name]
    if need_bytes <= m.granted:
        return True
    before = (m.granted, m.claim)
    served = bool(serve_claims(state))
    ok = _grow(state, m, need_bytes, want)
    if served or (m.granted, m.claim) != before:
        _bump(state)
    return ok


def _grow(state: GroupState, m: MemberState, need_bytes: int, want: int | None) -> bool:
    if need_bytes <= m.granted:  # its own claim was just served
        return True
    if want is None:
        want = max(need_bytes, m.granted + state.quantum(m))
    want = min(max(want, need_bytes), m.ceiling)
    others_claim = any(o.claim > 0 for o in state.members.values() if o is not m)
    cap = m.granted + max(0, state.free()) // m.factor
    if others_claim:
        cap = min(cap, max(m.granted, m.guarantee))
    cap = min(cap, m.ceiling)
    if min(want, cap) >= need_bytes:
        m.granted = min(want, cap)
        m.claim, m.claim_seq = 0, 0
        return True
    # the need cannot be met now: take what may be taken (what is free, past the guarantee
    # only while nobody claims), and claim the rest of the need below the guarantee
    m.granted = max(m.granted, cap)
    if m.granted < m.guarantee or m.claim:
        claim = max(0, min(need_bytes, m.guarantee) - m.granted)
        if claim and not m.claim:
            m.claim_seq = state.revision + 1
        m.claim = claim
        if not claim:
            m.claim_seq = 0
    return m.granted >= need_bytes


def release(state: GroupState, name: str, to: int) -> int:
    """Shrink ``name``'s grant to ``to`` bytes (never grows it) and drop its claim; freed
    bytes go to the claims. The bytes given back (the member's bytes)."""
    m = state.members[name]
    target = max(0, min(m.granted, to))
    freed = m.granted - target
    changed = freed > 0 or m.claim > 0
    m.granted = target
    m.claim, m.claim_seq = 0, 0
    if changed:
        serve_claims(state)
        _bump(state)
    return freed


def set_budget(state: GroupState, budget: int) -> None:
    """A new budget. ``PolicyError`` ``guarantees`` below the sum of the guarantees; below
    the grants, borrowers owe the difference (see :func:`owed`)."""
    if budget < 0:
        raise PolicyError("value", f"the budget must be >= 0 (got {budget})")
    if budget < state.guaranteed():
        raise PolicyError(
            "guarantees",
            f"the budget {budget} bytes is below Σ guarantees {state.guaranteed()} bytes",
        )
    state.budget = budget
    serve_claims(state)
    _bump(state)


def set_guarantee(state: GroupState, name: str, guarantee: int) -> None:
    """A new guarantee for member ``name`` (``PolicyError`` when it breaks a rule)."""
    m = state.members[name]
    trial = MemberState(
        name=m.name, factor=m.factor, floor=m.floor, guarantee=guarantee, ceiling=m.ceiling
    )
    check_member(state, trial)
    total = state.guaranteed() - m.charged_guarantee() + trial.charged_guarantee()
    if total > state.budget:
        raise PolicyError(
            "guarantees",
            f"the guarantees would not fit the budget: Σ guarantees {total} bytes with "
            f"{name}'s {trial.charged_guarantee()} bytes, budget {state.budget} bytes",
        )
    m.guarantee = guarantee
    m.claim = min(m.claim, max(0, guarantee - m.granted))
    if not m.claim:
        m.claim_seq = 0
    serve_claims(state)
    _bump(state)


def check_state(state: GroupState) -> list[str]:
    """Every rule a stored group breaks (empty: a consistent group)."""
    problems = []
    if state.guaranteed() > state.budget:
        problems.append(
            f"Σ guarantees {state.guaranteed()} bytes exceed the budget {state.budget} bytes"
        )
    for m in state.members.values():
        try:
            check_member(state, m)
        except PolicyError as exc:
            problems.append(str(exc))
        if m.granted > m.ceiling:
            problems.append(f"{m.name} is granted more than its ceiling")
        if m.claim and m.granted + m.claim > m.guarantee:
            problems.append(f"{m.name} claims past its guarantee")
    return problems
