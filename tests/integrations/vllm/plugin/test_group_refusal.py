"""A group member the group cannot take is refused as the plugin registers — before vLLM
loads a model — with the join's own ``KVP542`` (led by ``KVP501``), and nothing patched; an
engine on several nodes (``KVP548``) before its executor starts a worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.elastic.group import GroupMember, set_budget
from kvplan.integrations.vllm import plugin
from kvplan.integrations.vllm.pipeline.announce import HEADING, RULE, text_of
from kvplan.schemas.errors import Code, KVPlanError
from tests.integrations.vllm.plugin.conftest import LoadPlugin

MiB = 1 << 20


def test_a_guarantee_that_cannot_fit_refuses_at_registration(
    load_plugin: LoadPlugin,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    group = tmp_path / "group"
    group.mkdir()
    set_budget(group, 8 * MiB, create=True)
    members = [GroupMember.join(group, n, floor=MiB, ceiling=8 * MiB, guarantee=4 * MiB)
               for n in ("a", "b")]  # fmt: skip
    try:
        with pytest.raises(KVPlanError) as late:
            GroupMember.join(group, "third", floor=MiB, ceiling=8 * MiB, guarantee=MiB)
        monkeypatch.setenv("KVPLAN_GROUP", str(group))
        monkeypatch.setenv("KVPLAN_ENGINE_NAME", "third")
        monkeypatch.setenv("KVPLAN_GROUP_GUARANTEE", str(MiB))
        with pytest.raises(KVPlanError) as early:
            load_plugin("host-vmm", mode="elastic")
        codes = [d.code for d in early.value.diagnostics]
        assert codes == [Code.INTEGRATION, Code.GROUP_GUARANTEES_EXCEED_BUDGET]
        assert early.value.diagnostics[1].render() == late.value.diagnostics[0].render()
        assert not plugin.is_active()
        # logged once, as a block of its own, before anything vLLM prints of the error
        block = f"{HEADING}\n{RULE}\n{text_of(early.value)}\n{RULE}"
        assert caplog.text.count(HEADING) == 1 and block in caplog.text
        with pytest.raises(KVPlanError):
            load_plugin("host-vmm", mode="elastic")  # the same refusal again: not logged again
        assert caplog.text.count(HEADING) == 1
        members[1].leave()
        monkeypatch.setenv("KVPLAN_GROUP_GUARANTEE", str(4 * MiB))
        load_plugin("host-vmm", mode="elastic")
        assert plugin.is_active()
    finally:
        for member in members:
            member.leave()


@pytest.mark.parametrize("nnodes", [2, 4])
def test_an_engine_on_several_nodes_cannot_join_a_group(tmp_path: Path, nnodes: int) -> None:
    """``KVP548``: a group is one host's memory; vLLM's ``parallel_config.nnodes`` says how
    many nodes the engine's ranks run on (the two-node engine: ``tests/engine/test_multinode``)."""
    from types import SimpleNamespace

    from kvplan.integrations.vllm.elastic import ElasticSettings
    from kvplan.integrations.vllm.elastic._group import check_one_host, nodes_of

    config = SimpleNamespace(parallel_config=SimpleNamespace(nnodes=nnodes))
    settings = ElasticSettings(group=tmp_path / "group")
    with pytest.raises(KVPlanError) as refused:
        check_one_host(settings, nodes_of(config))
    (diagnostic,) = refused.value.diagnostics
    assert diagnostic.code == Code.GROUP_SPANS_NODES
    assert f"{nnodes} nodes" in diagnostic.message and "KVPLAN_GROUP" in diagnostic.hint
    check_one_host(settings, nodes_of(SimpleNamespace(parallel_config=SimpleNamespace())))
    check_one_host(ElasticSettings(), nnodes)  # no group: nothing to refuse
    assert not (tmp_path / "group").exists()


def test_the_executor_of_an_engine_on_two_nodes_starts_no_worker_in_a_group(
    load_plugin: LoadPlugin, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vLLM's own ``Executor.__init__``, wrapped: with ``KVPLAN_GROUP`` and two nodes it
    refuses before ``_init_executor`` (which starts the workers); on one node it goes on."""
    from types import SimpleNamespace

    from vllm.v1.executor.abstract import Executor

    group = tmp_path / "group"
    group.mkdir()
    set_budget(group, 8 * MiB, create=True)
    monkeypatch.setenv("KVPLAN_GROUP", str(group))
    monkeypatch.setenv("KVPLAN_ENGINE_NAME", "two-nodes")
    started: list[int] = []

    class Recording(Executor):
        def _init_executor(self) -> None:
            started.append(self.parallel_config.nnodes)

        def collective_rpc(self, *args: object, **kwargs: object) -> list[object]:
            return []

        def check_health(self) -> None:
            return None

    def config(nnodes: int) -> object:
        fields = ("model", "cache", "lora", "load", "scheduler", "device", "speculative")
        return SimpleNamespace(
            parallel_config=SimpleNamespace(nnodes=nnodes),
            observability_config=None,
            **{f"{name}_config": None for name in fields},
        )

    load_plugin("host-vmm", mode="elastic")
    with pytest.raises(KVPlanError) as refused:
        Recording(config(2))  # type: ignore[arg-type]
    assert [d.code for d in refused.value.diagnostics] == [
        Code.INTEGRATION,
        Code.GROUP_SPANS_NODES,
    ]
    assert started == []  # no worker was started
    Recording(config(1))  # type: ignore[arg-type]
    assert started == [1]
