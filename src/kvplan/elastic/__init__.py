"""Elastic serving: physical KV memory that follows the blocks vLLM uses (no torch, no vLLM).

``files``: the per-rank stats files and the limit file that ``kvplan top`` and
``kvplan limit`` read and write. See ``docs/elastic.md``.
"""
