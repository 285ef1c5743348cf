"""Elastic serving: physical KV memory that follows the blocks vLLM uses (no torch, no vLLM).

``ledger``: which chunks back which blocks, the byte budget and what to give back (the
scheduler side decides with it). ``files``: the per-rank stats files and the limit file that
``kvplan top`` and ``kvplan limit`` read and write. See ``docs/elastic.md``.
"""
