"""Call vLLM's real KV-cache code the way its runners do, with stand-ins for GPU-only state.

Only the runner object is a stand-in (``object.__new__`` plus the attributes the method
reads); ``allocate_kv_cache``, the runners' methods, the alias loops, ``bind_kv_cache`` and
the layers' ``bind_kv_cache`` are vLLM's own. Every call goes through the module global or
class attribute vLLM itself uses, so it runs kvplan's wrapper exactly when vLLM would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from tests.integrations.vllm.plugin._models import ModelCase

CPU = torch.device("cpu")


def v1_runner(case: ModelCase) -> Any:
    """A V1 ``GPUModelRunner`` with only what ``initialize_kv_cache_tensors`` reads."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    vc = case.vllm_config
    runner = object.__new__(GPUModelRunner)
    runner.vllm_config = vc
    runner.device = CPU
    runner.cache_config = vc.cache_config
    runner.model_config = vc.model_config
    runner.compilation_config = vc.compilation_config
    runner.speculative_config = None
    runner.attn_groups = []
    runner.kv_caches = []
    runner.shared_kv_cache_layers = dict(case.shared)  # filled by V1 get_kv_cache_spec()
    return runner


Result = tuple[dict[str, torch.Tensor], Any]
"""The KV caches and the object that owns them (keep it alive while using the tensors)."""


def via_allocate(case: ModelCase) -> Result:
    """``vllm.v1.worker.utils.allocate_kv_cache`` on the runner-side config, called directly
    (no runner): kvplan derives the sharing map from the current config's layers."""
    import vllm.v1.worker.utils as utils
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(case.vllm_config):  # where kvplan finds the sharers
        kv = utils.allocate_kv_cache(
            case.runner_config(), CPU, case.layout, list(case.kernel_block_sizes)
        )
    return kv, None


def via_v1(case: ModelCase, runner: Any = None, config: Any = None) -> Result:
    """The V1 runner's ``initialize_kv_cache_tensors`` (allocate, alias loop, bind).

    The bound cache lives as long as the runner: keep the returned runner alive.
    """
    runner = runner if runner is not None else v1_runner(case)
    config = config if config is not None else case.runner_config()
    kv = runner.initialize_kv_cache_tensors(config, list(case.kernel_block_sizes))
    return dict(kv), runner


def via_v2(case: ModelCase) -> Result:
    """The V2 runner's ``init_kv_cache``, called by the name the V2 runner uses."""
    import inspect

    import vllm.v1.worker.gpu.model_runner as v2

    # vLLM 0.29's init_kv_cache first takes the runner's list it fills (runner_kv_caches).
    lead: list[Any] = []
    if "runner_kv_caches" in inspect.signature(v2.init_kv_cache).parameters:
        lead.append([])
    kv = v2.init_kv_cache(
        *lead,
        case.forward_context,
        case.runner_config(),
        CPU,
        list(case.kernel_block_sizes),
        case.vllm_config,
    )
    return dict(kv), None


PATHS: dict[str, Callable[[ModelCase], Result]] = {
    "allocate_kv_cache": via_allocate,
    "v1": via_v1,
    "v2": via_v2,
}


def describe(kv: Mapping[str, torch.Tensor]) -> dict[str, tuple[Any, ...]]:
    """Per layer: dtype, shape, stride, byte offset in its storage, and which layer's
    tensor object it is (the first name, in key order, holding the same object)."""
    first: dict[int, str] = {}
    out: dict[str, tuple[Any, ...]] = {}
    for name, tensor in kv.items():
        owner = first.setdefault(id(tensor), name)
        offset = tensor.data_ptr() - tensor.untyped_storage().data_ptr()
        out[name] = (tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), offset, owner)
    return out


def storages(kv: Mapping[str, torch.Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in kv.values()}


def v1_full_runner(case: ModelCase, monkeypatch: Any) -> Any:
    """A V1 runner on which the real ``initialize_kv_cache`` runs end to end.

    Stand-ins replace only what needs a GPU or the attention backends: building attention
    groups and metadata builders, the input batch, JIT warm-up, and the kernel block
    sizes those groups would give (computed beforehand by vLLM's
    ``prepare_kernel_block_sizes`` over the real backends). The deep copy, the KV-sharing
    append, ``initialize_kv_cache_tensors``, allocation, aliasing and binding are vLLM's.
    """
    from contextlib import nullcontext
    from types import SimpleNamespace

    import vllm.v1.worker.gpu_model_runner as v1

    def no_op(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(
        v1, "prepare_kernel_block_sizes", lambda config, groups: list(case.kernel_block_sizes)
    )
    runner = v1_runner(case)
    runner.shared_kv_cache_layers = dict(case.shared)
    runner.runner_only_attn_layers = set()
    runner.kv_sharing_fast_prefill_eligible_layers = set()
    runner.initialize_attn_backend = no_op
    runner.initialize_metadata_builders = no_op
    runner.may_reinitialize_input_batch = no_op
    runner.jit_warmup_registry = SimpleNamespace(activate=nullcontext)
    return runner
