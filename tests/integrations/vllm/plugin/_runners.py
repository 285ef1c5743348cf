"""Call vLLM's real KV-cache code the way its runners do, with stand-ins for GPU-only state.

Only the runner object is a stand-in (``object.__new__`` plus the attributes the method
reads); ``allocate_kv_cache``, the runners' methods, the alias loops, ``bind_kv_cache`` and
the layers' ``bind_kv_cache`` are vLLM's own. Every call goes through the module global or
class attribute vLLM itself uses, so it runs kvplan's wrapper exactly when vLLM would.

Which runners there are depends on the installed release, and is read from it: the V1 runner
(``vllm.v1.worker.gpu_model_runner``) up to 0.33; the V2 runner everywhere; from 0.34 the CPU
build's ``init_kv_cache`` (``vllm.v1.worker.cpu.attn_utils``) and the standalone CPU runner
that calls it. :data:`PATHS` and :data:`FULL_RUNNERS` hold the installed release's only.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

import torch

from tests.integrations.vllm.plugin._models import ModelCase

CPU = torch.device("cpu")


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


HAS_V1 = _has("vllm.v1.worker.gpu_model_runner")
"""The V1 runner: vLLM up to 0.33."""
HAS_CPU_RUNNER = _has("vllm.v1.worker.cpu.attn_utils")
"""The CPU build's ``init_kv_cache`` and ``StandaloneCPUModelRunner``: vLLM 0.34 on."""


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


def via_v2(case: ModelCase, config: Any = None, **keywords: Any) -> Result:
    """The V2 runner's ``init_kv_cache``, called by the name the V2 runner uses (``keywords``:
    its keyword-only arguments, e.g. 0.34's ``allocate``)."""
    import inspect

    import vllm.v1.worker.gpu.model_runner as v2

    # vLLM 0.29's init_kv_cache first takes the runner's list it fills (runner_kv_caches).
    lead: list[Any] = []
    if "runner_kv_caches" in inspect.signature(v2.init_kv_cache).parameters:
        lead.append([])
    kv = v2.init_kv_cache(
        *lead,
        case.forward_context,
        config if config is not None else case.runner_config(),
        CPU,
        list(case.kernel_block_sizes),
        case.vllm_config,
        **keywords,
    )
    return dict(kv), None


def via_cpu(case: ModelCase, config: Any = None) -> Result:
    """The CPU build's ``init_kv_cache`` (vLLM 0.34 on: allocate, alias loop, bind), called
    by the name the standalone CPU runner uses."""
    import vllm.v1.worker.cpu.standalone_model_runner as cpu

    kv = cpu.init_kv_cache(
        case.forward_context,
        config if config is not None else case.runner_config(),
        CPU,
        list(case.kernel_block_sizes),
        case.vllm_config,
    )
    return dict(kv), None


def import_runners() -> None:
    """Import every runner module of the installed release, so that a test that replaces a
    function in the module it is defined in does not leave its stand-in in a runner module
    imported meanwhile (a runner imports its functions by name)."""
    import importlib

    for module in ("vllm.v1.worker.gpu.model_runner", *RUNNER_MODULES):
        importlib.import_module(module)


RUNNER_MODULES = (
    *(["vllm.v1.worker.gpu_model_runner"] if HAS_V1 else []),
    *(["vllm.v1.worker.cpu.standalone_model_runner"] if HAS_CPU_RUNNER else []),
)
RUNNER_PATHS: dict[str, Callable[..., Result]] = {
    **({"v1": via_v1} if HAS_V1 else {}),
    "v2": via_v2,
    **({"cpu": via_cpu} if HAS_CPU_RUNNER else {}),
}
"""The installed release's runner calls by name: each allocates, aliases the KV-sharing
layers and binds the layers (``config=``: another runner-side config than the case's)."""
PATHS: dict[str, Callable[[ModelCase], Result]] = {
    "allocate_kv_cache": via_allocate,
    **RUNNER_PATHS,
}
ALLOCATING_MODULE = {
    "v1": "vllm.v1.worker.gpu_model_runner",
    "v2": "vllm.v1.worker.gpu.attn_utils",
    "cpu": "vllm.v1.worker.cpu.attn_utils",
}
"""The module whose ``allocate_kv_cache`` global each runner path calls."""


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


def full_runner(kind: str, case: ModelCase, monkeypatch: Any) -> Any:
    """A runner of :data:`FULL_RUNNERS` (``v1``, ``cpu``) whose real ``initialize_kv_cache``
    runs end to end; its caches are ``runner.kv_caches``."""
    return FULL_RUNNERS[kind](case, monkeypatch)


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


def cpu_full_runner(case: ModelCase, monkeypatch: Any) -> Any:
    """A ``StandaloneCPUModelRunner`` (vLLM 0.34 on) on which the real ``initialize_kv_cache``
    runs end to end.

    Stand-ins replace only what builds attention backends, block tables and model state:
    ``init_attn_backend`` runs vLLM's own KV-sharing append
    (``add_kv_sharing_layers_to_kv_cache_groups`` over the CPU build's
    ``get_shared_kv_cache_layers``) and returns no attention groups and the kernel block
    sizes those groups would give (computed beforehand by vLLM's
    ``prepare_kernel_block_sizes`` over the real backends). The deep copy, ``init_kv_cache``,
    allocation, aliasing and binding are vLLM's.
    """
    from contextlib import nullcontext
    from types import SimpleNamespace

    import vllm.v1.worker.cpu.attn_utils as cpu_utils
    import vllm.v1.worker.cpu.standalone_model_runner as cpu
    from vllm.v1.worker.utils import add_kv_sharing_layers_to_kv_cache_groups

    def init_attn_backend(config: Any, vllm_config: Any, device: Any) -> Any:
        shared = cpu_utils.get_shared_kv_cache_layers(vllm_config)
        add_kv_sharing_layers_to_kv_cache_groups(shared, config.kv_cache_groups)
        return [[] for _ in config.kv_cache_groups], list(case.kernel_block_sizes)

    def no_op(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(cpu, "init_attn_backend", init_attn_backend)
    monkeypatch.setattr(cpu, "CPUBlockTables", lambda **kwargs: SimpleNamespace(**kwargs))
    monkeypatch.setattr(cpu, "initialize_mamba_ssu_backend", no_op)
    monkeypatch.setattr(cpu, "get_kv_connector", no_op)
    vc = case.vllm_config
    runner = object.__new__(cpu.StandaloneCPUModelRunner)
    runner.vllm_config = vc
    runner.device = CPU
    runner.cache_config = vc.cache_config
    runner.model_config = vc.model_config
    runner.scheduler_config = vc.scheduler_config
    runner.compilation_config = vc.compilation_config
    runner.max_model_len = vc.model_config.max_model_len
    runner.is_encoder_decoder = False
    runner.max_num_reqs = vc.scheduler_config.max_num_seqs
    runner.max_num_tokens = vc.scheduler_config.max_num_batched_tokens
    runner.kv_caches = []
    runner.jit_warmup_registry = SimpleNamespace(activate=nullcontext)
    runner.model_state = SimpleNamespace(initialize_kv_cache=no_op)
    return runner


FULL_RUNNERS: dict[str, Callable[[ModelCase, Any], Any]] = {
    **({"v1": v1_full_runner} if HAS_V1 else {}),
    **({"cpu": cpu_full_runner} if HAS_CPU_RUNNER else {}),
}
"""The installed release's runners whose whole ``initialize_kv_cache`` the tests drive."""
FULL_RUNNER_CALLS = {
    "v1": (
        ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_kv_cache_tensors"),
        ("vllm.v1.worker.gpu_model_runner", "allocate_kv_cache"),
    ),
    "cpu": (
        ("vllm.v1.worker.cpu.standalone_model_runner", "init_kv_cache"),
        ("vllm.v1.worker.cpu.attn_utils", "allocate_kv_cache"),
    ),
}
"""Per full runner, the wrapped (module, qualname) its ``initialize_kv_cache`` calls, then the
``allocate_kv_cache`` global that call allocates with."""
