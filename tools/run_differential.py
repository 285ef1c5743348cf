"""Run kvplan's differential suite against another vLLM release, from its wheel.

``tests/integrations/vllm/capture/test_differential.py`` compares kvplan's plans with what
vLLM's real ``allocate_kv_cache`` binds on the CPU. This runs it with another release's vLLM::

    python tools/run_differential.py --wheels DIR --envs DIR 0.31 [0.30 ...]
        [--select EXPR] [--maxfail N] [--timeout S] [--results FILE.json]

For each release the wheel's pure-Python ``vllm/`` package (no compiled ``.so``: vLLM's CUDA
kernels are not needed for CPU planning with ``VLLM_TARGET_DEVICE=cpu``) is unpacked once into
``<envs>/versions-<minor>/site`` and put first on ``PYTHONPATH``, over the running Python's own
environment (kvplan's, with vLLM 0.33 and its dependencies). The release's own dependency pins
are not installed: a failure can also come from that. The summary (passed/failed counts and
the first error of a failing test) is merged into the results JSON that
``tools/vllm_versions.py`` puts in ``docs/versions.md`` (through :func:`cell`).

Use the Python of kvplan's test environment; it must be the one ``pytest`` is installed in.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = "tests/integrations/vllm/capture/test_differential.py"


def wheel_for(wheels: Path, minor: str) -> Path:
    found = sorted(wheels.glob(f"vllm-{minor}.*.whl"))
    if not found:
        raise SystemExit(f"no vllm-{minor}.*.whl in {wheels}")
    return found[-1]


PLANNING_SHIM = '''"""Written by tools/run_differential.py: this release has no kv_cache_planning.

kvplan's differential harness calls 0.33's engine-core planning names; before 0.33 the same
steps live in ``kv_cache_utils``: ``get_kv_cache_configs(vllm_config, specs, memory)`` groups
the merged specs itself (``get_kv_cache_groups``). These wrap the release's own functions.
"""

from vllm.v1.core import kv_cache_utils as _utils


def get_global_kv_cache_groups(vllm_config, kv_cache_specs):
    merged = {}
    for specs in kv_cache_specs:
        for name, spec in specs.items():
            merged.setdefault(name, spec)
    return _utils.get_kv_cache_groups(vllm_config, merged)


def get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory, global_groups=None):
    return _utils.get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory)
'''
"""Stands in for 0.33's ``vllm.v1.core.kv_cache_planning`` in releases without it."""


def unpack(wheel: Path, site: Path) -> tuple[float, list[str]]:
    """Unpack ``vllm/`` without compiled modules into ``site``; (seconds, shims written)."""
    marker = site / f".unpacked-{wheel.name}"
    shims: list[str] = []
    planning = site / "vllm" / "v1" / "core" / "kv_cache_planning.py"
    if marker.exists():
        return 0.0, [planning.name] if (site / ".planning-shim").exists() else []
    start = time.monotonic()
    site.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("vllm/") and not re.search(r"\.so(\.|$)", name):
                archive.extract(name, site)
    if not planning.exists():
        planning.write_text(PLANNING_SHIM)
        (site / ".planning-shim").touch()
        shims.append(planning.name)
    marker.touch()
    return time.monotonic() - start, shims


def summarise(output: str) -> tuple[str, str]:
    """(``N passed, M failed...`` line, first error line of a failure) from pytest's output."""
    counts = ""
    for line in reversed(output.splitlines()):
        if re.search(r"\d+ (passed|failed|error)", line):
            counts = line.strip("= ").strip()
            break
    first = next((line[2:].strip() for line in output.splitlines() if line.startswith("E ")), "")
    return counts or "no pytest summary", first


def run(minor: str, args: argparse.Namespace) -> dict[str, str]:
    wheel = wheel_for(args.wheels, minor)
    site = args.envs / f"versions-{minor}" / "site"
    unpacked, shims = unpack(wheel, site)
    env = dict(os.environ)
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "src"), str(ROOT)]),
    )
    cmd = [sys.executable, "-m", "pytest", SUITE, "-q", "-p", "no:cacheprovider", "-rf"]
    if args.maxfail:
        cmd.append(f"--maxfail={args.maxfail}")
    if args.select:
        cmd += ["-k", args.select]
    start = time.monotonic()
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout
        )
        output, code = done.stdout + done.stderr, str(done.returncode)
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        code = f"timeout after {args.timeout} s"
    took = time.monotonic() - start
    counts, first = summarise(output)
    first = first.replace(str(site), "<site>").replace(str(ROOT), "<repo>")
    log = args.envs / f"versions-{minor}" / "differential.log"
    log.write_text(output)
    result = {
        "wheel": wheel.name,
        "exit": code,
        "summary": counts,
        "first_error": first,
        "seconds": f"{took:.0f}",
        "unpack_seconds": f"{unpacked:.1f}",
        "maxfail": str(args.maxfail or ""),
        "shims": ", ".join(shims),
        "select": args.select or "",
    }
    print(f"{minor}: {counts} ({took:.0f} s){' — ' + first if first else ''}")
    return result


KNOWN = (
    (
        r"'_C' object has no attribute",
        "the PyPI wheel is vLLM's CUDA build: its model layers need compiled ops that only "
        "the CPU build registers, so a model cannot be built on the CPU from it",
    ),
    (
        r"cannot import name '\w+' from 'vllm\.v1\.core",
        "kvplan's harness (`_build.plan_kv_cache`) names 0.33's engine-core planning steps "
        "and this release lacks one",
    ),
    (
        r"KVP50\d",
        "kvplan refuses this release (no version adapter)",
    ),
)
"""First-error signatures and what they mean."""


def cell(result: dict[str, str]) -> str:
    """The ``differential`` cell of docs/versions.md for one release."""
    text = result["summary"]
    if result.get("select"):
        text += f" of `-k {result['select']}`"
    if result.get("shims"):
        text += f" (harness shim: {result['shims']})"
    if result.get("maxfail"):
        text += f" (stopped after {result['maxfail']} failures)"
    first = result.get("first_error", "")
    if first:
        text += f"; first error: `{first[:110]}`"
        text += "".join(f" — {why}" for pattern, why in KNOWN if re.search(pattern, first))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("releases", nargs="+", help="major.minor, e.g. 0.31")
    parser.add_argument("--wheels", type=Path, required=True, help="directory of vllm-*.whl")
    parser.add_argument("--envs", type=Path, required=True, help="where per-release sites go")
    parser.add_argument("--maxfail", type=int, default=0, help="stop each run after N failures")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per release")
    parser.add_argument("--select", help="pytest -k expression (a subset of the suite)")
    parser.add_argument(
        "--results", type=Path, default=ROOT / "docs" / "versions-differential.json"
    )
    args = parser.parse_args(argv)
    results: dict[str, dict[str, str]] = {}
    if args.results.exists():
        results = json.loads(args.results.read_text())
    for minor in args.releases:
        results[minor] = run(minor, args)
    args.results.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
