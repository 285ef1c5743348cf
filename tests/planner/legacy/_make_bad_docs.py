"""Write ``tests/data/bad/KVP6xx-*.json``: one legacy-document defect each.

Run ``python -m tests.planner.legacy._make_bad_docs`` from the repository root after the legacy
fixtures change. Each document has exactly one problem, so its code is the first line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
LEGACY = ROOT / "tests" / "data" / "legacy"
BAD = ROOT / "tests" / "data" / "bad"


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((LEGACY / f"{name}.json").read_text())
    data["metadata"] = {"model": data["metadata"]["model"]}
    return data


def tiny(**binding: Any) -> dict[str, Any]:
    """A 2-layer FlashAttention model: 2 tensors of 8 blocks x 4096 B."""
    layers = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    return {
        "format": "kvplan.input-legacy/1",
        "vllm_version": "0.24.0",
        "kv_cache_config": {
            "num_blocks": 8,
            "kv_cache_tensors": [{"size": 32768, "shared_by": [n]} for n in layers],
            "kv_cache_groups": [
                {
                    "layer_names": layers,
                    "kv_cache_spec": {
                        "kind": "FullAttentionSpec",
                        "block_size": 16,
                        "num_kv_heads": 2,
                        "head_size": 32,
                        "dtype": "bfloat16",
                    },
                }
            ],
        },
        "attn_groups": [
            {
                "kv_cache_group_id": 0,
                "backend": "FlashAttentionBackend",
                "layer_names": layers,
                "kv_cache_shape": [8, 2, 16, 2, 32],
                "stride_order": [0, 1, 2, 3, 4],
                "block_dim": 0,
            }
        ],
        "kernel_block_sizes": [16],
        "binding": binding,
    }


def bad_documents() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    # kvcached #417: sharers appended to the groups, but the binder knows no runner-only set
    doc = fixture("gemma-4-e2b")
    doc["runner_only_attn_layers"] = []
    doc["shared_kv_cache_layers"] = {}
    docs["KVP601-sharers-in-no-tensor"] = doc
    # kvcached #472: one side counted the 16 appended sharers of group 3 (3 + 16 = 19 pools)
    doc = fixture("gemma-4-e2b")
    doc["scheduler_num_layers"] = 19
    docs["KVP602-scheduler-pool-count"] = doc
    # the same under the per-layer binding: 15 tensor-backed layers + the 20 appended sharers
    doc = fixture("gemma-4-e2b")
    doc["scheduler_num_layers"] = 35
    doc["binding"] = {"strategy": "kvcached", "pool_layout": "per-layer"}
    docs["KVP602-per-layer-inflated-pools"] = doc
    # heterogeneous Gemma groups, 16-token kernels in 32-token blocks, contiguous layout
    doc = fixture("gemma-4-e2b")
    doc["kernel_block_sizes"] = [16, 16, 16, 16, 16]
    for group in doc["attn_groups"]:
        if group["kv_cache_shape"][2] == 32:
            group["kv_cache_shape"] = [2 * doc["kv_cache_config"]["num_blocks"], 2, 16, 1, 256]
    doc["binding"] = {"strategy": "kvcached", "pool_layout": "contiguous"}
    docs["KVP603-contiguous-kernel-split"] = doc
    doc = tiny()
    spec = doc["kv_cache_config"]["kv_cache_groups"][0]["kv_cache_spec"]
    spec.update(kind="TQFullAttentionSpec", tq_slot_size=0)
    docs["KVP604-turboquant-spec"] = doc
    doc = fixture("gemma-4-e2b-nohma")
    doc["binding"] = {"strategy": "kvcached"}
    docs["KVP605-kvcached-uniform-type-group"] = doc
    doc = tiny()
    doc["attn_groups"][0]["kv_cache_shape"] = [8, 2, 16, 4, 32]
    docs["KVP606-backend-shape-mismatch"] = doc
    # 3 MiB per pool: 1.5 MiB per K/V half rounds down to 0 whole 2 MiB pages
    docs["KVP607-virtual-capacity-too-small"] = tiny(
        strategy="kvcached", virtual_capacity_bytes=3 << 20
    )
    return docs


def main() -> None:
    for name, doc in bad_documents().items():
        (BAD / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
