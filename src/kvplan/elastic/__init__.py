"""Elastic serving: physical KV memory that follows the blocks vLLM uses (no torch, no vLLM).

``ledger``: which chunks back which blocks, the byte budget and what to give back (the
scheduler side decides with it). ``admission``: the incremental index that counts and picks the
free blocks fitting a headroom without walking vLLM's free queue. ``files``: the per-rank stats
files and the limit file that ``kvplan top`` and ``kvplan limit`` read and write. ``grants``
and ``group``: one physical budget shared by a group of engines (the policy; the directory,
ledger, lock and leases). See ``docs/elastic.md``.
"""
