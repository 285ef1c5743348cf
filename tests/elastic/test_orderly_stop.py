"""An elastic engine's orderly stop, the parts that need no engine: a stop signal that arrives
while the engine core leaves its group waits for the leave (then does what it did), and what
the API server waits for before vLLM kills the core (``_group.stopped_in_order``). The whole
stop, with real OpenAI servers: ``tests/engine/test_metrics.py``."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from harness._stats import make_stats
from kvplan.elastic.files import write_stats
from kvplan.elastic.group import GroupMember, set_budget
from kvplan.integrations.vllm.elastic import ElasticSettings
from kvplan.integrations.vllm.elastic._group import signals_deferred, stopped_in_order


def test_a_stop_signal_waits_for_the_leave_then_does_what_it_did() -> None:
    seen: list[int] = []

    def before(signum: int, frame: Any) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, before)
    try:
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)  # vLLM's second signal, mid-leave
            time.sleep(0.05)
            assert seen == []  # held: the leave goes on
        deadline = time.monotonic() + 2
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [signal.SIGTERM]  # delivered again, to the handler before
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_api_server_waits_for_closed_snapshots_and_the_leave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group, dump = tmp_path / "group", tmp_path / "dumps" / "llama"
    dump.mkdir(parents=True)
    set_budget(group, 64 << 20, create=True)
    monkeypatch.setenv("KVPLAN_ENGINE_NAME", "llama")
    settings = ElasticSettings(group=group)
    member = GroupMember.join(group, "llama", floor=1 << 20, ceiling=32 << 20)
    write_stats(dump, make_stats(time=time.time(), state="running"))
    assert not stopped_in_order(settings, dump)
    write_stats(dump, make_stats(time=time.time(), state="closed"))
    assert not stopped_in_order(settings, dump)  # closed, but still a member
    member.leave()
    assert stopped_in_order(settings, dump)
    write_stats(dump, make_stats(time=time.time(), rank=1, state="running"))
    assert not stopped_in_order(settings, dump)  # every rank's snapshot
