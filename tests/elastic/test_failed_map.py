"""A failed map becomes running out of blocks, on vLLM's real ``Scheduler`` (the installed
release): the requests that used the step's blocks are preempted with their output dropped,
what they wrote is evicted from the prefix cache, the others keep their tokens, and no new
memory is mapped for a while.

The worker half (rollback, ``MapFailed``) is in ``test_protocol``; whole engines (vLLM 0.32,
``KVPLAN_DEBUG_FAIL_MAP``) in ``tests/engine/test_elastic``.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvplan.elastic.ledger import Ledger
from kvplan.integrations.vllm import capture, elastic
from kvplan.integrations.vllm.elastic import ElasticMode, ElasticSettings, MapFailed, SchedulerSide
from kvplan.planner import build_plan
from kvplan.schemas.errors import Code, KVPlanError, error
from tests.elastic._calls import wrapped_call

BLOCK = 16
NUM_BLOCKS = 64
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(2)]


def _scheduler(tmp_path: Any) -> tuple[Any, SchedulerSide]:
    from vllm.config import ModelConfig

    from harness.engine._models import write_model

    model = ModelConfig(
        model=str(write_model("llama", tmp_path / "model")), skip_tokenizer_init=True,
        max_model_len=256, dtype="float32",
    )  # fmt: skip
    from kvplan.integrations.vllm.inspect._emulation import cuda_platform

    # vLLM 0.34's CPU platform refuses x86 without triton-cpu when the config is checked; the
    # scheduler and its block pool are the same whichever platform checked it.
    with cuda_platform():
        config = _config(model)
    config.cache_config.num_gpu_blocks = NUM_BLOCKS  # what the engine core sets after profiling
    return _with_scheduler(config, tmp_path)


def _config(model: Any) -> Any:
    from vllm.config import CacheConfig, DeviceConfig, SchedulerConfig, VllmConfig

    return VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=512,
            max_model_len=256,
            is_encoder_decoder=False,
        ),
        device_config=DeviceConfig(device="cpu"),
    )


def _with_scheduler(config: Any, tmp_path: Any) -> tuple[Any, SchedulerSide]:
    import torch
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float32)
    page = spec.page_size_bytes
    kv_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[
            KVCacheTensor(
                size=page * NUM_BLOCKS * len(LAYERS),
                layers=LAYERS,
                layer_stride=page * NUM_BLOCKS,
                block_stride=page,
            )
        ],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=LAYERS, kv_cache_spec=spec)],
        kv_cache_layout="LBNHC",
        hash_block_size=BLOCK,
    )
    scheduler = Scheduler(
        vllm_config=config, kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config), block_size=BLOCK,
        log_stats=False,
    )  # fmt: skip
    plan, _ = build_plan(capture(kv_config, shared_kv_cache_layers={}))
    assert plan is not None
    ledger = Ledger(plan, 4096)
    pool = scheduler.kv_cache_manager.block_pool
    side = SchedulerSide(ledger, ElasticSettings(cache_limit=1 << 30, reserve=0), pool, None)
    elastic.make_elastic(pool, side)
    return scheduler, side


def _request(request_id: str, prompt: list[int]) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    return Request(
        request_id, prompt, SamplingParams(max_tokens=16, ignore_eos=True), None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )  # fmt: skip


def _step(scheduler: Any, side: SchedulerSide) -> Any:
    """What the ``Scheduler.schedule`` handler does."""
    side.before_schedule()
    output = scheduler.schedule()
    ops = side.ops()
    setattr(output, elastic.OPS_ATTR, ops)
    return output


def _finish(
    scheduler: Any, side: SchedulerSide, output: Any, token: int, failed: MapFailed | None = None
) -> dict[str, list[int]]:
    """The model ran: every scheduled request samples ``token``; the new tokens delivered.
    ``failed``: the step's maps failed on rank 0, whose output carries the report."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    fields = {"req_ids": ids, "sampled_token_ids": [[token] for _ in ids]}
    if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:  # up to vLLM 0.33
        fields["req_id_to_index"] = {r: i for i, r in enumerate(ids)}
    result = ModelRunnerOutput(**fields)
    if failed is not None:
        result = elastic.with_report(result, elastic.MapFailureReport.of(failed, 0))
    call = wrapped_call(scheduler, "update_from_output", output, result)
    mode = ElasticMode(ElasticSettings(), backend="host-vmm")
    outputs = mode.update_from_output(None, call)  # type: ignore[arg-type]
    return {
        o.request_id: list(o.new_token_ids) for batch in outputs.values() for o in batch.outputs
    }


def _failed(output: Any) -> MapFailed:
    ops = getattr(output, elastic.OPS_ATTR)
    problem = KVPlanError(error(Code.DRIVER_CALL_FAILED, "pools.kv", "out of memory", "free some"))
    return MapFailed(ops.seq, ops.map, problem)


def test_the_requests_that_used_a_failed_steps_blocks_are_preempted_and_recomputed(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from vllm.v1.request import RequestStatus

    scheduler, side = _scheduler(tmp_path)
    pool = scheduler.kv_cache_manager.block_pool
    a = _request("a", list(range(100, 132)))  # two full blocks: its next token needs a third
    b = _request("b", list(range(200, 220)))  # 20 tokens: decodes inside its second block
    for r in (a, b):
        scheduler.add_request(r)
    assert _finish(scheduler, side, _step(scheduler, side), 7) == {"a": [7], "b": [7]}
    a_prompt_blocks = scheduler.kv_cache_manager.get_block_ids("a")[0][:2]
    assert all(pool.blocks[x].block_hash is not None for x in a_prompt_blocks)

    # the failed step: a grows into a new block; c (40 tokens, two full blocks hashed at
    # allocation) and d (c's first 32 tokens: a same-step prefix hit on c's blocks) arrive
    c = _request("c", list(range(300, 340)))
    d = _request("d", [*range(300, 332), 9, 9, 9])
    for r in (c, d):
        scheduler.add_request(r)
    failed_step = _step(scheduler, side)
    assert set(failed_step.num_scheduled_tokens) == {"a", "b", "c", "d"}
    c_blocks = scheduler.kv_cache_manager.get_block_ids("c")[0]
    assert scheduler.kv_cache_manager.get_block_ids("d")[0][:2] == c_blocks[:2]  # the hit
    mapped_before = side.ledger.mapped_bytes
    failed = _failed(failed_step)
    assert set(failed.blocks) >= {scheduler.kv_cache_manager.get_block_ids("a")[0][2]}
    with caplog.at_level("WARNING", logger="vllm.kvplan"):
        delivered = _finish(scheduler, side, failed_step, 666, failed)  # garbage from scratch

    # b used no new block: it keeps its token; a, c and d produced nothing and wait again
    assert delivered == {"b": [666]}
    assert [r.request_id for r in scheduler.running] == ["b"]
    for r in (a, c, d):
        assert r.status == RequestStatus.PREEMPTED and r.num_computed_tokens == 0
        assert list(r.output_token_ids) == ([7] if r is a else [])
    assert [r.request_id for r in scheduler.waiting] == ["a", "c", "d"]  # FCFS order kept
    # what the failed step wrote is out of the prefix cache; what a wrote before stays
    assert all(pool.blocks[x].block_hash is None for x in c_blocks)
    assert all(pool.blocks[x].block_hash is not None for x in a_prompt_blocks)
    # the ledger is the worker's after its rollback; no new memory for a while
    assert not set(failed.blocks) & side.ledger.backed
    assert side.ledger.mapped_bytes < mapped_before
    assert side.ceiling == side.ledger.mapped_bytes and side.recovered == 1
    assert side.tight() and side.headroom() == 0
    said = [r.getMessage() for r in caplog.records if "preempted and recomputed" in r.getMessage()]
    assert len(said) == 1 and "3 requests" in said[0] and "out of memory" in said[0]

    # once mapping resumes, a resumes from its own cached prompt (one token to compute: its
    # first output); c's blocks are recomputed in full, and d hits them again in that step
    side.retry_at = 0.0
    step = _step(scheduler, side)
    assert side.ceiling is None
    assert step.num_scheduled_tokens == {"b": 1, "a": 1, "c": 40, "d": 3}
    assert _finish(scheduler, side, step, 8) == {"a": [8], "b": [8], "c": [8], "d": [8]}


def test_a_failed_map_with_nothing_left_using_it_only_unbacks(tmp_path: Any) -> None:
    from vllm.v1.request import RequestStatus

    scheduler, side = _scheduler(tmp_path)
    scheduler.add_request(_request("a", list(range(100, 132))))
    step = _step(scheduler, side)
    failed = _failed(step)
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)  # aborted while it ran
    _finish(scheduler, side, step, 1, failed)
    assert not set(failed.blocks) & side.ledger.backed and side.recovered == 1
    assert not scheduler.running and not scheduler.waiting
