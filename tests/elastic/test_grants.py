"""The group budget's policy, pure: Σ grants ≤ budget, guarantees reachable without deadlock,
claims served before borrowing, effective limits never below guarantees — from any state."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.elastic import grants
from kvplan.elastic.grants import GroupState, MemberState, PolicyError

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def states(draw: Any) -> GroupState:
    """Any state the policy can be in: guarantees that fit, grants up to each ceiling (their
    sum may exceed the budget: a budget lowered below the grants), claims below guarantees."""
    count = draw(st.integers(1, 5))
    members = []
    for i in range(count):
        factor = draw(st.sampled_from([1, 1, 2, 4]))
        floor = draw(st.integers(0, 60))
        guarantee = floor + draw(st.integers(0, 60))
        ceiling = guarantee + draw(st.integers(0, 200))
        granted = draw(st.integers(0, ceiling))
        claim = draw(st.integers(0, max(0, guarantee - granted))) if granted < guarantee else 0
        members.append(
            MemberState(
                name=f"m{i}", factor=factor, floor=floor, guarantee=guarantee,
                ceiling=ceiling, granted=granted, claim=claim, claim_seq=i + 1 if claim else 0,
            )
        )  # fmt: skip
    guaranteed = sum(m.charged_guarantee() for m in members)
    granted = sum(m.charged() for m in members)
    budget = guaranteed + draw(st.integers(0, max(granted, 1) + 200))
    state = GroupState(budget=budget, revision=count + 1)
    state.members = {m.name: m for m in members}
    if draw(st.booleans()):
        grants.serve_claims(state)  # a state the file layer stores has served what it can
    return state


ops = st.lists(
    st.tuples(
        st.sampled_from(["request", "release", "budget", "guarantee", "leave", "join"]),
        st.integers(0, 4),
        st.integers(0, 400),
    ),
    max_size=25,
)


def apply(state: GroupState, op: str, who: int, value: int) -> None:
    names = sorted(state.members)
    if op == "join":
        name = f"j{value}"
        if name not in state.members:
            with contextlib.suppress(PolicyError):
                grants.join(state, MemberState(name, floor=value % 50, guarantee=value % 50,
                                               ceiling=value))  # fmt: skip
        return
    if not names:
        return
    name = names[who % len(names)]
    try:
        if op == "request":
            grants.request(state, name, value)
        elif op == "release":
            grants.release(state, name, value)
        elif op == "budget":
            grants.set_budget(state, value * 4)
        elif op == "guarantee":
            grants.set_guarantee(state, name, value % 120)
        elif op == "leave":
            grants.leave(state, name)
    except PolicyError:
        pass


def check_invariants(state: GroupState) -> None:
    assert state.guaranteed() <= state.budget
    assert not grants.check_state(state)
    limits = grants.effective_limits(state)
    shares = grants.owed(state)
    assert sum(shares.values()) >= grants.need(state) or not state.borrowed()
    for name, m in state.members.items():
        eff = limits[name]
        assert eff <= m.granted
        assert eff >= min(m.granted, m.guarantee)  # never below the guarantee
        assert shares.get(name, 0) <= m.borrowed()
    # free bytes never sit next to a claim they could serve
    for m in state.members.values():
        if m.claim:
            assert state.free() < m.factor


@SETTINGS
@given(states(), ops)
def test_grants_never_exceed_the_budget_and_limits_stay_above_guarantees(
    state: GroupState, sequence: list[tuple[str, int, int]]
) -> None:
    grants.serve_claims(state)
    for op, who, value in sequence:
        before = {n: m.granted for n, m in state.members.items()}
        over_before = state.granted() > state.budget
        apply(state, op, who, value)
        grew = any(m.granted > before.get(n, 0) for n, m in state.members.items())
        if grew:  # a grant grows only out of free bytes: the sum stays within the budget
            assert state.granted() <= state.budget
        elif over_before:  # after a lowered budget: nothing grows until it fits again
            assert not grew
        check_invariants(state)


@SETTINGS
@given(states(), ops)
def test_claims_are_served_before_anyone_borrows(
    state: GroupState, sequence: list[tuple[str, int, int]]
) -> None:
    grants.serve_claims(state)
    for op, who, value in sequence:
        before = {n: (m.granted, m.claim) for n, m in state.members.items()}
        apply(state, op, who, value)
        claims = any(m.claim for m in state.members.values())
        for n, m in state.members.items():
            granted, _ = before.get(n, (0, 0))
            if m.granted > granted and m.granted > m.guarantee and claims:
                # grew past its guarantee (borrowed) while someone still waits: only allowed
                # to a member that had no grant above its guarantee before and grew into it
                # from a claim of its own — which a claim never reaches
                raise AssertionError(f"{n} borrowed while a claim waits")


@SETTINGS
@given(states(), st.data())
def test_every_member_gets_its_guarantee_after_the_borrowers_give_back_once(
    state: GroupState, data: Any
) -> None:
    """No deadlock: members that ask for no more than their guarantee all get it, from any
    state, once every borrower has got under its effective limit once (in any order)."""
    grants.serve_claims(state)
    names = sorted(state.members)
    targets = {
        n: data.draw(st.integers(0, state.members[n].guarantee), label=f"target {n}") for n in names
    }
    for _ in range(2):  # round 1 claims, borrowers give back; round 2 everyone has it
        for n in data.draw(st.permutations(names), label="request order"):
            grants.request(state, n, targets[n])
            check_invariants(state)
        borrowers = [n for n in names if grants.owed(state).get(n)]
        for n in data.draw(st.permutations(borrowers), label="give-back order"):
            grants.release(state, n, grants.effective_limit(state, n))
            check_invariants(state)
    for n in names:
        assert state.members[n].granted >= targets[n], (n, targets[n], state)
    assert not any(m.claim for m in state.members.values())


@SETTINGS
@given(states())
def test_giving_back_never_raises_another_borrowers_share(state: GroupState) -> None:
    grants.serve_claims(state)
    shares = grants.owed(state)
    for name in sorted(shares):
        grants.release(state, name, grants.effective_limit(state, name))
        after = grants.owed(state)
        for other, share in after.items():
            assert share <= shares.get(other, 0), (other, share, shares)
    assert grants.need(state) == 0


def test_join_refuses_guarantees_that_do_not_fit_and_names_the_numbers() -> None:
    state = GroupState(budget=1000)
    grants.join(state, MemberState("a", floor=300, guarantee=600, ceiling=2000))
    with pytest.raises(PolicyError) as caught:
        grants.join(state, MemberState("b", factor=2, floor=100, guarantee=250, ceiling=900))
    assert caught.value.kind == "guarantees"
    assert "Σ guarantees 1100 bytes" in str(caught.value)
    assert "500 bytes (250 x factor 2)" in str(caught.value) and "budget 1000" in str(caught.value)
    with pytest.raises(PolicyError, match="below its floor"):
        grants.join(state, MemberState("c", floor=100, guarantee=50, ceiling=900))


def test_a_claim_takes_back_what_a_borrower_holds() -> None:
    state = GroupState(budget=1000)
    grants.join(state, MemberState("a", floor=100, guarantee=400, ceiling=1000))
    grants.join(state, MemberState("b", floor=100, guarantee=400, ceiling=1000))
    assert grants.request(state, "a", 900, want=900)  # a borrows b's unused guarantee
    assert not grants.request(state, "b", 300)  # b: 100 free now, 200 claimed
    assert (state.members["b"].granted, state.members["b"].claim) == (100, 200)
    assert not grants.request(state, "a", 950)  # no borrowing while b claims
    assert grants.owed(state) == {"a": 200}
    assert grants.effective_limit(state, "a") == 700
    grants.release(state, "a", 700)
    assert (state.members["b"].granted, state.members["b"].claim) == (300, 0)
    assert grants.effective_limit(state, "a") == 700


def test_a_lowered_budget_makes_borrowers_give_back_and_nothing_grows_meanwhile() -> None:
    state = GroupState(budget=1000)
    grants.join(state, MemberState("a", floor=100, guarantee=200, ceiling=1000))
    grants.join(state, MemberState("b", floor=100, guarantee=200, ceiling=1000))
    grants.request(state, "a", 600, want=600)
    grants.request(state, "b", 300, want=300)
    with pytest.raises(PolicyError, match="below Σ guarantees 400"):
        grants.set_budget(state, 399)
    grants.set_budget(state, 500)
    assert grants.need(state) == 400
    # a borrows 400, b 100: both down to a common level of 50 borrowed
    assert grants.owed(state) == {"a": 350, "b": 50}
    assert grants.effective_limit(state, "a") == 250
    assert not grants.request(state, "b", 301)
    grants.release(state, "a", grants.effective_limit(state, "a"))
    assert grants.owed(state) == {"b": 50}
    grants.release(state, "b", grants.effective_limit(state, "b"))
    assert state.granted() == 500 and not grants.need(state)


def test_the_charge_factor_multiplies_what_a_member_costs() -> None:
    state = GroupState(budget=1000)
    grants.join(state, MemberState("tp4", factor=4, floor=50, guarantee=100, ceiling=1000))
    assert grants.request(state, "tp4", 200, want=200)
    assert state.granted() == 800 and state.free() == 200
    assert not grants.request(state, "tp4", 251)
    assert grants.request(state, "tp4", 250)  # exactly the rest: 4 x 250 = 1000
