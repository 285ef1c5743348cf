"""Real weights for the engine test models: a safetensors checkpoint of re-drawn parameters.

The driver re-draws vLLM's dummy weights inside its own process (``driver.install_redraw``).
Engines whose model runs in other processes -- vLLM's OpenAI server, the multiprocess executor
(vLLM's default, and tensor parallelism) -- cannot be reached that way: the CPU platform starts
its workers with ``spawn``. They load a real checkpoint instead (``load_format="safetensors"``),
written here once per model folder: the Hugging Face model built from the folder's
``config.json`` (transformers, in the engine venv), every parameter re-drawn from a fixed seed
at the driver's scale (matrices N(0, gain²/fan_in), vectors 1 + N(0, 0.1²), in name order), and
saved as ``model.safetensors``. Every engine that loads the folder, at any tensor-parallel size,
gets the same weights.

``write_weights(python, folder)`` runs this file by path in the engine venv; the file itself
imports only torch, transformers and safetensors (the engine venv's), like ``driver.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WEIGHTS_FILE = "model.safetensors"
SEED = 1234
GAIN = 2.0


def write_weights(python: Path, folder: Path, *, seed: int = SEED, gain: float = GAIN) -> Path:
    """Write ``folder/model.safetensors`` (re-drawn weights for ``folder/config.json``) with
    the engine venv's ``python``; return ``folder``. Raises with the script's output tail."""
    done = subprocess.run(
        [str(python), str(Path(__file__).resolve()), str(folder), str(seed), str(gain)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not (folder / WEIGHTS_FILE).is_file():
        tail = "\n".join(((done.stdout or "") + (done.stderr or "")).splitlines()[-30:])
        raise AssertionError(f"writing {folder / WEIGHTS_FILE} failed ({done.returncode}):\n{tail}")
    return folder


def _main(folder: Path, seed: int, gain: float) -> int:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    tensors = {}
    for name, param in sorted(model.state_dict().items()):
        shape = tuple(param.shape)
        if param.ndim >= 2:
            values = gain * torch.randn(shape, generator=gen) / max(shape[-1], 1) ** 0.5
        else:
            values = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        tensors[name] = values.to(torch.float32).contiguous()
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    print(json.dumps({"tensors": len(tensors), "file": str(folder / WEIGHTS_FILE)}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
