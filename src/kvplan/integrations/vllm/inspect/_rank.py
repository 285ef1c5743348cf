"""One tensor-parallel rank of
:func:`~kvplan.integrations.vllm.inspect._build.collect_worker_specs`.

``python -m kvplan.integrations.vllm.inspect._rank DIR RANK`` reads ``DIR/request.pkl`` and writes
the rank's :class:`~kvplan.integrations.vllm.inspect._build.WorkerSpecs` to ``DIR/rank<RANK>.pkl``.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    from kvplan.integrations.vllm.inspect._build import _rank_main

    folder, rank = Path(argv[0]), int(argv[1])
    options, init_method = pickle.loads((folder / "request.pkl").read_bytes())
    result = _rank_main(options, rank, init_method)
    (folder / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
