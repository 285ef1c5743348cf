"""Elastic serving: physical KV memory that follows the blocks vLLM actually uses.

Submodules are imported on use (none of them imports torch or vLLM at import time):
:mod:`kvplan.elastic.files` holds the per-rank stats files and the limit file that
``kvplan top`` and ``kvplan limit`` read and write.
"""
