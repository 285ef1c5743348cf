"""``Call.argument`` reads one parameter of a wrapped call where the caller passed it (the
per-step handlers read a few, and binding every parameter costs microseconds a call), and
says what ``Call.arguments`` says for every way a parameter can be passed: positionally, by
keyword, left to its default, after a ``*args``, keyword-only."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from kvplan.integrations.vllm.pipeline import Call, positions_of


def execute_model(self: Any, scheduler_output: Any, intermediate_tensors: Any = None) -> None:
    pass


def varargs(first: Any, *rest: Any, flag: bool = False, **extra: Any) -> None:
    pass


def positional_only(a: Any, b: Any = 2, /, c: Any = 3) -> None:
    pass


def call_of(fn: Any, *args: Any, **kwargs: Any) -> Call:
    sig = inspect.signature(fn)
    return Call(fn, sig, None, args, kwargs, positions_of(sig))  # type: ignore[arg-type]


CASES = [
    (execute_model, ("w", "so"), {}),
    (execute_model, ("w",), {"scheduler_output": "so"}),
    (execute_model, (), {"self": "w", "scheduler_output": "so", "intermediate_tensors": 5}),
    (execute_model, ("w", "so", 7), {}),
    (varargs, (1, 2, 3), {"flag": True, "other": 4}),
    (varargs, (1,), {}),
    (positional_only, (1,), {"c": 9}),
    (positional_only, (1, 5, 6), {}),
]


@pytest.mark.parametrize(("fn", "args", "kwargs"), CASES)
def test_each_argument_is_what_binding_them_all_says(fn: Any, args: Any, kwargs: Any) -> None:
    call = call_of(fn, *args, **kwargs)
    bound = call_of(fn, *args, **kwargs).arguments
    for name in inspect.signature(fn).parameters:
        assert call.argument(name) == bound[name], name


def test_positions_stop_at_the_first_parameter_that_is_not_positional() -> None:
    assert positions_of(inspect.signature(varargs)) == {"first": 0}
    assert positions_of(inspect.signature(positional_only)) == {"a": 0, "b": 1, "c": 2}


def test_an_argument_passed_where_it_is_read_binds_nothing() -> None:
    call = call_of(execute_model, "w", scheduler_output="so")
    assert (call.argument("self"), call.argument("scheduler_output")) == ("w", "so")
    assert call._arguments is None  # the binding was never made
    assert call.argument("intermediate_tensors") is None  # a default: bound once
    assert call._arguments is not None and call.arguments is call._arguments


def test_a_call_without_positions_still_answers() -> None:
    sig = inspect.signature(execute_model)
    call = Call(execute_model, sig, None, ("w", "so"), {})  # type: ignore[arg-type]
    assert call.argument("scheduler_output") == "so"
