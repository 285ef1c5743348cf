"""A request an elastic engine can no longer serve finishes with vLLM's error status instead of
waiting forever (``_unservable``), on vLLM's real ``Scheduler`` (the installed release).

The engine whose group's accounting failed maps nothing new; here its limit is what it maps
(the null block), so no request can start. Whole engines (a lease replaced under a served
engine, the client sees the error): ``tests/engine/test_unservable``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from kvplan.integrations.vllm.elastic import ElasticMode, ElasticSettings, SchedulerSide
from kvplan.integrations.vllm.elastic import _unservable as unservable
from tests.elastic._calls import wrapped_call
from tests.elastic.test_failed_map import _request, _scheduler


def _step(scheduler: Any, side: SchedulerSide) -> dict[str, Any]:
    """One engine step through kvplan's ``schedule`` and ``update_from_output`` handlers,
    the model returning nothing (nothing was scheduled): the outputs by request id."""
    from vllm.v1.outputs import ModelRunnerOutput

    mode = ElasticMode(ElasticSettings(), backend="host-vmm")
    output = mode.schedule(None, wrapped_call(scheduler, "schedule"))  # type: ignore[arg-type]
    ids = list(output.num_scheduled_tokens)
    fields: dict[str, Any] = {"req_ids": ids, "sampled_token_ids": [[7] for _ in ids]}
    if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:  # up to vLLM 0.33
        fields["req_id_to_index"] = {r: i for i, r in enumerate(ids)}
    result = ModelRunnerOutput(**fields)
    outputs = mode.update_from_output(
        None, wrapped_call(scheduler, "update_from_output", output, result)
    )  # type: ignore[arg-type]
    return {o.request_id: o for batch in outputs.values() for o in batch.outputs}


def _starved(tmp_path: Any, *, failed_for: float | None) -> tuple[Any, SchedulerSide]:
    """A scheduler whose engine may map nothing beyond its null block, with one waiting
    request; ``failed_for``: the group's accounting failed that many seconds ago."""
    scheduler, side = _scheduler(tmp_path)
    side.limit = side.ledger.mapped_bytes
    side.dirty = True
    if failed_for is not None:
        side.group_failed = True
        side.group_failed_at = time.monotonic() - failed_for
    scheduler.add_request(_request("r", list(range(3, 43))))
    return scheduler, side


def test_a_request_that_cannot_start_under_a_failed_group_finishes_with_an_error(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from vllm.v1.engine import FinishReason

    scheduler, side = _starved(tmp_path, failed_for=unservable.GRACE_SECONDS + 0.5)
    with caplog.at_level(logging.ERROR, logger="vllm.kvplan"):
        outputs = _step(scheduler, side)
    assert outputs["r"].finish_reason == FinishReason.ERROR
    assert outputs["r"].new_token_ids == []
    assert not scheduler.has_unfinished_requests()  # nothing left to step: the loop idles
    assert side.unservable == 1
    assert "KVP534" in caplog.text and "request r (40 tokens)" in caplog.text
    assert _step(scheduler, side) == {}  # said once: the request is gone


@pytest.mark.parametrize("failed_for", [None, 0.1], ids=["group-fine", "within-grace"])
def test_a_request_waits_while_the_engine_may_still_map(tmp_path: Any, failed_for: Any) -> None:
    """A working group (a claim may still bring memory) or a failure younger than one more
    look at the group: the request waits, as vLLM's own out-of-blocks does."""
    scheduler, side = _starved(tmp_path, failed_for=failed_for)
    for _ in range(3):
        assert _step(scheduler, side) == {}
    assert scheduler.has_unfinished_requests() and side.unservable == 0


def test_only_the_head_the_scheduler_could_not_start_is_finished(tmp_path: Any) -> None:
    """vLLM's decision is the evidence: with a request running nothing is finished; each
    step finishes at most the head of the waiting queue."""
    scheduler, side = _starved(tmp_path, failed_for=unservable.GRACE_SECONDS + 0.5)
    scheduler.add_request(_request("s", list(range(50, 90))))
    first = _step(scheduler, side)
    assert list(first) == ["r"]
    second = _step(scheduler, side)
    assert list(second) == ["s"]
    assert not scheduler.has_unfinished_requests()


def test_a_replaced_lease_keeps_the_group_failed_and_the_grace_running(tmp_path: Any) -> None:
    """The engine looks at its group again every ``GROUP_RETRY_SECONDS``; with its lease
    still replaced that look fails too, so the failure's start stays where it was and the
    grace ends (a look that said "reached again" restarted the grace at every retry: the
    request waited 10-100 s instead of ~2)."""
    import os

    from kvplan.elastic.group import GroupMember, set_budget

    directory = tmp_path / "group"
    directory.mkdir()
    set_budget(directory, 64 << 20, create=True)
    _, side = _scheduler(tmp_path)
    side.group = GroupMember.join(directory, "a", floor=1 << 20, ceiling=64 << 20)
    other = side.group.lease_path.with_name("impostor")
    other.write_text("")
    os.replace(other, side.group.lease_path)
    assert not side.ask_group(side.group.effective_limit + (8 << 20))
    assert side.group_failed
    started = side.group_failed_at
    for _ in range(3):
        side.group_retry_at = 0.0  # the retry is due
        side.retry_group()
        assert side.group_failed and side.group_failed_at == started
