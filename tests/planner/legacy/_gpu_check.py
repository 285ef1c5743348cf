"""GPU check of the legacy plans (not collected by pytest): every fixture x strategy on cuda-vmm.

Run from the repository root on a machine with an NVIDIA GPU, torch (CUDA), cuda-python and
pydantic/PyYAML (kvplan need not be installed)::

    PYTHONUNBUFFERED=1 python3 tests/planner/legacy/_gpu_check.py \
        [--backend cuda-vmm --device cuda:0]

For each plan: apply on ``--backend`` and on the ``torch`` backend (same device), ``verify``
both, check alias identity, write the same pattern through every view of both bindings (one
value per layer and block, in plan order), and compare the pools byte for byte; then check
that a sharer reads its target's writes and that Gemma's sliding and full views address the
same block bytes. Writes ``$OUT/legacy_gpu_check.json``; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


def _pattern(cache: Any, plan: Any) -> None:
    """Write value ``(layer_index * 7 + block) % 100 + 1`` into blocks 0, 1 and the last."""
    for li, view in enumerate(plan.views):
        t = cache.tensors[view.layer]
        blocks = t.shape[0]
        for b in {0, 1, blocks - 1}:
            t[b] = float((li * 7 + b) % 100 + 1)


def check_plan(name: str, plan: Any, backend: str, device: str) -> dict[str, Any]:
    import torch

    from kvplan.executor import apply, verify

    out: dict[str, Any] = {"pools": len(plan.pools), "views": len(plan.views)}
    t0 = time.perf_counter()
    with (
        apply(plan, backend=backend, device=device) as cache,
        apply(plan, backend="torch", device=device) as ref,
    ):
        out["apply_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        problems = verify(plan, cache.tensors, pools=cache.pools)
        problems += verify(plan, ref.tensors, pools=ref.pools)
        assert not problems, [p.render() for p in problems][:3]
        for alias in plan.aliases:
            assert cache.tensors[alias.layer] is cache.tensors[alias.target]
        _pattern(cache, plan)
        _pattern(ref, plan)
        torch.cuda.synchronize() if device.startswith("cuda") else None
        for pool in plan.pools:
            same = torch.equal(cache.pools[pool.name].cpu(), ref.pools[pool.name].cpu())
            assert same, f"pool {pool.name} differs from the torch backend"
        if plan.aliases:
            alias = plan.aliases[0]
            cache.tensors[alias.target][1].fill_(42.0)
            assert bool(torch.all(cache.tensors[alias.layer][1] == 42.0))
        out["bytes_compared"] = sum(p.size_bytes for p in plan.pools)
    return out


def check_gemma_blocks(backend: str, device: str) -> dict[str, Any]:
    """kvcached contiguous Gemma: sliding and full views of one pool share block bytes."""
    import torch

    from kvplan.executor import apply
    from kvplan.planner.legacy import plan_legacy
    from tests.planner.legacy._helpers import load

    plan = plan_legacy(load("gemma-4-e2b"), strategy="kvcached", pool_layout="contiguous")
    name = "language_model.model.layers.{}.self_attn.attn".format
    with apply(plan, backend=backend, device=device) as cache:
        sliding, full = cache.tensors[name(5)], cache.tensors[name(9)]
        sliding.zero_()
        full[17].fill_(7.0)
        assert bool(torch.all(sliding[17] == 7.0)) and bool(torch.all(sliding[16] == 0))
        assert bool(torch.all(cache.tensors[name(0)][17] == 0))  # pool 0 untouched
    return {"ok": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuda-vmm")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args(argv)
    from kvplan.planner.legacy import build_legacy_plan
    from tests.planner.legacy._helpers import FIXTURES, STRATEGIES, load

    report: dict[str, Any] = {"backend": args.backend, "device": args.device, "plans": {}}
    failed = 0
    for name in FIXTURES:
        for strategy, layout in STRATEGIES:
            plan, _ = build_legacy_plan(load(name), strategy=strategy, pool_layout=layout)  # type: ignore[arg-type]
            if plan is None:
                continue
            key = f"{name}/{plan.source.layout}"
            try:
                report["plans"][key] = check_plan(key, plan, args.backend, args.device)
            except Exception:
                failed += 1
                report["plans"][key] = {"error": traceback.format_exc(limit=3)}
            print(key, report["plans"][key], flush=True)
    try:
        report["gemma_blocks"] = check_gemma_blocks(args.backend, args.device)
    except Exception:
        failed += 1
        report["gemma_blocks"] = {"error": traceback.format_exc(limit=3)}
    report["failed"] = failed
    out = Path(os.environ.get("OUT") or ".")
    (out / "legacy_gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{len(report['plans'])} plans, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
