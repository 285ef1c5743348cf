"""The floor of an elastic engine: the smallest memory limit it accepts.

vLLM's null block stays backed, and one request of ``max_model_len`` tokens must fit, or it
would wait forever: in every KV cache group (each takes its own block ids from the one pool)
the blocks vLLM's own ``max_memory_usage_bytes`` admits for it
(:func:`kvplan.integrations.vllm.convert.request_blocks` reads them from vLLM's objects), at
the pool's mean bytes per block id. The engine (``KVP533``), ``kvplan doctor --model`` and a
group's default guarantee all use this one function.
"""

from __future__ import annotations

from kvplan.elastic.ledger import Ledger


def floor_bytes(ledger: Ledger, request_blocks: int) -> int:
    """What ``ledger`` has mapped (the null block, backed first) plus one longest request of
    ``request_blocks`` block ids (at most every block but the null block)."""
    if not ledger.num_blocks:
        return ledger.mapped_bytes
    blocks = min(max(0, request_blocks), ledger.num_blocks - 1)
    return ledger.mapped_bytes + blocks * -(-ledger.reserved_bytes // ledger.num_blocks)
