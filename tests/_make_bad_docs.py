"""Regenerate ``tests/data/bad/``: each file is named ``<code>-<what>.<ext>``.

Run: ``python -m tests._make_bad_docs`` from the repository root.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from harness import _builders as b

OUT = Path(__file__).resolve().parent / "data" / "bad"


def _base() -> dict[str, Any]:
    return b.llama(4)


def _mut(fn: Any, base: Any = None) -> dict[str, Any]:
    doc = copy.deepcopy(base if base is not None else _base())
    fn(doc)
    return doc


def cfg(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["kv_cache_config"]


def spec(doc: dict[str, Any], g: int = 0) -> dict[str, Any]:
    return cfg(doc)["kv_cache_groups"][g]["kv_cache_spec"]


def tensor(doc: dict[str, Any], t: int = 0) -> dict[str, Any]:
    return cfg(doc)["kv_cache_tensors"][t]


G4 = b.gemma4_e2b()
L13, L14, L15, L16, L19 = (b.name(i) for i in (13, 14, 15, 16, 19))

CASES: dict[str, Any] = {
    "KVP003-plan-given-as-input.json": {"format": "kvplan.plan/9", "kv_cache_config": {}},
    "KVP004-missing-num-blocks.json": _mut(lambda d: cfg(d).pop("num_blocks")),
    "KVP004-unknown-field.json": _mut(lambda d: cfg(d).update(num_blockz=3)),
    "KVP004-negative-block-size.json": _mut(lambda d: spec(d).update(block_size=-16)),
    "KVP004-spec-without-kind.json": _mut(lambda d: spec(d).pop("kind")),
    "KVP004-layers-not-a-list.json": _mut(lambda d: tensor(d).update(layers="model.layers.0")),
    "KVP004-bad-fraction.json": _mut(lambda d: spec(d).update(tokens_per_state="one/two")),
    "KVP005-unknown-spec-kind.json": _mut(lambda d: spec(d).update(kind="FancyAttentionSpec")),
    "KVP006-unknown-dtype.json": _mut(lambda d: spec(d).update(dtype="float7")),
    "KVP007-unknown-layout.json": _mut(lambda d: cfg(d).update(kv_cache_layout="LNBHC")),
    "KVP008-unknown-quant-mode.json": _mut(lambda d: spec(d).update(kv_quant_mode="FP3")),
    "KVP102-tensor-without-layers.json": _mut(
        lambda d: cfg(d)["kv_cache_tensors"].append(dict(tensor(d), layers=[]))
    ),
    "KVP103-tensor-sizes-differ.json": _mut(
        lambda d: (
            cfg(d)["kv_cache_tensors"].append(
                dict(tensor(d), size=tensor(d)["size"] * 2, layers=["extra.attn"])
            )
            or cfg(d)["kv_cache_groups"][0]["layer_names"].append("extra.attn")
        )
    ),
    "KVP104-layer-in-no-group.json": _mut(lambda d: tensor(d)["layers"].append("ghost.attn")),
    "KVP105-group-layer-unbound.json": _mut(
        lambda d: cfg(d)["kv_cache_groups"][0]["layer_names"].append("orphan.attn")
    ),
    "KVP106-layer-bound-twice.json": _mut(
        lambda d: cfg(d)["kv_cache_tensors"].append(dict(tensor(d), layers=[b.name(0)]))
    ),
    "KVP107-size-not-page-multiple.json": _mut(lambda d: tensor(d).update(size=8388608 + 100)),
    "KVP108-padded-page-too-small.json": _mut(lambda d: spec(d).update(page_size_padded=1024)),
    "KVP109-uniform-spec-missing-layer.json": _mut(
        lambda d: spec(d, 0)["kv_cache_specs"].pop(b.name(0)), b.gemma4_e2b("BLHNC")
    ),
    "KVP110-kernel-block-not-dividing.json": _mut(lambda d: d.update(kernel_block_sizes=[24])),
    "KVP111-kernel-split-block-outermost.json": _mut(
        lambda d: d.update(kernel_block_sizes=[8, 8, 16]), b.gemma4_e2b("BLHNC")
    ),
    "KVP112-kernel-block-sizes-length.json": _mut(lambda d: d.update(kernel_block_sizes=[16, 16])),
    "KVP113-layer-in-two-groups.json": _mut(
        lambda d: cfg(d)["kv_cache_groups"][1]["layer_names"].append(b.name(0)), G4
    ),
    "KVP114-layout-missing.json": _mut(lambda d: cfg(d).pop("kv_cache_layout")),
    "KVP201-alias-target-missing.json": _mut(
        lambda d: d["shared_kv_cache_layers"].update({L15: "model.layers.99.self_attn.attn"}), G4
    ),
    "KVP202-alias-target-not-backed.json": _mut(
        lambda d: (
            cfg(d)["kv_cache_groups"].append(
                {
                    "layer_names": ["enc.attn"],
                    "kv_cache_spec": dict(spec(d, 4), kind="EncoderOnlyAttentionSpec"),
                }
            )
            or d["shared_kv_cache_layers"].update({L15: "enc.attn"})
        ),
        G4,
    ),
    "KVP203-alias-chain.json": _mut(lambda d: d["shared_kv_cache_layers"].update({L16: L15}), G4),
    "KVP204-alias-cycle.json": _mut(
        lambda d: d["shared_kv_cache_layers"].update({L15: L16, L16: L15}), G4
    ),
    "KVP205-self-alias.json": _mut(lambda d: d["shared_kv_cache_layers"].update({L15: L15}), G4),
    "KVP206-alias-kind-mismatch.json": _mut(
        lambda d: cfg(d)["kv_cache_groups"][4]["layer_names"].append(L15), G4
    ),
    "KVP207-alias-also-bound.json": _mut(
        lambda d: d["shared_kv_cache_layers"].update({b.name(0): b.name(1)})
    ),
    "KVP301-view-out-of-bounds.json": _mut(lambda d: tensor(d).update(offset=4096)),
    "KVP302-views-overlap.json": _mut(lambda d: tensor(d).update(layer_stride=4096)),
    "KVP303-block-stride-misaligned.json": _mut(
        lambda d: spec(d).update(block_stride_alignment=3000)
    ),
    "KVP310-block-stride-half-page.json": _mut(
        lambda d: tensor(d).update(block_stride=tensor(d)["block_stride"] // 2)
    ),
}


def _reading_cases() -> dict[str, bytes]:
    """Documents refused while reading (limits, duplicates, encodings): raw bytes."""
    good = json.dumps(_base(), indent=1)
    deep = "[" * 100 + "]" * 100
    bomb = ["format: kvplan.input/1", "metadata:", "  a0: &a0 [" + ", ".join("x" * 9) + "]"]
    bomb += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return {
        "KVP009-nesting-too-deep.json": good[:-2].encode()
        + b', "metadata": {"d": '
        + deep.encode()
        + b"}}\n",
        "KVP009-nesting-too-deep.yaml": b"format: kvplan.input/1\nmetadata: "
        + deep.encode()
        + b"\n",
        "KVP010-integer-over-64-bits.json": good.replace(
            '"num_blocks": 64', '"num_blocks": 1' + "0" * 30
        ).encode(),
        "KVP010-integer-over-4300-digits.yaml": b"format: kvplan.input/1\nkv_cache_config:\n"
        b"  num_blocks: 1" + b"0" * 4300 + b"\n",
        "KVP011-duplicate-key.json": good.replace(
            '"num_blocks": 64', '"num_blocks": 64, "num_blocks": 65'
        ).encode(),
        "KVP011-duplicate-key.yaml": b"format: kvplan.input/1\nformat: kvplan.input/1\n",
        "KVP012-alias-refers-to-itself.yaml": b"format: kvplan.input/1\nmetadata: &m {self: *m}\n",
        "KVP012-alias-bomb.yaml": ("\n".join(bomb) + "\n").encode(),
        "KVP013-not-utf8.json": good.replace("0.33.0", "0.33.0\udce9").encode(
            "utf-8", "surrogateescape"
        ),
        "KVP013-nul-byte.yaml": b"format: kvplan.input/1\nvllm_version: 0.33\x00\n",
        "KVP015-empty.json": b"",
        "KVP015-only-a-comment.yaml": b"# nothing here\n",
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    for name, doc in CASES.items():
        (OUT / name).write_text(json.dumps(doc, indent=1) + "\n")
    (OUT / "KVP001-malformed.json").write_text(
        '{"format": "kvplan.input/1", "kv_cache_config": {\n'
    )
    (OUT / "KVP001-malformed.yaml").write_text("format: kvplan.input/1\nkv_cache_config: [a, b\n")
    for name, data in _reading_cases().items():
        (OUT / name).write_bytes(data)
    (OUT / "KVP005-unknown-spec-kind.yaml").write_text(
        "kv_cache_config:\n  num_blocks: 4\n  kv_cache_layout: LBNHC\n  kv_cache_tensors: []\n"
        "  kv_cache_groups:\n  - layer_names: [a]\n"
        "    kv_cache_spec: {kind: Bogus, block_size: 16}\n"
    )


if __name__ == "__main__":
    main()
